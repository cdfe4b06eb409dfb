"""--validate / --from-run on the mechanistic step time: the shaped test bed as a cluster (one link per rank),
compute and codec rates measured by the run. Expected numbers computed by hand."""
from __future__ import annotations

import pathlib

import pytest
import torch

from ccoll.codecs import get_codec
from ccoll.errors import CcollError
from ccoll.model import RUNNER, Layout, wire_nbytes
from ccoll.model.clusters import ClusterError, shaped_node
from ccoll.model.timing import predict

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
#: DP 2, fp32, ZeRO-0 (gradient all-reduce only), small enough for one segment per call
LAY = Layout(layers=2, hidden=64, heads=4, seq=16, vocab=64, micro_batch=2, micro_batches=1, dp=2, dtype="float32",
             zero=0)


def test_given_netem_rate_when_shaped_node_expect_one_rank_per_node_on_its_own_link():
    n = shaped_node(1.0)
    assert (n.gpus_per_node, n.rails_per_node, n.node_gbps, n.inter_latency_us) == (1, 1, 1.0, 0.0)
    with pytest.raises(ClusterError, match="> 0"):
        shaped_node(0.0)


def test_given_measured_compute_and_codec_when_predict_expect_hand_computed_step():
    node = shaped_node(1.0)  # 1 Gbit/s = 1.25e8 B/s each way per rank
    p = LAY.stage_params(0)
    raw = p * 4
    # native: ring all-reduce between 2 one-GPU nodes, 2 (n-1)/n W / B = W / 1.25e8, after the schedule
    base = predict(LAY, node, None, compute_s=1.0)
    assert base["compute_s"] == pytest.approx(1.0)
    assert base["total_s"] == pytest.approx(1.0 + raw / 1.25e8)
    # hybrid's int4:block=64 with error feedback: ccoll's all-to-all + all-gather, ((n-1)/n + (n-1)/n) w / B = w / B;
    # codec at the run's 1 GB/s encode, 2 GB/s decode: (1 + 1/2) encodes and 2 decodes per value
    w = wire_nbytes(get_codec("int4:block=64"), "all_reduce", p, torch.float32, 2)
    t = predict(LAY, node, str(CONFIGS / "hybrid.yaml"), compute_s=1.0, codec_gbps=(1.0, 2.0))
    assert t["link_s"]["dp"] == pytest.approx(w / 1.25e8)
    assert t["codec_s"] == pytest.approx(raw * (1.5 / 1e9 + 2 / 2e9))
    assert t["total_s"] == pytest.approx(1.0 + w / 1.25e8 + raw * 2.5e-9)
    # pipeline: compute_s is the whole schedule's, (m + pp - 1) slots of the slowest stage
    pp = Layout(**{**LAY.__dict__, "pp": 2, "micro_batches": 3})
    assert predict(pp, node, None, compute_s=4.0)["compute_s"] == pytest.approx(4.0)
    with pytest.raises(CcollError, match="mfu"):
        predict(LAY, node, None)


def test_given_run_summary_when_validate_expect_compute_calibrated_on_the_mechanistic_baseline():
    from test_model import _summary_from_model

    from ccoll.model import validate

    lay = Layout(layers=2, hidden=64, heads=4, seq=16, micro_batch=2, micro_batches=1, dp=2, tp=1, pp=1, **RUNNER)
    s = _summary_from_model(lay, 10, {"baseline": str(CONFIGS / "baseline.yaml"), "hybrid": str(CONFIGS / "hybrid.yaml")},
                            {"baseline": 10.0, "hybrid": 12.0})
    e = validate(s, codec_gbps=1.0, decode_gbps=2.0)["policies"]["hybrid"]
    node = shaped_node(0.1)  # the summary's netem_rate 100mbit
    comp = 4 / 10.0 - predict(lay, node, None, compute_s=0.0)["total_s"]  # global batch 4 at 10 samples/s
    kw = dict(compute_s=comp, codec_gbps=(1.0, 2.0))
    assert e["predicted_step"]["compute_s"] == pytest.approx(comp)
    assert e["predicted_speedup"] == pytest.approx(predict(lay, node, None, **kw)["total_s"]
                                                   / predict(lay, node, str(CONFIGS / "hybrid.yaml"), **kw)["total_s"])


def test_given_target_speedup_when_codec_rate_needed_expect_hand_computed_rate_or_the_bound():
    from ccoll.model import why_line_node
    from ccoll.model.timing import codec_rate_needed

    node = shaped_node(1.0)
    p = LAY.stage_params(0)
    raw = p * 4
    w = wire_nbytes(get_codec("int4:block=64"), "all_reduce", p, torch.float32, 2)
    base = 0.01 + raw / 1.25e8
    free = 0.01 + w / 1.25e8  # an infinitely fast codec
    hybrid = str(CONFIGS / "hybrid.yaml")
    target = 1 + 0.5 * (base / free - 1)  # half the most any codec could give
    # one unsegmented call: step = free + raw x (1.5 + 2) / (rate x 1e9)  ->  rate = 3.5 raw / (base/target - free)
    n = codec_rate_needed(LAY, node, hybrid, target, compute_s=0.01)
    assert n["max_speedup"] == pytest.approx(base / free)
    assert n["codec_gbps"] == pytest.approx(3.5 * raw / ((base / target - free) * 1e9), rel=1e-6)
    out = codec_rate_needed(LAY, node, hybrid, base / free * 1.01, compute_s=0.01)
    assert out["codec_gbps"] is None
    assert "out of reach" in why_line_node(LAY, node, hybrid, base / free * 1.01, compute_s=0.01)
    assert "needs a codec" in why_line_node(LAY, node, hybrid, target, compute_s=0.01)


def test_given_segmented_call_when_codec_cannot_overlap_expect_wire_plus_codec_else_pipelined():
    from ccoll.collectives.segments import SEGMENT_BYTES
    from ccoll.model.fromrun import codec_overlaps

    big = Layout(**{**LAY.__dict__, "hidden": 1024, "heads": 8})
    nseg = -(-big.stage_params(0) * 4 // SEGMENT_BYTES)
    assert nseg > 1
    kw = dict(compute_s=1.0, codec_gbps=(1.0, 2.0))
    hybrid = str(CONFIGS / "hybrid.yaml")
    serial = predict(big, shaped_node(1.0), hybrid, overlap_codec=False, **kw)
    wire, cod = serial["link_s"]["dp"], serial["codec_s"]
    assert serial["total_s"] == pytest.approx(1.0 + wire + cod)
    piped = predict(big, shaped_node(1.0), hybrid, **kw)
    # segments: the longer of wire and codec, plus one segment's share of the shorter
    assert piped["total_s"] == pytest.approx(1.0 + max(wire, cod) + min(wire, cod) / nseg)
    # a CPU test bed overlaps only while a core is free: 2 ranks x 2 runs on 2 or 4 cores do not, on 8 they do
    assert codec_overlaps(2, None, 2) and codec_overlaps(2, 8, 2)
    assert not codec_overlaps(2, 2, 2) and not codec_overlaps(2, 4, 2)
