"""ccoll.model's ``hierarchy: node`` for reduce_scatter / all_gather and ``weight_delta`` all-gathers: hand-computed
wire seconds, roofline rates and their place in the predicted step."""
from __future__ import annotations

import pytest
import torch

from ccoll.codecs import get_codec
from ccoll.errors import CcollError
from ccoll.model import Layout, wire_nbytes
from ccoll.model.clusters import Node
from ccoll.model.timing import call_seconds, hierarchy_seconds, predict, wdelta_roofline_gbps

#: round numbers: 4 GPUs, 100 GB/s per GPU inside the node (1e11 B/s), 100 GB/s for the node's rails, no latency
NODE = Node(name="t", gpu="g", gpus_per_node=4, hbm_gbytes_per_s=1000.0, peak_tflops={"float32": 100.0},
            intra_gbps=800.0, intra_latency_us=0.0, rail_gbps=400.0, rails_per_node=2, inter_latency_us=0.0)
#: 8 DP ranks = 2 nodes of 4 members (tp = pp = 1), fp32; 2 layers of hidden 256: one unsegmented call each
LAY = Layout(layers=2, hidden=256, heads=4, seq=16, vocab=64, micro_batch=1, micro_batches=1, dp=8, dtype="float32")


def test_given_round_numbers_when_hierarchy_seconds_expect_hand_computed_times():
    # reduce_scatter of 1 GB, 8 ranks = 2 nodes x 4: intra reduce-scatter 3 x 1e9 / (4 x 1e11) = 7.5 ms; then the
    # compressed reduce-scatter of the 250 MB chunk between 2 peers, all 4 GPUs of a node at once:
    # 4 x (2 - 1) / 2 x 2.5e8 / 1e11 = 5 ms
    assert hierarchy_seconds("reduce_scatter", 1e9, 2.5e8, 8, 4, NODE) == pytest.approx(7.5e-3 + 5e-3)
    # all_gather of a 100 MB shard: compressed gather of its 25 MB payload from 1 peer, 4 GPUs at once:
    # 4 x 1 x 2.5e7 / 1e11 = 1 ms; then the intra all-gather of 2 decoded shards: 3 x 2e8 / 1e11 = 6 ms
    assert hierarchy_seconds("all_gather", 1e8, 2.5e7, 8, 4, NODE) == pytest.approx(1e-3 + 6e-3)
    # all_reduce: intra reduce-scatter + all-gather 2 x 3 x 1e9 / 4e11 = 15 ms; ccoll's all_reduce between the
    # 2 peers: 4 x (1/2 + 1/2) x 2.5e8 / 1e11 = 10 ms
    assert hierarchy_seconds("all_reduce", 1e9, 2.5e8, 8, 4, NODE) == pytest.approx(15e-3 + 10e-3)
    with pytest.raises(CcollError, match="no send"):
        hierarchy_seconds("send", 1e9, 2.5e8, 8, 4, NODE)


def test_given_zero2_with_hierarchy_node_when_predict_expect_two_level_reduce_scatter_and_all_gather(tmp_path):
    pol = tmp_path / "hier.yaml"
    pol.write_text("version: 2\ndefault: {codec: native}\ndp: {codec: int8:block=256, hierarchy: node}\n")
    lay = Layout(**{**LAY.__dict__, "zero": 2})
    c = get_codec("int8:block=256")
    p = lay.stage_params(0)
    shard = -(-p // 8)
    rs = hierarchy_seconds("reduce_scatter", p * 4, wire_nbytes(c, "reduce_scatter", p // 4, torch.float32, 2), 8, 4,
                           NODE)
    ag = hierarchy_seconds("all_gather", shard * 4, wire_nbytes(c, "all_gather", shard, torch.float32, 2), 8, 4, NODE)
    t = predict(lay, NODE, str(pol), mfu=0.5)
    assert t["link_s"]["dp"] == pytest.approx(rs + ag)
    # codec at the roofline (no feedback): reduce_scatter encodes and decodes its 1/4 chunk once each; all_gather
    # encodes the shard and decodes the 2 peers' shards
    enc = 1000 * 4 / (4 + 1 + 4 / 256)
    codec = (p / 4 * (1 / enc + 1 / enc) + shard * (1 / enc + 2 / enc)) * 4 / 1e9
    assert t["codec_s"] == pytest.approx(codec, rel=1e-6)
    # the same layout on one node: exact inside a node, as native
    one = Layout(**{**lay.__dict__, "dp": 4})
    assert predict(one, NODE, str(pol), mfu=0.5)["link_s"]["dp"] == pytest.approx(
        predict(one, NODE, None, mfu=0.5)["link_s"]["dp"])


def test_given_weight_delta_codec_when_roofline_expect_reconstruction_traffic_counted():
    c = get_codec("int8:block=256")
    enc, dec = wdelta_roofline_gbps(c, torch.float16, 1000.0)
    payload = 1 + 4 / 256  # int8 per value + one fp32 scale per 256 fp32 deltas
    # encode: read fp16 input 2, read recon 4, write delta 4, read delta 4, write payload; per 2 input bytes
    assert enc == pytest.approx(1000 * 2 / (2 + 12 + payload))
    # decode: read payload, write decoded 4, read decoded 4 and recon 4, write recon 4, read recon 4, write fp16 2
    assert dec == pytest.approx(1000 * 2 / (payload + 20 + 2))


def test_given_weight_delta_when_predict_expect_delta_gathers_plus_one_exact_refresh_in_t(tmp_path):
    pol = tmp_path / "wd.yaml"
    pol.write_text("version: 1\ndefault: {codec: native}\n"
                   "dp: {codec: native, ops: {all_gather: {codec: int8:block=256, weight_delta: 100}}}\n")
    c = get_codec("int8:block=256")
    p = LAY.stage_params(0)
    shard = -(-p // 8)
    grads = call_seconds("all_reduce", p * 4, 8, 4, False, NODE, False)
    delta = call_seconds("all_gather", wire_nbytes(c, "all_gather", shard, torch.float32, 8), 8, 4, False, NODE, True)
    exact = call_seconds("all_gather", shard * 4, 8, 4, False, NODE, False)
    t = predict(LAY, NODE, str(pol), mfu=0.5)
    assert t["link_s"]["dp"] == pytest.approx(grads + 0.99 * delta + 0.01 * exact)
    enc, dec = wdelta_roofline_gbps(c, torch.float32, 1000.0)
    assert t["codec_s"] == pytest.approx(0.99 * shard * 4 * (1 / enc + 8 / dec) / 1e9)
    assert 0.99 * delta + 0.01 * exact < exact  # what it buys: the gather shrinks ~4x on fp32 weights


def test_given_latency_when_tree_all_reduce_expect_log_latency_and_twice_the_bytes():
    import dataclasses

    from ccoll.model.timing import tree_seconds

    lat = dataclasses.replace(NODE, inter_latency_us=2.0, intra_latency_us=1.0)
    # 1 GB, 8 ranks = 4 nodes x 2: 4 GPUs x 2 W / 2 over 1e11 B/s = 40 ms; 2 ceil(log2 4) x 2 us; the intra chain
    # down and up: 2 x (1e9 / 1e11 + 1 x 1 us)
    assert tree_seconds(1e9, 8, 2, lat) == pytest.approx(0.04 + 8e-6 + 0.02 + 2e-6)
    ring = 4 * 2 * 7 / 8 * 1e9 / 2 / 1e11 + 14 * 2e-6
    assert call_seconds("all_reduce", 1e9, 8, 2, False, lat, False, "tree") == pytest.approx(0.06001)
    assert call_seconds("all_reduce", 1e9, 8, 2, False, lat, False, "ring") == pytest.approx(ring)
    assert call_seconds("all_reduce", 1e9, 8, 2, False, lat, False) < 0.06001  # big: tree never wins on bytes
    # 1 KB over 64 one-member nodes: the tree's 2 x 6 latencies beat the ring's 2 x 63
    tree = 4 * 2 * 1e3 / 1e11 + 12 * 2e-6
    assert tree_seconds(1e3, 64, 1, lat) == pytest.approx(tree)
    assert call_seconds("all_reduce", 1e3, 64, 1, False, lat, False) == pytest.approx(tree)


def test_given_weight_delta_when_traffic_expect_fp32_deltas_and_the_runs_exact_refreshes(tmp_path):
    from ccoll.model import traffic
    from ccoll.model.core import refresh_fraction

    pol = tmp_path / "wd.yaml"
    pol.write_text("version: 1\ndefault: {codec: native}\n"
                   "dp: {codec: native, ops: {all_gather: {codec: int8:block=256, weight_delta: 100}}}\n")
    lay = Layout(**{**LAY.__dict__, "dtype": "float16"})
    shard = -(-lay.stage_params(0) // 8)
    raw = shard * 2
    delta = wire_nbytes(get_codec("int8:block=256"), "all_gather", shard, torch.float32, 8)  # fp32 deltas
    assert delta == pytest.approx(shard * (1 + 4 / 256), rel=1e-3)

    def gather(steps):
        return next(r for r in traffic(lay, str(pol), steps=steps) if r["op"] == "all_gather")["wire_per_rank"]

    # 20 steps: the first call refreshes (1 of 20); 250 steps: steps 0, 100, 200 (3 of 250); steady: 1 in 100
    assert gather(20) == pytest.approx(raw / 20 + 19 / 20 * delta)
    assert gather(250) == pytest.approx(3 / 250 * raw + 247 / 250 * delta)
    assert gather(None) == pytest.approx(raw / 100 + 0.99 * delta)
    assert refresh_fraction(100, 2, None) == pytest.approx(0.005)  # two calls a step: half as often per call
    assert refresh_fraction(1, 1, 7) == 1.0


def test_given_real_wdelta_run_when_validated_expect_dp_wire_bytes_within_tolerance():
    """A real run (``python -m ccoll.convergence --policies configs/baseline.yaml configs/hybrid_wdelta.yaml --steps 14
    --dp 2 --pp 1 --tp 1 --hidden 32 --layers 2 --heads 2 --seq-len 32 --micro-batch 2``; summary in
    tests/unit/data): its ccoll.stats DP wire bytes, one exact refresh and 13 delta gathers, against the model
    (101609 predicted vs 101625 measured; 92416 before the refreshes and fp32 deltas were counted: a 9% miss)."""
    import json
    import pathlib

    from ccoll.model import validate

    data = pathlib.Path(__file__).parent / "data" / "wdelta_dp2_summary.json"
    res = validate(json.loads(data.read_text()), policy_dir=str(pathlib.Path(__file__).resolve().parents[2] / "configs"))
    dp = res["policies"]["hybrid_wdelta"]["dims"]["dp"]
    assert res["ok"] and dp["predicted_wire"] == pytest.approx(dp["measured_wire"], rel=0.001)


def _dp_rows(rows):
    return {r["op"]: (r["raw_per_rank"], r["wire_per_rank"]) for r in rows if r["dim"] == "dp"}


def test_given_node_map_when_traffic_with_hierarchy_expect_the_bytes_ccoll_stats_records(tmp_path):
    """--validate's bytes for ``hierarchy: node``: what enters the compressed inter-node phase (raw) and its payload
    (wire), per ccoll.collectives.hierarchy's "Stats" (the exact intra-node phases are not counted)."""
    from ccoll.model import traffic
    from ccoll.model.core import hierarchy_nbytes, members_per_node

    pol = tmp_path / "hier.yaml"
    pol.write_text("version: 2\ndefault: {codec: native}\ndp: {codec: int8:block=256, hierarchy: node}\n")
    c = get_codec("int8:block=256")
    enc = lambda n: c.encoded_nbytes(n, torch.float32)  # noqa: E731 -- the codec's own size contract
    lay = Layout(layers=2, hidden=64, heads=4, seq=16, vocab=256, micro_batch=1, micro_batches=1, dp=4,
                 dtype="float32")
    p = lay.stage_params(0)
    assert p == 132864  # 2 x (12 x 64^2 + 7 x 64 + 6 x 64) + 256 x 64 + 2 x 64 + 256 x 64 (4 B each: one segment)
    assert members_per_node(lay, 2) == {"tp": 1, "dp": 2, "pp": 1}
    # DP 4 on 2 nodes x 2 (N = 2): the gradient's node-partial half (66432 values, 265728 B) crosses once;
    # the ZeRO shard of 33216 values is all-gathered between the 2 peers
    hier = _dp_rows(traffic(lay, str(pol), ranks_per_node=2))
    assert hier["all_reduce"] == (66432 * 4, enc(66432))
    assert hier["all_gather"] == (33216 * 4, enc(33216))
    # flat (no node map): the whole 531456 B gradient, 4 encoded chunks of 33216 -- twice the hierarchy's wire
    flat = _dp_rows(traffic(lay, str(pol)))
    assert flat["all_reduce"] == (132864 * 4, 4 * enc(33216))
    assert enc(66432) < 0.51 * 4 * enc(33216)  # N / (2 L) = 1/2 of flat's bytes, as the module says
    # one node (4 ranks per node) or one rank per node: ccoll runs the group flat, and so do the counts
    assert _dp_rows(traffic(lay, str(pol), ranks_per_node=4)) == flat
    assert _dp_rows(traffic(lay, str(pol), ranks_per_node=1)) == flat
    # DP 8 on 4 nodes x 2 (N = 4): the half-chunk runs ccoll's flat all_reduce among the 4 peers: 4 x 16608 values
    big = Layout(**{**lay.__dict__, "dp": 8})
    assert _dp_rows(traffic(big, str(pol), ranks_per_node=2))["all_reduce"] == (66432 * 4, 4 * enc(16608))
    # reduce_scatter (ZeRO-2's): the 1/k partial sums among the N peers: 66432 values, 2 encoded spans of 33216
    assert hierarchy_nbytes(c, "reduce_scatter", p, torch.float32, 4, 2) == (66432 * 4, 2 * enc(33216))
    with pytest.raises(CcollError, match="no send"):
        hierarchy_nbytes(c, "send", p, torch.float32, 4, 2)


def test_given_hierarchy_run_summary_when_validate_expect_node_map_from_meta_or_argument(tmp_path):
    from ccoll.model import traffic
    from ccoll.model.core import per_dim
    from ccoll.model.fromrun import validate

    pol = tmp_path / "hier.yaml"
    pol.write_text("version: 2\ndefault: {codec: native}\ndp: {codec: int8:block=256, hierarchy: node}\n")
    lay = Layout(layers=2, hidden=64, heads=4, seq=16, vocab=256, micro_batch=1, micro_batches=1, dp=4,
                 dtype="float32", embedding="replicated", lm_head="gathered", learned_positions=True,
                 lm_head_bias=True)
    steps = 3
    measured = per_dim(traffic(lay, str(pol), ranks_per_node=2))  # what a 2 x 2 run's ccoll.stats would hold
    meta = dict(steps=steps, dp=4, tp=1, pp=1, micro_batch=1, grad_accum=1, global_batch=4, policies=[str(pol)],
                model=dict(hidden=64, layers=2, heads=4, seq_len=16))
    s = {"baseline": "hier", "meta": meta, "policies": {"hier": {
        "bytes": {d: {k: v * steps for k, v in b.items()} for d, b in measured.items()}, "samples_per_s": 1.0}}}
    assert not validate(s)["ok"]  # without the node map the model counts flat calls
    assert validate(s, ranks_per_node=2)["ok"]
    s["meta"]["ranks_per_node"] = 2
    assert validate(s)["ok"]
