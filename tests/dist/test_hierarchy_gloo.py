"""Hierarchy-aware collectives (ccoll.hierarchy) on 4 real gloo ranks declared as 2 nodes x 2 ranks.

One spawned group runs every check twice: with the node map from CCOLL_NODE_MAP (nodes {0,1} and
{2,3}) and with an interleaved map set by ``set_node_map`` (nodes {0,2} and {1,3}, so node order,
local index and group rank order all differ). The exact reference is computed in float64 on every
rank (each rank can generate every rank's input). On one machine the "nodes" are only declared: what
is tested here is the algorithm (results, replicas, error, fallbacks); the timing on shaped links is
measured by ``python -m ccoll.bench.nodes``."""
from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch import run_gloo  # noqa: E402

INT8 = "int8:block=256"
INT4 = "int4:block=64"


def _x(seed: int, rank: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    return (torch.randn(n, generator=g, dtype=torch.float64) * (1.0 + 0.5 * rank)).float()


def _roundtrip(c, x: torch.Tensor) -> float:
    """The int codecs' documented bound (round to nearest): max|x| / (2 qmax) per block, so at most
    that of the whole tensor."""
    qmax = 127 if c.name == "int8" else 7
    return float(x.abs().max()) / (2 * qmax) * 1.0001


def _rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).pow(2).mean().sqrt())


def _same(dist, t: torch.Tensor) -> bool:
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, t.contiguous().view(torch.uint8).numpy().tobytes())
    return all(o == out[0] for o in out)


def _checks(rank: int, world: int, nodes: list[int], seed: int) -> dict:
    import torch.distributed as dist

    import ccoll
    from ccoll import collectives as cc
    from ccoll.collectives import nodes as hierarchy
    from ccoll.collectives import segments
    from ccoll.errors import PolicyError

    lay = hierarchy.layout()
    assert lay is not None and (lay.nodes, lay.local_size) == (2, 2), lay
    assert [sorted(r) for r in lay.ranks] == sorted(sorted(i for i in range(world) if nodes[i] == n) for n in set(nodes))
    partials = {}
    for r in range(world):
        partials.setdefault(nodes[r], []).append(r)
    figures: dict = {}
    n = 3001  # not a multiple of L or of the codec blocks
    xs = [_x(seed, r, n) for r in range(world)]
    exact = torch.stack([x.double() for x in xs]).sum(0)
    node_sums = [torch.stack([xs[r].double() for r in rs]).sum(0).float() for rs in partials.values()]
    for spec in (INT8, INT4):
        c = ccoll.get_codec(spec)
        # all_reduce: ONE lossy phase (N = 2): each node's partial sum encoded once
        t = xs[rank].clone()
        cc.all_reduce(t, codec=spec, min_bytes=0, hierarchy="node")
        err = float((t.double() - exact).abs().max())
        bound = sum(_roundtrip(c, s) for s in node_sums) + float(exact.abs().max()) * 4 * 2.0**-23
        assert err <= bound, f"{spec} all_reduce error {err} > one-phase bound {bound}"
        assert _same(dist, t), f"{spec} hierarchical all_reduce replicas differ"
        f = xs[rank].clone()
        cc.all_reduce(f, codec=spec, min_bytes=0)
        figures[f"all_reduce {spec} rms hier/flat"] = (_rms(t, exact), _rms(f, exact))
        assert _rms(t, exact) < _rms(f, exact), f"{spec}: hierarchical error not below flat"
        # async: same bytes as the sync call (deterministic codec)
        a = xs[rank].clone()
        h = cc.all_reduce(a, codec=spec, min_bytes=0, hierarchy="node", async_op=True)
        h.wait()
        assert torch.equal(a, t), f"{spec} async all_reduce differs from sync"
        # many pipeline segments (the node exchange of one overlaps the intra-node phases of others)
        seg_bytes, segments.SEGMENT_BYTES = segments.SEGMENT_BYTES, 2048
        try:
            sg = xs[rank].clone()
            cc.all_reduce(sg, codec=spec, min_bytes=0, hierarchy="node")
            sa = xs[rank].clone()
            cc.all_reduce(sa, codec=spec, min_bytes=0, hierarchy="node", async_op=True).get_future().wait()
        finally:
            segments.SEGMENT_BYTES = seg_bytes
        assert float((sg.double() - exact).abs().max()) <= bound and _same(dist, sg) and torch.equal(sa, sg)
        # avg on a non-contiguous view
        base = torch.zeros(n, 2)
        base[:, 0] = xs[rank]
        view = base[:, 0]
        cc.all_reduce(view, op="avg", codec=spec, min_bytes=0, hierarchy="node")
        assert float((view.double() - exact / world).abs().max()) <= bound / world * 1.01
        assert torch.equal(base[:, 1], torch.zeros(n)) and _same(dist, view)

        # reduce_scatter: one lossy phase over N node partials instead of p inputs
        m = 1000
        ins = [_x(seed + 1, r, world * m) for r in range(world)]
        ref = torch.stack([x.double() for x in ins]).sum(0).view(world, m)[rank]
        node_in = [torch.stack([ins[r].double() for r in rs]).sum(0).float() for rs in partials.values()]
        out = torch.empty(m)
        cc.reduce_scatter_tensor(out, ins[rank], codec=spec, min_bytes=0, hierarchy="node")
        rs_bound = sum(_roundtrip(c, s) for s in node_in) + float(ref.abs().max()) * 4 * 2.0**-23
        assert float((out.double() - ref).abs().max()) <= rs_bound
        fout = torch.empty(m)
        cc.reduce_scatter_tensor(fout, ins[rank], codec=spec, min_bytes=0)
        figures[f"reduce_scatter {spec} rms hier/flat"] = (_rms(out, ref), _rms(fout, ref))
        aout = torch.empty(m)
        cc.reduce_scatter_tensor(aout, ins[rank], op="avg", codec=spec, min_bytes=0, hierarchy="node",
                                 async_op=True).wait()
        assert torch.allclose(aout, out / world, rtol=0, atol=float(out.abs().max()) * 2.0**-22)

        # all_gather: every input encoded once, as flat: with a deterministic codec the same bytes as flat
        g_in = _x(seed + 2, rank, 777)
        hg, fg = torch.empty(world * 777), torch.empty(world * 777)
        cc.all_gather_into_tensor(hg, g_in, codec=spec, min_bytes=0, hierarchy="node", async_op=True).wait()
        cc.all_gather_into_tensor(fg, g_in, codec=spec, min_bytes=0)
        assert torch.equal(hg, fg), f"{spec} hierarchical all_gather differs from flat"
        for r in range(world):
            slot = hg[r * 777:(r + 1) * 777]
            xr = _x(seed + 2, r, 777)
            assert float((slot - xr).abs().max()) <= _roundtrip(c, xr)

    # error feedback: the node-phase residual carries the dropped error to the next call, so the
    # average over calls approaches the exact sum (it does not without feedback)
    ef = ccoll.ErrorFeedback()
    runs = {True: torch.zeros(n, dtype=torch.float64), False: torch.zeros(n, dtype=torch.float64)}
    steps = 8
    for use_ef in (True, False):
        for _ in range(steps):
            t = xs[rank].clone()
            cc.all_reduce(t, codec=INT4, min_bytes=0, hierarchy="node",
                          error_feedback=ef if use_ef else None, key="grad")
            runs[use_ef] += t.double() / steps
    assert ("grad", "node") in ef.keys()
    assert _rms(runs[True], exact) < 0.5 * _rms(runs[False], exact), (_rms(runs[True], exact), _rms(runs[False], exact))
    assert _same(dist, runs[True].float())

    # passthrough: no codec, MAX, integers stay exact native calls
    t = xs[rank].clone()
    cc.all_reduce(t, codec=None, hierarchy="node")
    assert torch.allclose(t.double(), exact, atol=1e-4)
    t = xs[rank].clone()
    cc.all_reduce(t, op="max", codec=INT8, min_bytes=0, hierarchy="node")
    assert torch.equal(t, torch.stack(xs).max(0).values)
    i = torch.arange(10) * (rank + 1)
    cc.all_reduce(i, codec=INT8, min_bytes=0, hierarchy="node")
    assert torch.equal(i, torch.arange(10) * sum(range(1, world + 1)))
    try:
        cc.all_reduce(xs[rank].clone(), codec=INT8, min_bytes=0, hierarchy="rack")
    except PolicyError:
        pass
    else:
        raise AssertionError("unknown hierarchy accepted")
    return figures


def _degenerate(rank: int, world: int) -> None:
    """Maps where the hierarchy has nothing to split give exactly the flat result; an uneven map logs
    and runs flat; a bad map is a typed error."""
    import torch.distributed as dist

    from ccoll import collectives as cc
    from ccoll.collectives import nodes as hierarchy
    from ccoll.errors import PolicyError

    x = _x(5, rank, 2048)
    flat = x.clone()
    cc.all_reduce(flat, codec=INT4, min_bytes=0, salt=7)
    for node_map in ([0, 0, 0, 0], [0, 1, 2, 3], [0, 0, 0, 1], 4, 1):
        hierarchy.set_node_map(node_map)
        if node_map == [0, 0, 0, 1]:
            try:
                hierarchy.layout()
            except PolicyError as e:
                assert "unevenly" in str(e)
            else:
                raise AssertionError("uneven node map accepted by layout()")
        else:
            assert hierarchy.layout() is None
        t = x.clone()
        cc.all_reduce(t, codec=INT4, min_bytes=0, salt=7, hierarchy="node")
        assert torch.equal(t, flat), f"node map {node_map}: not the flat result"
    for bad in ([], 0, "0,1", [[0]]):
        try:
            hierarchy.set_node_map(bad)
        except PolicyError:
            pass
        else:
            raise AssertionError(f"bad node map {bad!r} accepted")
    hierarchy.set_node_map(None)
    assert _same(dist, flat)


def _rank(rank: int, world: int) -> dict:
    from ccoll.collectives import nodes as hierarchy

    figures = {"contiguous": _checks(rank, world, [0, 0, 1, 1], seed=1)}  # from CCOLL_NODE_MAP
    hierarchy.set_node_map(["b", "a", "b", "a"])  # interleaved, node ids of any hashable type
    figures["interleaved"] = _checks(rank, world, [1, 0, 1, 0], seed=2)
    _degenerate(rank, world)
    return figures


def test_hierarchy_given_2_nodes_x_2_ranks_expect_one_lossy_phase_identical_replicas_and_flat_fallbacks():
    reports = run_gloo(4, _rank, timeout_s=300, env={"CCOLL_NODE_MAP": "0,0,1,1"})
    for name, figs in reports[0].items():
        for what, (hier, flat) in figs.items():
            print(f"{name}: {what} {hier:.3g} / {flat:.3g}")


@pytest.mark.mpi
def test_hierarchy_given_mpi_comm_split_into_interleaved_nodes_expect_bounded_identical_results():
    from launch import run_mpi

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hierarchy_mpi_checks.py")
    out = run_mpi(4, script, timeout_s=180, env={"CCOLL_NODE_MAP": "0,1,0,1"}).stdout
    assert "CCOLL_HIER_OK" in out, out[-4000:]
