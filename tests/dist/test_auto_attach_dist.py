"""ccoll.auto on real gloo ranks: DDP and FSDP2 models built while ccoll.patch is installed get ccoll's
hooks; their error feedback lives in ``ccoll.patch.state_dict()``, so a run resumed in fresh processes
(model, optimizer and that one dict from the checkpoint) ends bit-identical to the uninterrupted run; a
user's DDP hook registered after the first forward replaces ccoll's."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch import run_gloo  # noqa: E402

pytestmark = pytest.mark.slow  # four short trainings per job in fresh gloo groups

# stochastic rounding + error feedback: both the salts (steps) and the residuals must survive the resume
POLICY = {"version": 1, "dp": {"codec": "int4:block=64,round=stochastic", "error_feedback": True, "min_bytes": 0}}


def _model(stack: str, world: int):
    import torch

    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    if stack == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    fully_shard(model[0], mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _train(rank: int, world: int, stack: str, steps: range, ckpt_in=None, ckpt_out=None, load_ccoll=True):
    import torch

    import ccoll
    import ccoll.auto
    import ccoll.patch as patch
    from ccoll import Policy

    ccoll.auto.reset()  # each training stands for a fresh process: models are numbered from 0
    ccoll.reset_stats()
    patch.install(Policy.from_dict(POLICY))
    try:
        model = _model(stack, world)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        if ckpt_in is not None:
            saved = torch.load(ckpt_in, weights_only=False)
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["optim"])
            if load_ccoll:
                patch.load_state_dict(saved["ccoll"])  # the one call a resumed zero-code run needs
        for step in steps:
            x = torch.randn(32, 16, generator=torch.Generator().manual_seed(100 * step + rank))
            loss = torch.nn.functional.mse_loss(model(x), torch.cos(x[:, :8]))
            opt.zero_grad()
            loss.backward()
            opt.step()
        if ckpt_out is not None:
            torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "ccoll": patch.state_dict()}, ckpt_out)
        status = [m.status for m in ccoll.auto.attached()]
        ops = sorted({r["op"] for r in ccoll.stats() if r["dim"] == "dp" and r["codec"] != "native"})
        assert ops == (["all_reduce"] if stack == "ddp" else ["all_gather", "reduce_scatter"]), ops  # dp's rules
    finally:
        patch.uninstall()
    params = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
    return torch.cat([p.detach().reshape(-1) for p in params]), status


def _job_first(rank: int, world: int, stack: str, ckpt_dir: str):
    full = _train(rank, world, stack, range(6))
    _train(rank, world, stack, range(3), ckpt_out=os.path.join(ckpt_dir, f"{stack}{rank}.pt"))
    return full


def _job_resume(rank: int, world: int, stack: str, ckpt_dir: str):
    path = os.path.join(ckpt_dir, f"{stack}{rank}.pt")
    return (_train(rank, world, stack, range(3, 6), ckpt_in=path),
            _train(rank, world, stack, range(3, 6), ckpt_in=path, load_ccoll=False))


@pytest.mark.parametrize("stack", ["ddp", "fsdp"])
def test_given_auto_attached_model_when_resumed_in_fresh_processes_expect_bit_identical(tmp_path, stack):
    import torch

    first = run_gloo(2, _job_first, stack, str(tmp_path), timeout_s=180)
    resumed = run_gloo(2, _job_resume, stack, str(tmp_path), timeout_s=180)
    for (full, status), ((again, status2), (without, _)) in zip(first, resumed):
        assert status == status2 == ["compressing"]
        assert torch.equal(full, again)
        assert not torch.equal(full, without)  # the residuals and salts mattered


def _job_user_hook_after_forward(rank: int, world: int):
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    import ccoll
    import ccoll.auto
    import ccoll.patch as patch
    from ccoll import Policy

    ccoll.auto.reset()
    calls = []

    def my_hook(state, bucket):
        calls.append(1)
        return default_hooks.allreduce_hook(state, bucket)

    with patch.installed(Policy.from_dict(POLICY)):
        model = _model("ddp", world)
        x = torch.randn(8, 16)
        model(x).sum().backward()  # ccoll's hook attached at this forward and compressing
        ccoll.reset_stats()
        model.register_comm_hook(None, my_hook)  # DDP takes one registration: ccoll passes the buckets on
        model(x).sum().backward()
        compressed = [r for r in ccoll.stats() if r["codec"] != "native"]
        return len(calls), compressed, [m.status for m in ccoll.auto.attached()]


def test_given_user_hook_registered_after_first_forward_when_training_expect_user_hook_runs_instead():
    for calls, compressed, status in run_gloo(2, _job_user_hook_after_forward, timeout_s=120):
        assert calls == 1 and compressed == [] and status == ["user hook"]
