"""What Megatron-core does with torch.distributed that other frameworks do not, on real gloo ranks (the
real Megatron-core run: tests/integration/test_megatron_core.py).

- Its DistributedDataParallel reduces the gradient buckets of a bucket group inside torch's
  ``_coalescing_manager(group, async_ops=overlap_grad_reduce)`` (``param_and_grad_buffer.start_grad_sync``:
  ``all_reduce``, or ``reduce_scatter_tensor`` for the distributed optimizer) and waits on the manager, not
  on the calls' handles. Inside the block torch's collectives on the group only record themselves; ccoll's
  own traffic for a compressed call must still travel, and the call must be finished when the block ends.
  Native calls in the same block stay coalesced by torch.
- Its pipeline sends run under a ``TorchFunctionMode`` in CPU runs (and under any mode a user sets, e.g.
  torch's FlopCounterMode): torch's isend / irecv then dispatch to ``distributed_c10d.isend`` / ``irecv``
  again, which are ccoll's wrappers; a native send must still be counted once.
"""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch import run_gloo  # noqa: E402

NUMEL = 4096
POLICY = {"version": 1, "default": {"codec": "native"},
          "dp": {"codec": "int8:block=256", "min_bytes": 1024}}  # 1 KB: the 64-value tensor below stays native


def _coalesced_job(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed import _coalescing_manager

    import ccoll
    import ccoll.patch as patch
    from ccoll import Policy

    group = dist.new_group(list(range(world)))

    def inputs():
        g = torch.Generator().manual_seed(11 + rank)
        return [torch.randn(NUMEL, generator=g), torch.randn(NUMEL, generator=g), torch.randn(64, generator=g)]

    def reduce_plain() -> list:  # each call on its own, not coalesced
        ts = inputs()
        for t in ts:
            dist.all_reduce(t, group=group)
        rs = torch.empty(NUMEL // world)
        dist.reduce_scatter_tensor(rs, inputs()[0], group=group)
        return ts + [rs]

    def reduce_coalesced(async_ops: bool) -> list:  # Megatron-core's DDP: buckets inside the manager
        ts = inputs()
        with _coalescing_manager(group, async_ops=async_ops) as cm:
            for t in ts:
                dist.all_reduce(t, group=group, async_op=async_ops)
        if async_ops:
            cm.wait()
        rs = torch.empty(NUMEL // world)
        with _coalescing_manager(group, async_ops=async_ops) as cm:  # the distributed optimizer's reduce-scatter
            dist.reduce_scatter_tensor(rs, inputs()[0], group=group, async_op=async_ops)
        if async_ops:
            cm.wait()
        return ts + [rs]

    out = {"torch": reduce_coalesced(False)}
    with patch.installed(Policy.from_dict(POLICY), resolver=lambda g, op: "dp", step_counter="manual"):
        out["plain"] = reduce_plain()
        ccoll.reset_stats()
        out["sync"] = reduce_coalesced(False)
        out["async"] = reduce_coalesced(True)
        out["stats"] = {(r["op"], r["codec"].split(":")[0]): r["calls"] for r in ccoll.stats()}
        out["left_open"] = dict(dist.distributed_c10d._world.pg_coalesce_state)
    return out


@pytest.fixture(scope="module")
def coalesced():
    return run_gloo(2, _coalesced_job, timeout_s=180)


def test_given_compressed_all_reduce_inside_coalescing_manager_when_sync_or_async_expect_done_and_equal_to_plain(coalesced):
    import torch

    for res in coalesced:
        for mode in ("sync", "async"):
            # the compressed calls (the two large all-reduces, the reduce-scatter): what ccoll gives outside the
            # manager, bit for bit; the small native one: torch's coalesced all-reduce, equal to torch's
            for got, plain, ref in zip(res[mode], res["plain"], res["torch"]):
                assert torch.equal(got, plain), mode
            assert not torch.equal(res[mode][0], res["torch"][0])  # really compressed
            assert torch.equal(res[mode][2], res["torch"][2])
        assert res["stats"] == {("all_reduce", "int8"): 4, ("all_reduce", "native"): 2, ("reduce_scatter", "int8"): 2}
        assert res["left_open"] == {}  # every manager closed, nothing left recorded


def _p2p_mode_job(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.overrides import TorchFunctionMode

    import ccoll
    import ccoll.patch as patch
    from ccoll import Policy

    class Passing(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    t = torch.full((NUMEL,), float(rank))
    peer = 1 - rank
    out = {}
    for name, policy in (("native", {"version": 1, "default": {"codec": "native"}}),
                         ("compressed", {"version": 1, "default": {"codec": "int8:block=256", "min_bytes": 0}})):
        ccoll.reset_stats()
        with patch.installed(Policy.from_dict(policy), resolver=lambda g, op: "pp", step_counter="manual"), Passing():
            got = torch.empty(NUMEL)
            ops = [dist.P2POp(dist.isend, t, peer), dist.P2POp(dist.irecv, got, peer)]
            for w in dist.batch_isend_irecv(ops):  # Megatron-core's _batched_p2p_ops
                w.wait()
            got2 = torch.empty(NUMEL)
            reqs = [dist.isend(t, peer), dist.irecv(got2, peer)] if rank == 0 else [dist.irecv(got2, peer), dist.isend(t, peer)]
            for w in reqs:  # its _p2p_ops (batch_p2p_comm=False)
                w.wait()
            if rank == 0:
                dist.send(t, peer)
            else:
                dist.recv(got2, peer)
        out[name] = {"stats": {(r["op"], r["codec"].split(":")[0]): r["calls"] for r in ccoll.stats()},
                     "received": [float(got[0]), float(got2[0])]}
    return out


def test_given_torch_function_mode_when_native_or_compressed_p2p_expect_each_send_counted_once():
    for rank, res in enumerate(run_gloo(2, _p2p_mode_job, timeout_s=180)):
        peer = float(1 - rank)
        last = {"send": 3 if rank == 0 else 2, "recv": 2 if rank == 0 else 3}  # the blocking send/recv: one side each
        assert res["native"]["stats"] == {("send", "native"): last["send"], ("recv", "native"): last["recv"]}
        assert res["compressed"]["stats"] == {("send", "int8"): last["send"], ("recv", "int8"): last["recv"]}
        assert res["native"]["received"] == res["compressed"]["received"] == [peer, peer]
