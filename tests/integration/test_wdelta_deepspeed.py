"""Weight-delta parameter all-gather under a real DeepSpeed ZeRO-1 engine: 2 gloo ranks on CPU
(DS_ACCELERATOR=cpu), fp32, pure data parallelism, configs/hybrid_wdelta.yaml installed the way a user
does it (``ccoll.patch.install(path)`` before ``deepspeed.initialize``, automatic resolver).

DeepSpeed's stage_1_and_2 copies each rank's updated fp32 master partition into its slot of the flat
parameter buffer and all-gathers with that slot as input; under the policy what travels is the int8
change against ccoll's reconstruction. Checked after a few steps: replicas bit-identical; each rank's
model weights of its own partition within one delta's quantisation error of its exact fp32 master
(and not equal: the gather really is compressed); the first gather an exact refresh, the rest deltas.
(The loss against an exact run is the convergence runner's job: ``python -m ccoll.convergence``.)"""
from __future__ import annotations

import pathlib
import sys

import pytest

pytestmark = pytest.mark.slow

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "dist"))
from launch import run_gloo  # noqa: E402

CONFIGS = HERE.parents[1] / "configs"
ENV = {"DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0"}
STEPS = 6


def _job(rank: int, world: int):
    import deepspeed
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import ccoll
    import ccoll.patch as patch

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")

    def train(policy):
        ccoll.reset_stats()
        patch.install(policy)
        try:
            torch.manual_seed(0)
            net = nn.Sequential(nn.Linear(32, 96), nn.Tanh(), nn.Linear(96, 96), nn.Tanh(), nn.Linear(96, 8))
            cfg = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
                   "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True,
                   "steps_per_print": 10 ** 9}
            engine, _, _, _ = deepspeed.initialize(model=net, optimizer=torch.optim.AdamW(net.parameters(), lr=1e-2),
                                                   config=cfg)
            x = torch.randn(8, 32, generator=torch.Generator().manual_seed(10 + rank))  # one batch: loss must fall
            losses = []
            for _ in range(STEPS):
                loss = nn.functional.mse_loss(engine(x), torch.sin(x[:, :8] * 2))
                engine.backward(loss)
                engine.step()
                losses.append(loss.item())
            opt = engine.optimizer
            own = opt.parallel_partitioned_bit16_groups[0][rank].detach()
            master = opt.single_partition_of_fp32_groups[0].detach()
            flat = torch.cat([p.detach().reshape(-1) for p in engine.module.parameters()])
            got = [torch.empty_like(flat) for _ in range(world)]
            dist.all_gather(got, flat)  # the list form: exact, counted as all_gather_list
            return {"losses": losses, "identical": all(torch.equal(t, got[0]) for t in got),
                    "master_err": (own - master).abs().max().item(),
                    "stats": {(r["op"], r["codec"]): r["calls"] for r in ccoll.stats() if r["dim"] == "dp"}}
        finally:
            patch.uninstall()

    return train(str(CONFIGS / "hybrid_wdelta.yaml"))


def test_given_zero1_engine_when_hybrid_wdelta_then_replicas_identical_and_weights_track_masters():
    from ccoll import get_codec

    delta_codec = "wdelta/" + get_codec("int8:block=256").spec
    for rank, wd in enumerate(run_gloo(2, _job, timeout_s=600, env=ENV)):
        assert wd["identical"], rank
        # one int8 delta's error: <= 1/254 of a block's largest (update + previous error), AdamW lr 1e-2
        assert 0.0 < wd["master_err"] < 2e-4, wd["master_err"]
        assert wd["stats"][("all_gather", "native")] == 1  # the first gather seeds the reconstruction exactly
        assert wd["stats"][("all_gather", delta_codec)] == STEPS - 1
        assert wd["losses"][-1] < wd["losses"][0], wd["losses"]
