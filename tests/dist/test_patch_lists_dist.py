"""torch.distributed's list-form, rooted, object and barrier collectives under a policy that compresses
every op at ``min_bytes: 0``, on real gloo ranks: each is exact (bit-identical to the unpatched call, or
the same error torch raises) and counted once in ``ccoll.stats()`` as native; and the paths where two
ranks could decide differently (all_to_all_single splits spelled differently per rank, P2POp without a
peer, sparse / complex / quantized / integer tensors) agree or stay exact."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch import run_gloo  # noqa: E402

NUMEL = 512
INT8_ALL = {"version": 1, "default": {"codec": "int8:block=64", "min_bytes": 0}}
LOSSLESS_ALL = {"version": 1, "default": {"codec": "lossless", "min_bytes": 0}}


def _attempt(fn):
    """What a call gave: its value, or the error torch raised (type and message), so an unsupported call
    under the patch must fail as it does without."""
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - compared with the unpatched run's error
        return ("error", type(e).__name__, str(e).split("\n")[0])


def _lists(rank: int, world: int) -> dict:
    """Every list-form / rooted / object / barrier call once (twice for all_gather: sync and async)."""
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(5 + rank)
    x = torch.randn(NUMEL, generator=g)
    out = {}

    def all_gather(async_op):
        lst = [torch.empty(NUMEL) for _ in range(world)]
        h = dist.all_gather(lst, x, async_op=async_op)
        if async_op:
            h.wait()
        return torch.stack(lst)

    out["all_gather"] = _attempt(lambda: all_gather(False))
    out["all_gather_async"] = _attempt(lambda: all_gather(True))

    def coalesced():
        outs = [[torch.empty(NUMEL), torch.empty(8)] for _ in range(world)]  # per rank: one per input
        dist.all_gather_coalesced(outs, [x, x[:8].clone()])
        return [torch.cat(o) for o in outs]

    out["all_gather_coalesced"] = _attempt(coalesced)

    def reduce_scatter():
        y = torch.empty(NUMEL)
        dist.reduce_scatter(y, [x * (i + 1) for i in range(world)])
        return y

    out["reduce_scatter"] = _attempt(reduce_scatter)

    def all_to_all():
        outs = [torch.empty(NUMEL // world) for _ in range(world)]
        dist.all_to_all(outs, list(x.chunk(world)))
        return torch.cat(outs)

    out["all_to_all"] = _attempt(all_to_all)

    def coalesced_reduce():
        ts = [x.clone(), x[:10].clone()]
        dist.all_reduce_coalesced(ts)
        return ts

    out["all_reduce_coalesced"] = _attempt(coalesced_reduce)

    def reduce():
        r = x.clone()
        dist.reduce(r, 0)
        return r if rank == 0 else None  # torch leaves the non-roots' buffers unspecified

    out["reduce"] = _attempt(reduce)

    def gather():
        gl = [torch.empty(NUMEL) for _ in range(world)] if rank == 0 else None
        dist.gather(x, gl, dst=0)
        return None if gl is None else torch.stack(gl)

    out["gather"] = _attempt(gather)

    def scatter():
        t = torch.empty(NUMEL)
        dist.scatter(t, [x * (i + 1) for i in range(world)] if rank == 0 else None, src=0)
        return t

    out["scatter"] = _attempt(scatter)

    def all_gather_object():
        objs = [None] * world
        dist.all_gather_object(objs, {"rank": rank, "x": x[:4]})
        return objs

    out["all_gather_object"] = _attempt(all_gather_object)

    def gather_object():
        objs = [None] * world if rank == 0 else None
        dist.gather_object(("r", rank, x[:3]), objs, dst=0)
        return objs

    out["gather_object"] = _attempt(gather_object)

    def broadcast_object_list():
        objs = [x[:5], "hello"] if rank == 0 else [None, None]
        dist.broadcast_object_list(objs, src=0)
        return objs

    out["broadcast_object_list"] = _attempt(broadcast_object_list)

    def scatter_object_list():
        got = [None]
        dist.scatter_object_list(got, [("to", i, x[:2]) for i in range(world)] if rank == 0 else None, src=0)
        return got

    out["scatter_object_list"] = _attempt(scatter_object_list)

    def object_p2p():
        if rank == 0:
            dist.send_object_list([x[:6], {"k": 1}], dst=1)
            return None
        objs = [None, None]
        dist.recv_object_list(objs, src=0)
        return objs

    out["object_p2p"] = _attempt(object_p2p)
    out["barrier"] = _attempt(lambda: dist.barrier())
    out["monitored_barrier"] = _attempt(lambda: dist.monitored_barrier())
    return out


#: (stats op, calls) each rank counts as native for one _lists() pass (2 ranks)
def _expected_native(rank: int) -> dict:
    return {"all_gather_list": 2, "all_gather_coalesced": 1, "reduce_scatter_list": 1, "all_to_all_list": 1,
            "all_reduce_coalesced": 1, "reduce": 1, "gather": 1,
            "scatter": 1, "all_gather_object": 1, "gather_object": 1, "broadcast_object_list": 1,
            "scatter_object_list": 1, ("send_object_list" if rank == 0 else "recv_object_list"): 1, "barrier": 2}


def _disagreements(rank: int, world: int) -> dict:
    """The calls where ranks could decide differently, each spelled as torch accepts it."""
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(9 + rank)
    x = torch.randn(NUMEL, generator=g)
    out = {}
    # all_to_all_single, splits left to torch spelled [] on one rank and None on the other: one call
    o = torch.empty(NUMEL)
    dist.all_to_all_single(o, x, [] if rank == 0 else None, [] if rank == 0 else None)
    out["a2a_empty"] = o
    # explicit splits on every rank (MoE routing), even on rank 0 by chance, uneven on rank 1: all exact
    half = NUMEL // 2
    splits = [half, half] if rank == 0 else [half, half // 2]
    n = sum(splits)
    o = torch.empty(n)
    dist.all_to_all_single(o, x[:n].contiguous(), splits, splits)
    out["a2a_routed"] = o
    # output and input of different dtypes: torch refuses on the rank itself, before anything is sent
    for name, n_out in (("all_gather_into_tensor", NUMEL * world), ("reduce_scatter_tensor", NUMEL // world)):
        out[f"mixed_{name}"] = _attempt(lambda: getattr(dist, name)(torch.empty(n_out, dtype=torch.bfloat16), x))[:2]
    # one reduce op, spelled differently per rank
    t = x.clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.RedOpType.SUM)
    out["sum_spellings"] = t
    # a P2POp without a peer (any source in a batch): torch refuses it, patched or not
    out["p2pop_any_source"] = _attempt(lambda: dist.P2POp(dist.irecv, torch.empty(4)))
    # tensors a codec must not touch: exact through every wrapped entry point
    sparse = torch.sparse_coo_tensor([[0, 7, 300]], [1.5 + rank, -2.0, 3.25], (NUMEL,))
    out["sparse_all_reduce"] = _attempt(lambda: (lambda t: (dist.all_reduce(t), t.to_dense())[1])(sparse.clone()))
    cplx = torch.complex(x, -x)
    out["complex_all_reduce"] = _attempt(lambda: (lambda t: (dist.all_reduce(t), t)[1])(cplx.clone()))
    out["complex_broadcast"] = _attempt(lambda: (lambda t: (dist.broadcast(t, 0), t)[1])(cplx.clone()))
    ints = torch.arange(NUMEL) * (rank + 1)
    out["int_all_reduce"] = _attempt(lambda: (lambda t: (dist.all_reduce(t), t)[1])(ints.clone()))
    q = torch.quantize_per_tensor(x, 0.05, 0, torch.qint8)
    out["quantized_broadcast"] = _attempt(lambda: (lambda t: (dist.broadcast(t, 0), t.int_repr())[1])(q.clone()))

    def p2p(t):
        if rank == 0:
            dist.send(t, 1)
            return None
        got = torch.empty_like(t)
        dist.recv(got, 0)
        return got

    out["complex_send_recv"] = _attempt(lambda: p2p(cplx))
    out["int_send_recv"] = _attempt(lambda: p2p(ints))
    # group ranks that are not the global ones: group rank 0 is global rank 1
    swapped = dist.new_group([1, 0], sort_ranks=False)
    if rank == 0:
        dist.send(x, group=swapped, group_dst=0)
        h = dist.isend(x, group=swapped, group_dst=0)
    else:
        got, got_async = torch.empty(NUMEL), torch.empty(NUMEL)
        dist.recv(got, group=swapped, group_src=1)
        h = dist.irecv(got_async, group=swapped, group_src=1)
    h.wait()
    out["group_src"] = (got, got_async) if rank == 1 else x
    return out


def _refusals(rank: int, world: int) -> dict:
    """A variable-size codec's size-then-payload cannot be paired up by an any-source receive."""
    import torch
    import torch.distributed as dist

    out = {}
    if rank == 1:
        out["any_source_variable_size"] = _attempt(lambda: dist.recv(torch.empty(NUMEL)))
    dist.barrier()
    return out


def _job(rank: int, world: int) -> dict:
    import ccoll
    import ccoll.patch as patch
    from ccoll import Policy

    native = {"lists": _lists(rank, world), "disagree": _disagreements(rank, world)}
    ccoll.reset_stats()
    with patch.installed(Policy.from_dict(INT8_ALL), resolver=lambda group, op: "dp", step_counter="manual"):
        lists = _lists(rank, world)
        list_stats = {(r["op"], r["codec"]): r["calls"] for r in ccoll.stats()}
        ccoll.reset_stats()
        disagree = _disagreements(rank, world)
        disagree_stats = {(r["op"], r["codec"].split(":")[0]): r["calls"] for r in ccoll.stats()}
    with patch.installed(Policy.from_dict(LOSSLESS_ALL), resolver=lambda group, op: "dp", step_counter="manual"):
        refusals = _refusals(rank, world)
    return {"native": native, "lists": lists, "list_stats": list_stats, "disagree": disagree,
            "disagree_stats": disagree_stats, "refusals": refusals}


@pytest.fixture(scope="module")
def results():
    return run_gloo(2, _job, timeout_s=180)


def _same(a, b) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def test_given_compressing_policy_when_calling_list_rooted_object_and_barrier_collectives_expect_exact_and_counted_once(results):
    for rank, r in enumerate(results):
        for name, got in r["lists"].items():
            assert _same(got, r["native"]["lists"][name]), (rank, name, got, r["native"]["lists"][name])
        supported = {name for name, got in r["lists"].items() if got[0] == "ok"}
        assert supported == set(r["lists"]), supported  # gloo runs every one of them
        assert all(codec == "native" for _, codec in r["list_stats"]), r["list_stats"]  # nothing compressed
        assert {op: n for (op, _), n in r["list_stats"].items()} == _expected_native(rank), r["list_stats"]


def test_given_paths_where_ranks_could_decide_differently_when_compressing_expect_agreement_or_exact(results):
    import torch

    for rank, r in enumerate(results):
        d, nd = r["disagree"], r["native"]["disagree"]
        # [] and None: both ranks compressed, close to torch's result, not payload bytes
        assert torch.allclose(d["a2a_empty"], nd["a2a_empty"], atol=0.05) and not torch.equal(d["a2a_empty"], nd["a2a_empty"])
        assert torch.equal(d["a2a_routed"], nd["a2a_routed"]), rank  # explicit splits: exact on both ranks
        assert r["disagree_stats"][("all_to_all", "int8")] == 1, r["disagree_stats"]
        assert r["disagree_stats"][("all_to_all", "native")] == 1, r["disagree_stats"]
        assert r["disagree_stats"][("all_reduce", "int8")] == 1, r["disagree_stats"]  # the two SUM spellings
        assert torch.allclose(d["sum_spellings"], nd["sum_spellings"], atol=0.1)
        assert torch.equal(d["sum_spellings"], results[1 - rank]["disagree"]["sum_spellings"])
        assert d["p2pop_any_source"][0] == "error" and d["p2pop_any_source"] == nd["p2pop_any_source"]
        for name in ("mixed_all_gather_into_tensor", "mixed_reduce_scatter_tensor"):
            assert d[name] == nd[name] == ("error", "RuntimeError"), (name, d[name], nd[name])
        for name in ("sparse_all_reduce", "complex_all_reduce", "complex_broadcast", "int_all_reduce",
                     "quantized_broadcast", "complex_send_recv", "int_send_recv"):
            assert _same(d[name], nd[name]), (rank, name, d[name], nd[name])
        assert d["sparse_all_reduce"][0] == "ok" and d["complex_send_recv"][0] == "ok"


def test_given_send_recv_by_group_ranks_on_a_reordered_group_when_compressing_expect_decoded_from_the_named_peer(results):
    import torch

    sent = results[0]["disagree"]["group_src"]
    for got in results[1]["disagree"]["group_src"]:  # recv(group_src=), irecv(group_src=)
        assert torch.allclose(got, sent, atol=0.05) and not torch.equal(got, sent)


def test_given_any_source_recv_with_a_variable_size_codec_when_compressing_expect_typed_refusal(results):
    got = results[1]["refusals"]["any_source_variable_size"]
    assert got[:2] == ("error", "TransportError") and "src=" in got[2], got
