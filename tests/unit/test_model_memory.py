"""ccoll.model.memory: the lower bound of one GPU's training memory, computed by hand; and --published's use of it."""
from __future__ import annotations

import dataclasses

import pytest

from ccoll.model import Layout
from ccoll.model.clusters import Node, load_cluster, node_from_dict
from ccoll.model.memory import CONTEXT_BYTES, GIB, fits, stage_bytes

#: 2 layers over 2 stages, TP 2, DP 2, 4 micro-batches of 2 x 16 tokens, hidden 64, 4 heads, fp16, ZeRO-1
LAY = Layout(layers=2, hidden=64, heads=4, seq=16, vocab=64, micro_batch=2, micro_batches=4, dp=2, tp=2, pp=2,
             dtype="float16")
#: one layer of one micro-batch (Korthikanti eq. 2): s b h (10 + 24/t + 5 a s / (h t)) = 2048 x (10 + 12 + 2.5)
FULL = 16 * 2 * 64 * 24.5


def test_given_fp16_zero1_layout_when_stage_bytes_expect_zero_paper_states_and_1f1b_activations():
    p0, p1 = LAY.stage_params(0), LAY.stage_params(1)
    m = stage_bytes(LAY, 0)
    assert (m["weights"], m["gradients"], m["optimizer"]) == (2 * p0, 2 * p0, 12 * p0 / 2)
    assert m["activations"] == pytest.approx(2 * FULL)  # stage 0: pp - 0 = 2 micro-batches in flight, 1 layer
    assert stage_bytes(LAY, 1)["activations"] == pytest.approx(FULL)  # the last stage: 1 in flight
    # + the CUDA context and one gradient bucket (at most the gradients: DDP's 25 MiB exceeds this toy's)
    assert stage_bytes(LAY, 1)["bucket"] == 2 * p1
    assert stage_bytes(LAY, 1)["total"] == pytest.approx(16 * p1 - 6 * p1 + FULL + CONTEXT_BYTES + 2 * p1)
    # recomputation: each in-flight layer keeps its 2-byte input, 2 s b h, plus one layer's full set
    rec = dataclasses.replace(LAY, recompute=True)
    assert stage_bytes(rec, 0)["activations"] == pytest.approx(2 * 2 * 2048 + FULL)
    # never more in flight than micro-batches
    assert stage_bytes(dataclasses.replace(LAY, micro_batches=1), 0)["activations"] == pytest.approx(FULL)


def test_given_flash_attention_and_sequence_parallel_when_stage_bytes_expect_korthikantis_terms_by_hand():
    """LAY: s 16, b 2, h 64, a 4, t 2, so s b h = 2048 and the score term 5 a s / h = 5 x 4 x 16 / 64 = 5. One layer of
    one micro-batch (Korthikanti et al. 2022), 16-bit:
        neither                 s b h (10 + 24/t + 5/t)   = 2048 x (10 + 12 + 2.5) = 50176   (FULL)
        FlashAttention          s b h (10 + 24/t)         = 2048 x 22              = 45056   (no a s^2 b scores)
        sequence parallelism    s b h / t (34 + 5)        = 1024 x 39              = 39936   (the 10 split over t too)
        both                    s b h / t x 34            = 1024 x 34              = 34816
    Stage 0 holds pp - 0 = 2 micro-batches of its 1 layer; with recomputation each keeps its input, 2 s b h = 4096
    bytes (2 s b h / t = 2048 under sequence parallelism), plus one layer's full set."""
    def acts(stage=0, **kw):
        return stage_bytes(dataclasses.replace(LAY, **kw), stage)["activations"]

    assert FULL == 50176
    assert acts() == pytest.approx(2 * 50176)  # the default is unchanged
    assert acts(flash_attention=True) == pytest.approx(2 * 45056)
    assert acts(sequence_parallel=True) == pytest.approx(2 * 39936)
    assert acts(flash_attention=True, sequence_parallel=True) == pytest.approx(2 * 34816)
    assert acts(1, flash_attention=True, sequence_parallel=True) == pytest.approx(34816)  # last stage: 1 in flight
    assert acts(recompute=True, flash_attention=True) == pytest.approx(2 * 4096 + 45056)
    assert acts(recompute=True, sequence_parallel=True) == pytest.approx(2 * 2048 + 39936)
    assert acts(recompute=True, flash_attention=True, sequence_parallel=True) == pytest.approx(2 * 2048 + 34816)
    # fp32 doubles every term; at t = 1 sequence parallelism changes nothing (10 + 24/1 = 34)
    assert acts(dtype="float32", flash_attention=True) == pytest.approx(2 * 2 * 45056)
    t1 = dataclasses.replace(LAY, tp=1)
    assert (stage_bytes(dataclasses.replace(t1, sequence_parallel=True), 0)["activations"]
            == pytest.approx(stage_bytes(t1, 0)["activations"]) == pytest.approx(2 * 2048 * 39))
    # the other parts do not move
    base, both = stage_bytes(LAY, 0), stage_bytes(dataclasses.replace(LAY, flash_attention=True, sequence_parallel=True), 0)
    assert all(base[k] == both[k] for k in ("weights", "gradients", "optimizer", "context", "bucket"))


def test_given_zero_stages_and_fp32_when_stage_bytes_expect_partitioned_states_and_doubled_activations():
    p0 = LAY.stage_params(0)
    z2 = stage_bytes(dataclasses.replace(LAY, zero=2), 0)
    assert (z2["gradients"], z2["optimizer"]) == (p0, 6 * p0)
    z3 = stage_bytes(dataclasses.replace(LAY, zero=3), 0)
    assert z3["weights"] == p0
    f32 = stage_bytes(dataclasses.replace(LAY, dtype="float32", zero=0), 0)
    assert (f32["weights"], f32["gradients"], f32["optimizer"]) == (4 * p0, 4 * p0, 8 * p0)
    assert f32["activations"] == pytest.approx(2 * 2 * FULL)


def test_given_capacity_when_fits_expect_worst_stage_against_gib_and_none_without_a_figure():
    node = Node(name="t", gpu="g", gpus_per_node=4, hbm_gbytes_per_s=1.0, peak_tflops={"float16": 1.0},
                intra_gbps=1.0, intra_latency_us=0.0, rail_gbps=1.0, rails_per_node=1, inter_latency_us=0.0)
    assert fits(LAY, node) is None
    need = max(stage_bytes(LAY, 0)["total"], stage_bytes(LAY, 1)["total"])
    ok = fits(LAY, dataclasses.replace(node, memory_gib=need / GIB))
    assert ok["fits"] and ok["bytes"]["total"] == need and ok["capacity"] == pytest.approx(need)
    assert not fits(LAY, dataclasses.replace(node, memory_gib=0.99 * need / GIB))["fits"]
    d = {"name": "x", "gpu": "X", "gpus_per_node": 4, "hbm_gbytes_per_s": 900, "peak_tflops": {"float16": 125},
         "memory_gib": 16, "intra": {"gbit_per_s_per_gpu": 600, "latency_us": 1},
         "inter": {"rail_gbit_per_s": 100, "rails_per_node": 2, "latency_us": 2}}
    assert node_from_dict(d).memory_gib == 16.0


def test_given_neox20b_on_lassen_when_memory_line_expect_micro_batch_4_does_not_fit_16_gib():
    from ccoll.model.published import NEOX20B, memory_line

    # stage 0: 11 layers + embedding = P; 16 P / 24 ... by part: 4 P + 12 P / 24, and 4 in flight x 11 x 2 s b h
    # + one full layer: s b h (10 + 12 + 5 x 64 x 2048 / (6144 x 2)) -- about 20.1e9 bytes against 16 GiB
    p = NEOX20B.stage_params(0)
    sbh = 2048 * 4 * 6144
    expect = (4 * p + 12 * p / 24 + 4 * 11 * 2 * sbh + sbh * (22 + 5 * 64 * 2048 / (6144 * 2))
              + int(0.3 * GIB) + 1_260_000_000 * 2)  # + CUDA context + 20B.yml's reduce bucket of 1.26e9 fp16
    f = fits(NEOX20B, load_cluster("lassen"))
    assert f["stage"] == 0 and f["bytes"]["total"] == pytest.approx(expect) and not f["fits"]
    assert fits(dataclasses.replace(NEOX20B, micro_batch=1), load_cluster("lassen"))["fits"]
    line = memory_line()
    assert "does not fit" in line and "may fit: TP 2 x PP 4 x DP 24, micro-batch 1 x 128" in line


def test_given_cluster_run_when_printed_expect_the_memory_verdict_or_a_refusal_before_any_output(capsys):
    from ccoll.model import main

    assert main(["--preset", "neox20b-v100", "--cluster", "lassen"]) == 0
    assert "of 16 GiB: may fit" in capsys.readouterr().out
    # 20B.yml as written on a V100: refused, nothing printed, what would fit named
    assert main(["--preset", "neox20b-a100", "--cluster", "lassen"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and "does not fit lassen" in cap.err and "may fit" in cap.err
    assert main(["--preset", "neox20b-a100"]) == 0  # on its own node (DGX A100, 80 GiB)
    assert "of 80 GiB: may fit" in capsys.readouterr().out
