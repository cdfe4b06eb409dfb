"""ccoll.fsdp.compress on real FSDP2 (``fully_shard``, CPU + gloo) against the uncompressed run: 1-D FSDP
on 2 ranks (compressed reduce-scatter, optionally compressed all-gather) and HSDP on a 2x2 mesh."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch import run_gloo  # noqa: E402

pytestmark = pytest.mark.slow  # several trainings in fresh gloo groups: ~1-2 min on the loaded 2-core machine

STEPS = 5


def _run(rank: int, mesh, compress_kwargs: dict | None):
    """Three sharded Linear layers + root; returns (losses, full parameters, stats rows)."""
    import torch
    from torch.distributed.fsdp import fully_shard

    import ccoll
    import ccoll.fsdp

    torch.manual_seed(9)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.Tanh(), torch.nn.Linear(128, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 1))
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    comp = ccoll.fsdp.compress(model, **compress_kwargs) if compress_kwargs is not None else None
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ccoll.reset_stats()
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(16, 32, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), torch.sin(x[:, :1]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    full = torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()])
    stats = {(r["dim"], r["op"], r["codec"].split(":")[0]): (r["calls"], r["raw_bytes"], r["wire_bytes"])
             for r in ccoll.stats()}
    return {"losses": losses, "params": full, "stats": stats, "modules": None if comp is None else comp.modules,
            "state_keys": None if comp is None else sorted({k[0] for k in comp.feedback.keys()})}


def _job_fsdp(rank: int, world: int):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    return {"plain": _run(rank, mesh, None),
            "int8": _run(rank, mesh, {"codec": "int8:block=64", "min_bytes": 0}),
            "int8_bf16_ag": _run(rank, mesh, {"codec": "int8:block=64", "all_gather_codec": "bf16", "min_bytes": 0})}


def _job_hsdp(rank: int, world: int):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    return {"plain": _run(rank, mesh, None), "int8": _run(rank, mesh, {"codec": "int8:block=64", "min_bytes": 0})}


def _check_close(plain: dict, ours: dict) -> None:
    import torch

    for a, b in zip(plain["losses"], ours["losses"]):
        assert abs(a - b) <= 0.03 * abs(a) + 1e-3, (plain["losses"], ours["losses"])
    assert torch.allclose(plain["params"], ours["params"], atol=1e-2)
    assert not torch.equal(plain["params"], ours["params"])


@pytest.fixture(scope="module")
def fsdp_results():
    return run_gloo(2, _job_fsdp, timeout_s=240)


def test_given_fully_shard_when_compressed_reduce_scatter_expect_loss_close_and_stats_under_dp(fsdp_results):
    import torch

    for r in fsdp_results:
        _check_close(r["plain"], r["int8"])
        st = r["int8"]["stats"]
        calls, raw, wire = st[("dp", "reduce_scatter", "int8")]
        assert calls == 3 * STEPS and 3.0 < raw / wire < 4.0, st  # one per layer and step (the root holds none)
        assert ("dp", "reduce_scatter", "native") not in st
        assert r["int8"]["modules"] == ["<root>", "0", "2", "4"]
        assert r["int8"]["state_keys"] == ["0", "2", "4"]  # error feedback per module that has parameters
        assert not r["plain"]["stats"]  # without compress(): FSDP's own collectives, ccoll not involved
    # every rank holds the same full parameters after the compressed steps
    assert torch.equal(fsdp_results[0]["int8"]["params"], fsdp_results[1]["int8"]["params"])


def test_given_fully_shard_when_all_gather_also_compressed_expect_bf16_all_gather_and_training_close(fsdp_results):
    for r in fsdp_results:
        _check_close(r["plain"], r["int8_bf16_ag"])
        st = r["int8_bf16_ag"]["stats"]
        calls, raw, wire = st[("dp", "all_gather", "bf16")]
        assert calls >= 3 * STEPS and raw == 2 * wire, st


def test_given_hsdp_on_2x2_mesh_when_compressed_reduce_scatter_expect_loss_close_and_replicas_identical():
    import torch

    results = run_gloo(4, _job_hsdp, timeout_s=300)
    for r in results:
        _check_close(r["plain"], r["int8"])
        assert r["int8"]["stats"][("dp", "reduce_scatter", "int8")][0] >= 3 * STEPS
    assert all(torch.equal(r["int8"]["params"], results[0]["int8"]["params"]) for r in results)
