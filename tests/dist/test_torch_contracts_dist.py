"""torch's own contracts kept under ccoll.patch, on real gloo ranks: ``P2POp`` / ``batch_isend_irecv``,
torch.distributed.pipelining (PipelineStage + ScheduleGPipe / Schedule1F1B) and DDP with torch's
``default_hooks`` — each with the patch installed and compressing, compared with the unpatched run."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch import run_gloo  # noqa: E402

INT8_ALL = {"version": 1, "default": {"codec": "int8:block=64", "min_bytes": 0}}
INT8_PP = {"version": 1, "pp": {"codec": "int8:block=64", "min_bytes": 0}}


def _job_p2pop(rank: int, world: int):
    """P2POp(dist.isend) with the patch installed; batch_isend_irecv mixing a compressed float tensor, a
    native int tensor and a tensor below min_bytes; handles are Work-shaped."""
    import datetime

    import torch
    import torch.distributed as dist

    import ccoll
    import ccoll.patch as patch
    from ccoll import Policy

    peer = 1 - rank
    g = torch.Generator().manual_seed(7 + rank)
    mine, ints = torch.randn(4096, generator=g), torch.arange(1000) * (rank + 1)
    out = {}
    got_early = torch.empty(4096)
    early = [dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, got_early, peer)]  # torch's own functions
    ccoll.reset_stats()
    with patch.installed(Policy.from_dict({"version": 1, "default": {"codec": "bf16", "min_bytes": 1024}})):
        assert dist.isend is dist.distributed_c10d.isend and dist.irecv is dist.distributed_c10d.irecv
        got, got_ints, got_small = torch.empty(4096), torch.empty(1000, dtype=torch.int64), torch.empty(8)
        ops = [dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, got, peer),
               dist.P2POp(dist.isend, ints, peer), dist.P2POp(dist.irecv, got_ints, peer),
               dist.P2POp(dist.isend, mine[:8].clone(), peer), dist.P2POp(dist.irecv, got_small, peer)]
        reqs = dist.batch_isend_irecv(ops)
        assert len(reqs) == len(ops)
        assert reqs[1].wait(timeout=datetime.timedelta(seconds=60))  # torch's Work.wait(timeout=) spelling
        for r in reqs:
            r.wait()
            assert r.is_completed()
        out["batch"] = (got, got_ints, got_small)
        # async single ops: get_future's value is the decoded tensor list
        buf = torch.empty(4096)
        if rank == 0:
            h = dist.isend(mine, 1)
            fut = h.get_future()
        else:
            h = dist.irecv(buf, 0)
            fut = h.get_future()
        fut.wait()
        out["future_is_output"] = rank == 0 or fut.value()[0] is buf
        h.wait()
        out["irecv"] = buf
        # wait(timeout=) on a receive whose send has not been posted yet: a typed error, then it completes
        late = torch.empty(4096)
        if rank == 1:
            h = dist.irecv(late, 0)
            try:
                h.wait(timeout=0.3)
                out["timed_out"] = False
            except ccoll.errors.TransportError as e:
                out["timed_out"] = "not complete" in str(e)
            dist.barrier()
            h.wait()
        else:
            dist.barrier()
            dist.isend(mine, 1).wait()
            out["timed_out"] = True
        out["late"] = late
        for r in dist.batch_isend_irecv(early):  # P2POps built before install still batch (and compress)
            r.wait()
        out["early"] = got_early
        # every compressed async spelling: a Work-shaped handle whose future's value is torch's: [output], and for
        # the all-gathers one view of ``output`` per rank (what gloo's all_gather_into_tensor future holds)
        futures_ok = {}
        for name, output, args in (
            ("all_gather_into_tensor", torch.empty(2 * 4096), (mine,)), ("all_gather_single", torch.empty(2 * 4096), (mine,)),
            ("_all_gather_base", torch.empty(2 * 4096), (mine,)), ("reduce_scatter_tensor", torch.empty(2048), (mine,)),
            ("reduce_scatter_single", torch.empty(2048), (mine,)), ("_reduce_scatter_base", torch.empty(2048), (mine,)),
            ("all_to_all_single", torch.empty(4096), (mine,)), ("broadcast", mine.clone(), (0,)),
        ):
            h = getattr(dist, name)(output, *args, async_op=True)
            value = h.get_future().wait()
            if "all_gather" in name:
                chunk = output.numel() // 2
                shaped = len(value) == 2 and all(v.data_ptr() == output[i * chunk:].data_ptr() and v.numel() == chunk
                                                 for i, v in enumerate(value))
            else:
                shaped = len(value) == 1 and value[0] is output
            futures_ok[name] = shaped and h.is_completed() and h.wait()
        out["futures_ok"] = futures_ok
        t = mine.clone()
        h = dist.all_reduce(t, async_op=True)
        assert h.wait(timeout=datetime.timedelta(seconds=60))
        value = h.get_future().wait()
        out["all_reduce_future"] = value[0] is t and h.is_completed()
        out["all_reduce"] = t
    out["stats"] = {(r["op"], r["codec"]): r["calls"] for r in ccoll.stats()}
    out["mine"] = mine
    # torch's send/recv call its isend/irecv (ccoll's too while installed): one call is counted once
    ccoll.reset_stats()
    with patch.installed(Policy.from_dict({"version": 1, "default": {"codec": "native"}})):
        if rank == 0:
            dist.send(mine, 1)
        else:
            dist.recv(torch.empty(4096), 0)
    out["native_p2p_stats"] = {(r["op"], r["codec"]): r["calls"] for r in ccoll.stats()}
    return out


def _stage(stage_index: int, hidden: int, seed: int):
    import torch

    torch.manual_seed(seed)
    layers = [torch.nn.Linear(hidden, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
              torch.nn.Linear(hidden, 4)]
    full = torch.nn.Sequential(*layers)
    return torch.nn.Sequential(*list(full)[:2]) if stage_index == 0 else torch.nn.Sequential(*list(full)[2:])


def _job_pipelining(rank: int, world: int, schedule: str, policy: dict | None):
    """Two pipeline stages (ranks 0, 1), 3 optimizer steps of 4 microbatches; pp traffic resolved to "pp"."""
    import torch

    import ccoll
    import ccoll.patch as patch
    from ccoll import Policy
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    hidden, batch, micro = 64, 16, 4
    model = _stage(rank, hidden, seed=11)
    stage = PipelineStage(model, rank, world, torch.device("cpu"))
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    sched = cls(stage, n_microbatches=micro, loss_fn=torch.nn.functional.mse_loss)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if policy is not None:
        patch.install(Policy.from_dict(policy), resolver=lambda group, op: "pp" if op == "send_recv" else None)
    ccoll.reset_stats()
    losses_per_step = []
    try:
        for step in range(3):
            g = torch.Generator().manual_seed(100 + step)
            x, y = torch.randn(batch, hidden, generator=g), torch.randn(batch, 4, generator=g)
            opt.zero_grad()
            losses: list = []
            if rank == 0:
                sched.step(x)
            else:
                sched.step(target=y, losses=losses)
                losses_per_step.append([float(v.detach()) for v in losses])
            opt.step()
    finally:
        patch.uninstall()
    stats = {(r["dim"], r["op"], r["codec"]): (r["calls"], r["raw_bytes"], r["wire_bytes"]) for r in ccoll.stats()}
    return {"losses": losses_per_step, "stats": stats}


def _job_ddp_default_hooks(rank: int, world: int, hook_name: str, policy: dict | None):
    """torch's DDP with its own comm hook (allreduce_hook / fp16_compress_hook) while the patch compresses
    the hook's dist.all_reduce calls."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    import ccoll
    import ccoll.patch as patch
    from ccoll import Policy

    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(None, getattr(default_hooks, hook_name))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    if policy is not None:
        patch.install(Policy.from_dict(policy))
    ccoll.reset_stats()
    losses = []
    try:
        for step in range(4):
            g = torch.Generator().manual_seed(step * 10 + rank)
            x = torch.randn(16, 32, generator=g)
            y = x[:, :1] * 0.5
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    finally:
        patch.uninstall()
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(params) for _ in range(world)]
    dist.all_gather(gathered, params)
    stats = {(r["op"], r["codec"]): r["calls"] for r in ccoll.stats()}
    return {"losses": losses, "params": params, "replicas_equal": all(torch.equal(g, params) for g in gathered),
            "stats": stats}


def _job_contracts(rank: int, world: int):
    """Every check in one gloo group (starting ranks costs more than the checks)."""
    out = {"p2pop": _job_p2pop(rank, world)}
    for schedule in ("gpipe", "1f1b"):
        for name, policy in (("native", None), ("int8", INT8_PP)):
            out[f"pp_{schedule}_{name}"] = _job_pipelining(rank, world, schedule, policy)
    for hook in ("allreduce_hook", "fp16_compress_hook"):
        for name, policy in (("native", None), ("int8", INT8_ALL)):
            out[f"ddp_{hook}_{name}"] = _job_ddp_default_hooks(rank, world, hook, policy)
    return out


@pytest.fixture(scope="module")
def results():
    return run_gloo(2, _job_contracts, timeout_s=240)


def test_given_patch_compressing_when_batch_isend_irecv_with_p2pop_expect_decoded_values_and_work_shaped_handles(results):
    import torch

    for rank, r in enumerate(results):
        o = r["p2pop"]
        theirs = results[1 - rank]["p2pop"]["mine"]
        got, got_ints, got_small = o["batch"]
        assert torch.allclose(got, theirs, rtol=2 ** -7, atol=1e-6) and not torch.equal(got, theirs)  # via bf16
        assert torch.equal(got_ints, torch.arange(1000) * (2 - rank))  # ints: exact
        assert torch.equal(got_small, theirs[:8])  # below min_bytes: exact
        assert o["future_is_output"] and o["all_reduce_future"]
        assert all(o["futures_ok"].values()) and len(o["futures_ok"]) == 8, o["futures_ok"]
        assert torch.allclose(o["early"], theirs, rtol=2 ** -7, atol=1e-6) and not torch.equal(o["early"], theirs)
        assert torch.equal(o["all_reduce"], results[1 - rank]["p2pop"]["all_reduce"])
        st = o["stats"]
        assert st[("send", "bf16")] == 2 + 2 * (rank == 0) and st[("recv", "bf16")] == 2 + 2 * (rank == 1), st
        assert st[("send", "native")] == 2 and st[("recv", "native")] == 2, st  # ints + small
        assert o["native_p2p_stats"] == {("send" if rank == 0 else "recv", "native"): 1}, o["native_p2p_stats"]
    assert torch.allclose(results[1]["p2pop"]["irecv"], results[0]["p2pop"]["mine"], rtol=2 ** -7, atol=1e-6)
    assert results[1]["p2pop"]["timed_out"] and torch.equal(results[1]["p2pop"]["late"], results[1]["p2pop"]["irecv"])


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_given_torch_pipelining_when_patch_compresses_pp_expect_losses_close_and_send_recv_compressed(results, schedule):
    native = results[1][f"pp_{schedule}_native"]
    ours = results[1][f"pp_{schedule}_int8"]
    assert len(native["losses"]) == len(ours["losses"]) == 3
    for a_step, b_step in zip(native["losses"], ours["losses"]):
        assert len(a_step) == len(b_step) == 4  # one loss per microbatch
        for a, b in zip(a_step, b_step):
            assert abs(a - b) <= 0.02 * abs(a) + 1e-4, (a, b)
    assert native["losses"] != ours["losses"]  # activations and gradients really went through int8
    for rank, r in enumerate(results):
        st = {(dim, op, codec.split(":")[0]): v for (dim, op, codec), v in r[f"pp_{schedule}_int8"]["stats"].items()}
        op = "send" if rank == 0 else "recv"  # forward activations: 3 steps x 4 microbatches
        calls, raw, wire = st[("pp", op, "int8")]
        assert calls == 12 and wire * 3 < raw, st
        back = "recv" if rank == 0 else "send"  # input gradients flow back
        assert st[("pp", back, "int8")][0] == 12, st


@pytest.mark.parametrize("hook", ["allreduce_hook", "fp16_compress_hook"])
def test_given_ddp_with_torch_default_hook_when_patch_compresses_expect_training_close_and_replicas_identical(results, hook):
    import torch

    for rank, r in enumerate(results):
        native, ours = r[f"ddp_{hook}_native"], r[f"ddp_{hook}_int8"]
        assert ours["replicas_equal"] and native["replicas_equal"]
        assert torch.allclose(ours["params"], native["params"], atol=5e-3)
        assert not torch.equal(ours["params"], native["params"])
        for a, b in zip(native["losses"], ours["losses"]):
            assert abs(a - b) <= 0.02 * abs(a) + 1e-4
        st = {(op, codec.split(":")[0]): n for (op, codec), n in ours["stats"].items()}
        assert st.get(("all_reduce", "int8"), 0) == 4, st  # one bucket per step, compressed
        assert not native["stats"]
