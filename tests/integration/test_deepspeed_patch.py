"""ccoll.patch on real DeepSpeed engines: 4 gloo ranks on CPU (DS_ACCELERATOR=cpu), fp32.

Two spawned jobs, each trains a few steps per policy in the same processes (same seeds each time):
- pipeline 2 x data 2: a DeepSpeed PipelineModule with ZeRO-1; the stage boundary carries a hidden
  state and a bool attention mask (the engine's GPT-NeoX mode sends it as float16);
- tensor 2 x data 2: Megatron-style column/row-parallel linear layers whose all-reduces run on TP groups
  built from DeepSpeed's topology (PipelineParallelGrid), DP by a DeepSpeed engine with ZeRO-2.
Policies: unpatched, configs/baseline.yaml (must be bit-identical to unpatched), configs/hybrid.yaml,
and (pipeline) hybrid with the ZeRO-1 parameter all-gather compressed too (replicas must stay identical).
Every policy is installed the way a user writes it first -- ``ccoll.patch.install(policy)``, no resolver,
before ``deepspeed.initialize`` -- so the automatic resolver has to find DeepSpeed's groups by itself
(its PipelineParallelGrid / the mpu passed to initialize). The explicit TopologyResolver is used once, for
the exclusion check on raw WORLD send/recv.
"""
from __future__ import annotations

import math
import pathlib
import sys

import pytest

pytestmark = pytest.mark.slow

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "dist"))
from launch import run_gloo  # noqa: E402

CONFIGS = HERE.parents[1] / "configs"
ENV = {"DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0"}
STEPS = 3
SEQ, HIDDEN, MICRO, GAS = 32, 64, 4, 2
DP_ALL_GATHER_INT8 = "int8:block=64"


def _spec(s: str) -> str:
    """Canonical spec as stats report it (defaults spelled out)."""
    from ccoll import get_codec

    return get_codec(s).spec


INT4_64, INT8_256 = _spec("int4:block=64"), _spec("int8:block=256")  # what configs/hybrid.yaml names


def _policies():
    import yaml

    hybrid = yaml.safe_load((CONFIGS / "hybrid.yaml").read_text())
    hybrid["dp"]["ops"]["all_gather"] = {"codec": DP_ALL_GATHER_INT8}
    return [("unpatched", None), ("baseline", str(CONFIGS / "baseline.yaml")), ("hybrid", str(CONFIGS / "hybrid.yaml")),
            ("hybrid_zero_all_gather", hybrid)]


def _flat_params(module):
    import torch

    return torch.cat([p.detach().reshape(-1).clone() for p in module.parameters()])


def _replicas_identical(flat, dp_group) -> bool:
    """Bit-wise comparison across DP ranks through the list all_gather (kept exact by ccoll)."""
    import torch
    import torch.distributed as dist

    got = [torch.empty_like(flat) for _ in range(dist.get_world_size(dp_group))]
    dist.all_gather(got, flat, group=dp_group)
    return all(torch.equal(g.view(torch.int32), got[0].view(torch.int32)) for g in got)


def _run_policies(policies, resolver, train):
    """train() -> dict of per-run results; each run under its policy, stats reset before it."""
    import deepspeed.comm.comm as ds_comm
    import torch.distributed as dist

    import ccoll
    import ccoll.patch as patch

    original_ag = ds_comm.cdb.all_gather_function
    out = {}
    for name, policy in policies:
        ccoll.reset_stats()
        if policy is not None:
            patch.install(policy, resolver)
        try:
            res = train()
            # the function TorchBackend cached at init is rebound while installed, restored after
            res["cdb_rebound"] = (ds_comm.cdb.all_gather_function is dist.all_gather_into_tensor) and \
                (policy is None or ds_comm.cdb.all_gather_function is not original_ag)
        finally:
            patch.uninstall()
        res["cdb_restored"] = ds_comm.cdb.all_gather_function is original_ag
        res["stats"] = ccoll.stats()
        out[name] = res
    return out


# --- pipeline 2 x data 2 ---------------------------------------------------------------------------------
def _pipe_job(rank: int, world: int):
    import deepspeed
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from deepspeed.pipe import LayerSpec, PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    from ccoll.resolvers import TopologyResolver

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    topo = PipeModelDataParallelTopology(num_pp=2, num_mp=1, num_dp=2)
    coord = topo.get_coord(rank)
    mask = torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool)).view(1, 1, SEQ, SEQ)
    mask_ok = []

    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, HIDDEN)

        def forward(self, x):
            return torch.tanh(self.lin(x)), mask.clone()

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(HIDDEN, HIDDEN)

        def forward(self, inputs):
            h, m = inputs
            mask_ok.append(m.dtype == torch.bool and torch.equal(m, mask))
            return h + torch.tanh(self.lin(h)), m

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(HIDDEN, 8)

        def forward(self, inputs):
            return self.lin(inputs[0])

    def batches():
        g = torch.Generator().manual_seed(100 + coord.data)  # both stages of a replica see the same data
        while True:
            x = torch.randn(MICRO, SEQ, 16, generator=g)
            yield x, torch.sin(x[..., :8] * 3)

    def train():
        torch.manual_seed(0)
        net = PipelineModule(layers=[LayerSpec(Embed), LayerSpec(Block), LayerSpec(Block), LayerSpec(Head)],
                             topology=topo, loss_fn=nn.functional.mse_loss, partition_method="uniform")
        cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
               "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True,
               "steps_per_print": 10 ** 9}
        engine, _, _, _ = deepspeed.initialize(model=net, optimizer=torch.optim.AdamW(net.parameters(), lr=1e-2),
                                               config=cfg)
        engine.set_has_attention_mask(True)  # GPT-NeoX's mode: last activation is a mask, sent as float16
        data = batches()
        losses = [engine.train_batch(data_iter=data).item() for _ in range(STEPS)]
        flat = _flat_params(engine.module)
        return {"losses": losses, "params": flat, "replicas_identical": _replicas_identical(flat, engine.grid.get_data_parallel_group()),
                "mask_ok": bool(mask_ok) and all(mask_ok)}

    results = _run_policies(_policies(), None, train)  # None: automatic resolution

    # the exclusion rule itself on WORLD p2p (= PP): a float16 tensor arrives bit-exact, fp32 is int8
    import ccoll.patch as patch

    peer = topo.get_rank(pipe=1 - coord.pipe, data=coord.data, model=0)
    g = torch.Generator().manual_seed(7)
    # fp32 of 8 KiB: at ccoll.defaults.DEFAULT_MIN_BYTES, so compressed
    half, full = torch.randn(1, 1, SEQ, SEQ, generator=g).half(), torch.randn(1, 2, SEQ, SEQ, generator=g)
    with patch.installed(str(CONFIGS / "hybrid.yaml"), TopologyResolver(topo)):
        if coord.pipe == 0:
            dist.send(half, peer)
            dist.send(full, peer)
        else:
            h2, f2 = torch.empty_like(half), torch.empty_like(full)
            dist.recv(h2, peer)
            dist.recv(f2, peer)
            results["p2p_half_exact"] = torch.equal(h2.view(torch.int16), half.view(torch.int16))
            results["p2p_fp32_compressed"] = (not torch.equal(f2, full)) and torch.allclose(f2, full, atol=0.05)
    for r in results.values():
        if isinstance(r, dict):
            r.pop("params", None)
    results["coord"] = {"pipe": coord.pipe, "data": coord.data}
    return results


@pytest.fixture(scope="module")
def pipe_results():
    return run_gloo(4, _pipe_job, timeout_s=300, env=ENV)


def _rows(stats, dim=None, op=None, codec=None):
    return [r for r in stats if (dim is None or r["dim"] == dim) and (op is None or r["op"] == op)
            and (codec is None or r["codec"] == codec)]


def _calls(stats, **kw) -> int:
    return sum(r["calls"] for r in _rows(stats, **kw))


def _ratio(stats, dim, codec) -> float:
    """raw / wire bytes of one dimension's traffic under one codec (the codec's compression ratio)."""
    rows = _rows(stats, dim=dim, codec=codec)
    return sum(r["raw_bytes"] for r in rows) / max(1, sum(r["wire_bytes"] for r in rows))


def test_given_pipeline_2x_data_2_when_baseline_patched_expect_losses_bit_identical_to_unpatched(pipe_results):
    for res in pipe_results:
        assert res["unpatched"]["losses"] == res["baseline"]["losses"]
        assert all(math.isfinite(x) for x in res["unpatched"]["losses"])
        st = res["baseline"]["stats"]
        assert st and {r["codec"] for r in st} == {"native"}  # all traffic seen, nothing compressed
        assert _calls(st, dim="dp", op="all_reduce") > 0 and _calls(st, dim="pp") > 0


def _report(layout: str, res: dict) -> None:
    """Rank 0's hybrid wire ratios and final-loss delta against the unpatched run (shown with pytest -s)."""
    st = res["hybrid"]["stats"]
    ratios = {d: round(_ratio(st, d, c), 2) for d, c in (("dp", INT4_64), ("tp", INT8_256), ("pp", INT8_256))
              if _rows(st, dim=d, codec=c)}
    a, b = res["hybrid"]["losses"][-1], res["unpatched"]["losses"][-1]
    print(f"\nDeepSpeed {layout}: hybrid wire ratios {ratios}; final loss {a:.5f} vs {b:.5f} unpatched ({a - b:+.5f})")


def test_given_pipeline_2x_data_2_when_hybrid_expect_dp_int4_pp_int8_mask_exact_and_replicas_identical(pipe_results):
    _report("PP2xDP2 ZeRO-1", pipe_results[0])
    for res in pipe_results:
        run = res["hybrid"]
        st = run["stats"]
        assert all(math.isfinite(x) for x in run["losses"]), run["losses"]
        assert _calls(st, dim="dp", op="all_reduce", codec=INT4_64) >= STEPS  # gradient buckets
        assert _calls(st, dim="dp", op="all_gather", codec="native") >= STEPS  # ZeRO-1 params stay exact
        p2p_op = "send" if res["coord"]["pipe"] == 0 else "recv"
        assert _calls(st, dim="pp", op=p2p_op, codec=INT8_256) >= STEPS * GAS  # activations
        # the float16 mask (SEQ*SEQ*2 bytes) went native, once per micro-batch
        mask_bytes = str(SEQ * SEQ * 2)
        native_pp = _rows(st, dim="pp", op=p2p_op, codec="native")
        assert sum(r["histogram"].get(mask_bytes, 0) for r in native_pp) == STEPS * GAS
        assert not _rows(st, dim="tp")
        for r in _rows(st, codec=INT4_64) + _rows(st, codec=INT8_256):
            assert r["wire_bytes"] * 3 < r["raw_bytes"], r
        assert _ratio(st, "dp", INT4_64) == pytest.approx(32 / 4.5, rel=0.05)
        assert _ratio(st, "pp", INT8_256) == pytest.approx(32 / 8.125, rel=0.02)
        assert run["mask_ok"] and run["replicas_identical"]
        assert run["cdb_rebound"] and run["cdb_restored"]
    assert all(r["p2p_half_exact"] and r["p2p_fp32_compressed"] for r in pipe_results if "p2p_half_exact" in r)


def test_given_zero1_param_all_gather_compressed_when_training_expect_replicas_bit_identical(pipe_results):
    for res in pipe_results:
        run = res["hybrid_zero_all_gather"]
        assert _calls(run["stats"], dim="dp", op="all_gather", codec=_spec(DP_ALL_GATHER_INT8)) >= STEPS
        assert run["replicas_identical"]
        assert all(math.isfinite(x) for x in run["losses"])
        assert run["losses"] != res["unpatched"]["losses"]  # compression really changed the numbers


# --- tensor 2 x data 2 -----------------------------------------------------------------------------------
def _tp_job(rank: int, world: int):
    import deepspeed
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology, PipelineParallelGrid

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    topo = PipeModelDataParallelTopology(num_pp=1, num_mp=2, num_dp=2)
    grid = PipelineParallelGrid(topology=topo)  # builds dp / tp (slice) groups; also DeepSpeed's mpu
    tp_group, tp_size = grid.get_slice_parallel_group(), grid.get_slice_parallel_world_size()
    tp_rank, dp_rank = grid.get_slice_parallel_rank(), grid.get_data_parallel_id()

    class CopyToTP(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            g = g.contiguous()
            dist.all_reduce(g, group=tp_group)
            return g

    class ReduceFromTP(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x = x.contiguous()
            dist.all_reduce(x, group=tp_group)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    class TPMLP(nn.Module):
        """Column-parallel (H -> F/tp) then row-parallel (F/tp -> H), Megatron style."""

        def __init__(self, seed, ffn=4 * HIDDEN):
            super().__init__()
            g = torch.Generator().manual_seed(seed)
            w1, w2 = torch.randn(ffn, HIDDEN, generator=g) * 0.1, torch.randn(HIDDEN, ffn, generator=g) * 0.1
            part = ffn // tp_size
            self.w1 = nn.Parameter(w1[tp_rank * part:(tp_rank + 1) * part].clone())
            self.b1 = nn.Parameter(torch.zeros(part))
            self.w2 = nn.Parameter(w2[:, tp_rank * part:(tp_rank + 1) * part].clone())
            self.b2 = nn.Parameter(torch.zeros(HIDDEN))

        def forward(self, x):
            h = torch.nn.functional.gelu(CopyToTP.apply(x) @ self.w1.t() + self.b1)
            return x + ReduceFromTP.apply(h @ self.w2.t()) + self.b2

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.Sequential(TPMLP(1), TPMLP(2))

        def forward(self, x, y):
            return nn.functional.mse_loss(self.blocks(x), y)

    def train():
        net = Net()
        cfg = {"train_micro_batch_size_per_gpu": MICRO * SEQ, "gradient_accumulation_steps": 1,
               "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True, "steps_per_print": 10 ** 9}
        engine, _, _, _ = deepspeed.initialize(model=net, optimizer=torch.optim.AdamW(net.parameters(), lr=1e-2),
                                               config=cfg, mpu=grid)
        g = torch.Generator().manual_seed(200 + dp_rank)  # TP ranks of a replica share the batch
        losses = []
        for _ in range(STEPS):
            x = torch.randn(MICRO * SEQ, HIDDEN, generator=g)
            loss = engine(x, torch.tanh(x.flip(-1)))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        flat = _flat_params(engine.module)
        return {"losses": losses, "replicas_identical": _replicas_identical(flat, grid.get_data_parallel_group())}

    results = _run_policies(_policies()[:3], None, train)  # None: automatic resolution (the mpu passed to initialize)
    results["coord"] = {"tp": tp_rank, "data": dp_rank}
    return results


@pytest.fixture(scope="module")
def tp_results():
    return run_gloo(4, _tp_job, timeout_s=300, env=ENV)


def test_given_tensor_2x_data_2_when_baseline_patched_expect_losses_bit_identical_to_unpatched(tp_results):
    for res in tp_results:
        assert res["unpatched"]["losses"] == res["baseline"]["losses"]
        assert {r["codec"] for r in res["baseline"]["stats"]} == {"native"}
        assert _calls(res["baseline"]["stats"], dim="tp", op="all_reduce") > 0


def test_given_tensor_2x_data_2_when_hybrid_expect_tp_int8_dp_int4_and_identical_replicas(tp_results):
    _report("TP2xDP2 ZeRO-2", tp_results[0])
    for res in tp_results:
        run = res["hybrid"]
        st = run["stats"]
        assert all(math.isfinite(x) for x in run["losses"])
        # per step: 2 forward row-parallel reduces + 1 backward column-parallel reduce (the first block's
        # input needs no gradient); the tp-group scalar reductions (grad norm) stay native
        assert _calls(st, dim="tp", op="all_reduce", codec=INT8_256) == 3 * STEPS
        assert _ratio(st, "tp", INT8_256) == pytest.approx(32 / 8.125, rel=0.02)
        assert _ratio(st, "dp", INT4_64) == pytest.approx(32 / 4.5, rel=0.05)
        assert all(r["histogram"] == {"4": r["calls"]} for r in _rows(st, dim="tp", codec="native"))
        assert _calls(st, dim="dp", op="all_reduce", codec=INT4_64) >= STEPS
        assert not _rows(st, dim="pp")
        assert run["replicas_identical"] and run["cdb_rebound"] and run["cdb_restored"]
    # TP ranks of one replica see the same (compressed, bit-identical) activations, hence the same loss
    by_dp = {}
    for res in tp_results:
        by_dp.setdefault(res["coord"]["data"], []).append(res["hybrid"]["losses"])
    assert all(a == b for a, b in by_dp.values())
