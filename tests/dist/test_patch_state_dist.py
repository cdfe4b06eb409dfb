"""ccoll.patch.state_dict / load_state_dict on real gloo ranks: a data-parallel loop whose gradient
all_reduce the patch compresses (int4 stochastic rounding + error feedback) resumed from a checkpoint in
fresh processes ends bit-identical to the uninterrupted run; without the ccoll state it does not."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch import run_gloo  # noqa: E402

pytestmark = pytest.mark.slow  # several trainings in fresh gloo groups: ~1-2 min on the loaded 2-core machine

POLICY = {"version": 1, "dp": {"codec": "int4:block=64,round=stochastic", "min_bytes": 0, "error_feedback": True}}


def _train(rank: int, steps: range, ckpt_in: str | None = None, ckpt_out: str | None = None, load_ccoll: bool = True):
    import torch
    import torch.distributed as dist

    import ccoll.patch as patch
    from ccoll import Policy

    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    patch.install(Policy.from_dict(POLICY), resolver=lambda group, op: "dp")
    try:
        if ckpt_in is not None:
            saved = torch.load(ckpt_in, weights_only=False)
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["optim"])
            if load_ccoll:
                patch.load_state_dict(saved["ccoll"])
        for step in steps:
            g = torch.Generator().manual_seed(100 * step + rank)
            x = torch.randn(32, 16, generator=g)
            loss = torch.nn.functional.mse_loss(model(x), torch.cos(x[:, :1]))
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():  # one all_reduce per parameter, as a hand-written DP loop does
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
            opt.step()
        if ckpt_out is not None:
            torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "ccoll": patch.state_dict()}, ckpt_out)
        residuals = len(patch._STATE.feedback)
    finally:
        patch.uninstall()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), residuals


def _job_first(rank: int, world: int, ckpt_dir: str):
    full = _train(rank, range(6))
    _train(rank, range(3), ckpt_out=os.path.join(ckpt_dir, f"rank{rank}.pt"))
    return full


def _job_resume(rank: int, world: int, ckpt_dir: str):
    path = os.path.join(ckpt_dir, f"rank{rank}.pt")
    return _train(rank, range(3, 6), ckpt_in=path), _train(rank, range(3, 6), ckpt_in=path, load_ccoll=False)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    ckpt = str(tmp_path_factory.mktemp("ckpt"))
    return run_gloo(2, _job_first, ckpt, timeout_s=180), run_gloo(2, _job_resume, ckpt, timeout_s=180)


def test_given_patch_checkpoint_when_resumed_in_fresh_processes_expect_bit_identical_to_uninterrupted(results):
    import torch

    first, resumed = results
    for rank in range(2):
        (full_params, residuals), ((params, _), (without, _)) = first[rank], resumed[rank]
        assert residuals > 0  # error feedback was active
        assert torch.equal(params, full_params)
        assert not torch.equal(without, full_params)  # the residuals and step count are what make it exact
