"""A compressed call in a profile looks like torch's call, on real gloo ranks: the backend's event
(``gloo:all_reduce``, ``gloo:send``, ``gloo:recvAnySource``, ...) once per call, async, with the caller's
tensor shapes, and none of the payload traffic's own (``gloo:all_gather`` of uint8 bytes); under both
profilers (autograd's and torch.profiler's). Also what torch's tests read from handles: the any-source
``irecv`` handle's ``_source_rank()`` and an all_gather_into_tensor's ``get_future()`` value.
torch's own distributed tests check the same (tests/dist/test_torch_suite.py)."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from launch import run_gloo  # noqa: E402


def _calls(rank: int, dist, torch) -> dict:
    """name -> a callable making one call of each compressed entry point (on both ranks)."""
    t = torch.arange(27, dtype=torch.float32).reshape(3, 3, 3)
    out, inp = torch.empty(2 * 12), torch.ones(12)

    def p2p():
        if rank == 0:
            dist.send(t, 1)
            dist.recv(t, 1)
        else:
            dist.recv(t, 0)
            dist.send(t, 0)

    def p2p_async():
        if rank == 0:
            dist.isend(t, 1).wait()
        else:
            dist.irecv(t, 0).wait()

    def any_source():
        if rank == 0:
            dist.recv(t)
            dist.irecv(t).wait()
        else:
            dist.send(t, 0)
            dist.send(t, 0)

    return {
        "all_reduce": lambda: dist.all_reduce(t),
        "all_reduce_async": lambda: dist.all_reduce(t, async_op=True).wait(),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(out, inp),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(inp, out),
        "broadcast": lambda: dist.broadcast(t, 0),
        "send_recv": p2p,
        "isend_irecv": p2p_async,
        "any_source": any_source,
    }


def _profile(rank: int, dist, torch, kind: str) -> dict:
    """name -> sorted [(event name, input shapes, is_async, count)] of the backend's (``gloo:``) events, and
    the dispatcher (``c10d::``) event names, of each call."""
    got = {}
    for name, call in _calls(rank, dist, torch).items():
        if kind == "autograd":
            ctx = torch.autograd.profiler.profile(record_shapes=True)
        else:
            ctx = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
        with ctx as prof:
            call()
        events = prof.function_events if kind == "autograd" else prof.events()
        got[name] = (sorted((e.name, e.input_shapes, e.is_async, e.count) for e in events if e.name.startswith("gloo:")),
                     sorted(e.name for e in events if e.name.startswith("c10d::")))
        dist.barrier()
    return got


def _handles(rank: int, dist, torch) -> dict:
    """What torch's tests read from handles: an any-source irecv's _source_rank(), an all_gather_into_tensor's
    get_future() value (shape and offset of each tensor in the output)."""
    out, inp = torch.empty(2 * 12), torch.full((12,), float(rank + 1))
    w = dist.all_gather_into_tensor(out, inp, async_op=True)
    w.wait()
    future = [(tuple(v.shape), v.data_ptr() - out.data_ptr(), v.tolist()) for v in w.get_future().wait()]
    rs_out = torch.empty(12)
    w = dist.reduce_scatter_tensor(rs_out, out, async_op=True)
    w.wait()
    try:  # torch's gloo has no future here; ccoll's handle has one (docs/TORCH_CONTRACTS.md)
        rs_future = [(tuple(v.shape), v.data_ptr() == rs_out.data_ptr()) for v in w.get_future().wait()]
    except RuntimeError as e:
        rs_future = str(e)
    source = None
    if rank == 0:
        buf = torch.empty(10)
        h = dist.irecv(buf)
        h.wait()
        source = (h._source_rank(), buf.tolist())
    else:
        dist.send(torch.full((10,), 1.0), 0)
    dist.barrier()
    return {"future": future, "source": source, "rs_future": rs_future}


def _job(rank: int, world: int):
    import torch
    import torch.distributed as dist

    import ccoll
    from ccoll import patch
    from ccoll.policy import Policy

    native = {kind: _profile(rank, dist, torch, kind) for kind in ("autograd", "torch")}
    native_handles = _handles(rank, dist, torch)
    patch.install(Policy.from_dict({"version": 1, "dp": {"codec": "bf16", "min_bytes": 0}}),
                  resolver=lambda group, op: "dp", step_counter="manual")
    ccoll.reset_stats()
    try:
        compressed = {kind: _profile(rank, dist, torch, kind) for kind in ("autograd", "torch")}
        compressed_handles = _handles(rank, dist, torch)
        codecs = sorted({(r["op"], r["codec"]) for r in ccoll.stats()})
    finally:
        patch.uninstall()
    return {"native": native, "compressed": compressed, "native_handles": native_handles,
            "compressed_handles": compressed_handles, "codecs": codecs}


def test_given_compressed_calls_when_profiled_or_asked_like_torch_work_expect_torch_events_shapes_and_values():
    for res in run_gloo(2, _job, timeout_s=180):
        for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv"):
            assert (op, "bf16") in res["codecs"], (op, res["codecs"])
        for kind in ("autograd", "torch"):
            for name, (backend, dispatcher) in res["native"][kind].items():
                assert backend, (kind, name)  # torch records the backend's event: the comparison means something
                assert res["compressed"][kind][name][0] == backend, (kind, name, res["compressed"][kind][name][0], backend)
                assert res["compressed"][kind][name][1] == dispatcher, (kind, name)
        native_rs, compressed_rs = res["native_handles"].pop("rs_future"), res["compressed_handles"].pop("rs_future")
        assert "not implemented" in native_rs and compressed_rs == [((12,), True)]
        assert res["compressed_handles"] == res["native_handles"]
