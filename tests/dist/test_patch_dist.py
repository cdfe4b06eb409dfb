"""ccoll.patch on real gloo ranks: pass-through is bit-identical with the same return values, compressed
calls agree across ranks, excluded traffic stays exact, re-entrant calls reach torch, and mismatched
policies fail on every rank with the ranks named (no hang)."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch import run_gloo  # noqa: E402

BASELINE = {"version": 1, "default": {"codec": "native"}}
BF16_ALL = {"version": 1, "default": {"codec": "bf16", "min_bytes": 0}}


def _script(rank: int, world: int):
    """Every wrapped call once; returns (outputs, return values). Rank 0 sends to rank 1."""
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(1234 + rank)
    f = torch.randn(8192, generator=g)
    outs, rets = {}, {}

    t = f.clone(); rets["all_reduce"] = dist.all_reduce(t); outs["all_reduce"] = t
    t = f.clone(); rets["all_reduce_max"] = dist.all_reduce(t, op=dist.ReduceOp.MAX); outs["all_reduce_max"] = t
    t = torch.arange(5000, dtype=torch.int64) * (rank + 1); dist.all_reduce(t); outs["all_reduce_int"] = t
    t = f[:1].clone(); dist.all_reduce(t); outs["all_reduce_scalar"] = t
    t = f.clone(); h = dist.all_reduce(t, async_op=True); rets["all_reduce_async"] = type(h).__name__ != "NoneType"
    h.wait(); outs["all_reduce_async"] = t
    for name in ("all_gather_into_tensor", "_all_gather_base", "all_gather_single"):
        out = torch.empty(world * 4096)
        rets[name] = getattr(dist, name)(out, f[:4096].clone())
        outs[name] = out
    for name in ("reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter_single"):
        out = torch.empty(8192 // world)
        rets[name] = getattr(dist, name)(out, f.clone())
        outs[name] = out
    t = f.clone(); rets["broadcast"] = dist.broadcast(t, src=1); outs["broadcast"] = t
    t = f.clone(); out = torch.empty_like(t); dist.all_to_all_single(out, t); outs["all_to_all_single"] = out
    p2p = f.clone() if rank == 0 else torch.empty(8192)
    if rank == 0:
        rets["send"] = dist.send(p2p, dst=1)
        dist.isend(p2p * 2, 1).wait()
    elif rank == 1:
        rets["recv"] = dist.recv(p2p, src=0)
        q = torch.empty(8192)
        dist.irecv(q, src=0).wait()
        outs["irecv"] = q
    outs["p2p"] = p2p
    return outs, rets


def _job_passthrough_and_compression(rank: int, world: int):
    import torch
    import torch.distributed as dist

    import ccoll
    import ccoll.patch as patch
    from ccoll import Policy

    ref_outs, ref_rets = _script(rank, world)

    # baseline installed: bit-identical outputs and identical return values; every call counted native
    ccoll.reset_stats()
    with patch.installed(Policy.from_dict(BASELINE)):
        outs, rets = _script(rank, world)
    for k, v in ref_outs.items():
        assert torch.equal(outs[k], v), k
    assert {k: (type(v).__name__, v if isinstance(v, (int, bool)) else None) for k, v in rets.items()} == \
        {k: (type(v).__name__, v if isinstance(v, (int, bool)) else None) for k, v in ref_rets.items()}
    st = ccoll.stats()
    assert st and all(r["codec"] == "native" and r["dim"] == "default" for r in st), st
    assert sum(r["calls"] for r in st if r["op"] == "all_reduce") == 5

    # bf16 everywhere: float data compressed and identical on every rank; ints, MAX, scalars exact
    ccoll.reset_stats()
    with patch.installed(Policy.from_dict(BF16_ALL)):
        outs, rets = _script(rank, world)
    for k in ("all_reduce_max", "all_reduce_int", "all_reduce_scalar"):
        assert torch.equal(outs[k], ref_outs[k]), k
    for k in ("all_reduce", "all_reduce_async", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast",
              "all_to_all_single", "p2p"):
        assert torch.allclose(outs[k], ref_outs[k], rtol=2 ** -7, atol=1e-2), k
        assert not torch.equal(outs[k], ref_outs[k]) or k == "p2p" and rank == 0, k  # really went through bf16
    assert rets["all_reduce"] is None and rets["broadcast"] is None
    if rank == 1:
        assert rets["recv"] == 0  # like torch: the sender's global rank
    gathered = [torch.empty(8192) for _ in range(world)]
    dist.all_gather(gathered, outs["all_reduce"])  # the list form: kept exact
    assert all(torch.equal(x, gathered[0]) for x in gathered), "compressed all_reduce differs across ranks"
    gathered = [torch.empty(world * 4096) for _ in range(world)]
    dist.all_gather(gathered, outs["all_gather_into_tensor"])
    assert all(torch.equal(x, gathered[0]) for x in gathered), "all_gather slots differ across ranks"
    by = {(r["op"], r["codec"]): r for r in ccoll.stats()}
    assert all(r["dim"] == "default" for r in by.values()), by
    print(rank, sorted((k, v["calls"]) for k, v in by.items()))
    assert by[("all_reduce", "bf16")]["calls"] == 2
    assert by[("all_reduce", "native")]["calls"] == 3  # MAX, int64, scalar
    assert by[("all_gather", "bf16")]["calls"] == 3 and by[("reduce_scatter", "bf16")]["calls"] == 3
    assert by[("send" if rank == 0 else "recv", "bf16")]["calls"] == 2
    assert by[("all_reduce", "bf16")]["wire_bytes"] * 2 == by[("all_reduce", "bf16")]["raw_bytes"]

    # a resolver that does not place a group: untouched, not even counted
    ccoll.reset_stats()
    with patch.installed(Policy.from_dict(BF16_ALL), resolver=lambda group, op: None):
        outs, _ = _script(rank, world)
    assert all(torch.equal(outs[k], v) for k, v in ref_outs.items())
    assert ccoll.stats() == []
    return True




def _job_reentrancy(rank: int, world: int):
    """A codec whose encode itself calls torch.distributed.all_reduce: the inner call must reach torch
    (with the guard) instead of re-entering ccoll (which would recurse without end)."""
    import torch
    import torch.distributed as dist

    import ccoll
    import ccoll.patch as patch
    from ccoll import Policy
    from ccoll.codecs import CODECS
    from ccoll.codecs.cast import BF16Codec

    inner_results = []

    @CODECS.register("reenter")
    class Reenter(BF16Codec):
        name = "reenter"

        def encode_rows(self, *args, **kwargs):  # the codec call the collectives make
            probe = torch.full((2048,), float(dist.get_rank() + 1))
            dist.all_reduce(probe)  # patched attribute: must go straight to torch
            inner_results.append(probe[0].item())
            return super().encode_rows(*args, **kwargs)

    ccoll.reset_stats()
    with patch.installed(Policy.from_dict({"version": 1, "default": {"codec": "reenter", "min_bytes": 0}})):
        t = torch.ones(4096)
        dist.all_reduce(t)
    assert inner_results and all(v == 3.0 for v in inner_results)
    assert torch.equal(t, torch.full((4096,), 2.0))
    rows = [r for r in ccoll.stats() if r["op"] == "all_reduce"]
    assert [(r["codec"], r["calls"]) for r in rows] == [("reenter", 1)], rows  # the probes were not ccoll's
    return True


def _job_fingerprints(rank: int, world: int, tmpdir: str):
    import datetime

    import torch.distributed as dist

    import ccoll.patch as patch
    from ccoll import Policy
    from ccoll.errors import PolicyError

    mine = Policy.from_dict({"version": 1, "dp": {"codec": "bf16" if rank == 0 else "fp16"}}, source=f"rank{rank}.yaml")
    same = Policy.from_dict(BF16_ALL)
    messages = []
    # 1) installed after init: checked at install
    patch.install(same)
    try:
        patch.install(mine)
    except PolicyError as e:
        messages.append(str(e))
    patch.uninstall()
    dist.destroy_process_group()

    # 2) installed before init: checked when init_process_group returns (equal policies: passes)
    def init(n):
        dist.init_process_group("gloo", init_method=f"file://{tmpdir}/pg{n}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))

    patch.install(same)
    init(1)
    dist.destroy_process_group()
    patch.install(mine)
    try:
        init(2)
    except PolicyError as e:
        messages.append(str(e))
    patch.uninstall()
    dist.destroy_process_group()

    # 3) the same policy, but rank 1 cuts its all_reduces into other segments: it would issue other
    # collectives than rank 0 and hang the group, so the check refuses it
    from ccoll.collectives import segments

    saved = segments.SEGMENT_BYTES
    segments.SEGMENT_BYTES = saved if rank == 0 else saved // 2
    try:
        init(3)
        patch.install(Policy.from_dict(BF16_ALL, source=f"seg{rank}.yaml"))
    except PolicyError as e:
        messages.append(str(e))
    finally:
        segments.SEGMENT_BYTES = saved
        patch.uninstall()
    return messages


def _job_resolvers(rank: int, world: int):
    """Rank-set matching on real groups: any group object over the listed ranks, WORLD p2p, unknown sets."""
    import torch.distributed as dist

    from ccoll.resolvers import RankSetResolver

    a, b = dist.new_group([0, 1]), dist.new_group([0, 1])  # two objects, one rank set (as DeepSpeed + mpu do)
    r = RankSetResolver({"tp": [[0, 1]]}, p2p_on_world="pp")
    none = RankSetResolver({"dp": [[0, 2]]})
    return {
        "a": r(a, "all_reduce"), "b": r(b, "all_gather"), "world": r(None, "all_reduce"),
        "world_obj": r(dist.group.WORLD, "broadcast"), "p2p_world": r(None, "send_recv"),
        "p2p_group": r(a, "send_recv"), "unlisted": none(a, "all_reduce"), "no_p2p": none(None, "send_recv"),
    }


def _job(rank: int, world: int, tmpdir: str):
    """One group for all checks (starting ranks costs more than the checks); fingerprints last, as they
    re-create the process group."""
    return {"passthrough": _job_passthrough_and_compression(rank, world), "reentrancy": _job_reentrancy(rank, world),
            "resolvers": _job_resolvers(rank, world),
            "fingerprints": _job_fingerprints(rank, world, tmpdir)}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_gloo(2, _job, str(tmp_path_factory.mktemp("pg")), timeout_s=150)


def test_given_two_gloo_ranks_when_patched_expect_passthrough_bit_identical_and_compressed_calls_agree(results):
    assert [r["passthrough"] for r in results] == [True, True]


def test_given_reentrant_call_inside_codec_when_patched_expect_it_reaches_torch_directly(results):
    assert [r["reentrancy"] for r in results] == [True, True]


def test_given_ranks_with_different_policies_or_segments_when_installing_expect_error_naming_ranks(results):
    for rank, messages in enumerate(r["fingerprints"] for r in results):
        assert len(messages) == 3, messages
        for m in messages:
            assert "mismatch" in m and "ranks [0]" in m and "ranks [1]" in m, m
        for m in messages[:2]:
            assert "rank0.yaml" in m and "rank1.yaml" in m, m
        assert "seg0.yaml" in messages[2] and "seg1.yaml" in messages[2], messages[2]
        assert "/seg8388608/" in messages[2] and "/seg4194304/" in messages[2], messages[2]


def test_given_rank_set_resolver_when_groups_share_ranks_expect_same_dimension_and_world_p2p_mapped(results):
    for r in results:
        assert r["resolvers"] == {"a": "tp", "b": "tp", "world": "tp", "world_obj": "tp", "p2p_world": "pp",
                                  "p2p_group": "tp", "unlisted": None, "no_p2p": None}
