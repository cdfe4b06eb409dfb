"""What a compressed call looks like to code written for torch, on real gloo ranks: an async handle's
``result()`` returns what torch's ``Work.result()`` returns, and a profile shows torch's event name."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from launch import run_gloo  # noqa: E402

NUMEL = 1024


def _results(dist, torch):
    """[(shape, byte offset into the call's output)] of result() for all_reduce, all_gather, broadcast."""
    x, out = torch.ones(NUMEL), torch.empty(2 * NUMEL)

    def layout(items, base):
        return [(tuple(t.shape), t.data_ptr() - base.data_ptr()) for t in items]

    def result(w):  # torch's Work wants wait() first
        w.wait()
        return w.result()

    return {"all_reduce": layout(result(dist.all_reduce(x, async_op=True)), x),
            "all_gather": layout(result(dist.all_gather_into_tensor(out, x, async_op=True)), out),
            "broadcast": layout(result(dist.broadcast(x, 0, async_op=True)), x)}


def _job(rank: int, world: int):
    import torch
    import torch.distributed as dist
    from torch.profiler import profile

    import ccoll
    from ccoll import patch
    from ccoll.policy import Policy

    native = _results(dist, torch)
    patch.install(Policy.from_dict({"version": 1, "dp": {"codec": "bf16", "min_bytes": 0}}),
                  resolver=lambda group, op: "dp", step_counter="manual")
    ccoll.reset_stats()
    try:
        compressed = _results(dist, torch)
        with profile() as prof:
            dist.all_reduce(torch.ones(NUMEL))
        events = {e.name for e in prof.events()}
        codecs = {(r["op"], r["codec"]) for r in ccoll.stats()}
    finally:
        patch.uninstall()
    return {"native": native, "compressed": compressed, "events": "c10d::allreduce_" in events, "codecs": codecs}


def test_given_compressed_async_calls_when_asking_result_and_profiling_expect_what_torch_gives():
    for res in run_gloo(2, _job, timeout_s=120):
        assert ("all_reduce", "bf16") in res["codecs"] and ("all_gather", "bf16") in res["codecs"]
        assert res["compressed"] == res["native"]
        assert res["events"]


def _job_work(rank: int, world: int):
    import torch
    import torch.distributed as dist

    from ccoll import patch
    from ccoll.policy import Policy

    patch.install(Policy.from_dict({"version": 1, "dp": {"codec": "bf16", "min_bytes": 0}}),
                  resolver=lambda group, op: "dp", step_counter="manual")
    try:
        x = torch.ones(NUMEL)
        h = dist.all_reduce(x, async_op=True)
        is_work = isinstance(h, dist.Work)
        code = h.get_future_result().wait()
        h.synchronize()
        done = h.is_success() and h.exception() is None and h.wait() and h.is_completed()
        p2p = dist.isend(x, 1) if rank == 0 else dist.irecv(torch.empty(NUMEL), 0)
        p2p_is_work = isinstance(p2p, dist.Work)
        p2p.wait()
    finally:
        patch.uninstall()
    return {"is_work": is_work and p2p_is_work, "code": code, "done": done, "sum": x[0].item()}


def test_given_compressed_async_handle_when_checked_as_torch_work_expect_isinstance_and_every_work_method_answering():
    import torch

    success = int(torch._C._distributed_c10d.WorkResult.SUCCESS.value)
    for res in run_gloo(2, _job_work, timeout_s=120):
        assert res["is_work"] and res["done"] and res["sum"] == 2.0
        assert res["code"] == success
