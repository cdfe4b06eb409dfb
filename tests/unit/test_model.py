"""ccoll.model: traffic formulas per dimension, wire bytes under a policy, step time, --validate mechanics.
(Agreement with measured ccoll.stats of real runs: tests/integration/test_convergence.py.)"""
from __future__ import annotations

import copy
import dataclasses
import json
import pathlib

import pytest
import torch

import ccoll
from ccoll.errors import CcollError
from ccoll.model import (PRESETS, RUNNER, Cluster, Layout, cluster_table, main, per_dim, step_time, traffic,
                         validate)

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"


def _tiny(**kw) -> Layout:
    base = dict(layers=2, hidden=32, heads=2, seq=32, micro_batch=2, micro_batches=2, dp=2, tp=1, pp=2, **RUNNER)
    base.update(kw)
    return Layout(**base)


def test_given_runner_layout_when_counting_params_expect_the_convergence_models_parameters():
    from ccoll.convergence.gpt import GPTConfig, LMHead, TransformerBlock, Embedding, TPState

    cfg = GPTConfig(vocab_size=256, seq_len=32, hidden=32, layers=2, heads=2)
    tp1 = TPState(None, 0, 1)
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    lay = _tiny()
    assert lay.stage_params(0) == n(Embedding(cfg, 0)) + n(TransformerBlock(cfg, tp1, 0))
    assert lay.stage_params(1) == n(TransformerBlock(cfg, tp1, 0)) + n(LMHead(cfg, tp1, 0))
    assert lay.total_params() == lay.stage_params(0) + lay.stage_params(1)


def test_given_dp2_pp2_when_traffic_expect_megatron_and_zero_formulas():
    lay = _tiny()
    d = per_dim(traffic(lay))
    act = 2 * 32 * 32 * 4  # b*s*h fp32
    # PP: per micro-batch and boundary an activation forward and its gradient backward, every DP replica
    assert d["pp"]["raw"] == lay.dp * lay.micro_batches * 2 * act
    # DP: every rank's gradients, plus ZeRO-1's all-gather of each rank's 1/dp partition
    p0, p1 = lay.stage_params(0), lay.stage_params(1)
    assert d["dp"]["raw"] == lay.dp * 4 * (p0 + p1) + lay.dp * 4 * (-(-p0 // 2) - -(-p1 // 2) * -1)
    assert d["tp"] == {"raw": 0, "wire": 0}
    assert all(v["raw"] == v["wire"] for v in d.values())  # no policy: native


def test_given_tp2_when_traffic_expect_four_allreduces_per_layer_plus_head_and_logits_gather():
    lay = _tiny(tp=2, pp=1)
    rows = [r for r in traffic(lay) if r["dim"] == "tp"]
    act = 2 * 32 * 32 * 4
    ar = sum(r["raw"] for r in rows if r["op"] == "all_reduce")
    ag = sum(r["raw"] for r in rows if r["op"] == "all_gather")
    ranks = lay.dp * lay.tp
    assert ar == ranks * lay.micro_batches * (4 * lay.layers + 1) * act
    assert ag == ranks * lay.micro_batches * 2 * 32 * (256 // 2) * 4


def test_given_hybrid_policy_when_traffic_expect_codec_wire_bytes_and_native_param_gather():
    lay = _tiny(hidden=64, heads=4, seq=64, micro_batch=4)
    rows = traffic(lay, str(CONFIGS / "hybrid.yaml"))
    pol = ccoll.Policy.from_yaml(CONFIGS / "hybrid.yaml")
    for r in rows:
        if r["dim"] == "dp" and r["op"] == "all_gather":
            assert r["codec"] == "native" and r["wire"] == r["raw"]
        if r["dim"] == "dp" and r["op"] == "all_reduce":
            codec = pol.resolve("dp", "all_reduce", (r["numel"], torch.float32), step=10**6)
            # two DP ranks: one exchange (ccoll.collectives.small), the tensor's one payload
            assert r["wire_per_rank"] == codec.encoded_nbytes(r["numel"], torch.float32)
            assert r["raw"] / r["wire"] == pytest.approx(32 / 4.5, rel=0.01)
        if r["dim"] == "pp":
            assert r["raw"] / r["wire"] == pytest.approx(32 / 8.125, rel=0.01)


def test_given_slow_link_when_step_time_expect_compression_to_pay_and_fast_codec_to_matter():
    lay, cl = PRESETS["neox20b-v100"]
    lay = dataclasses.replace(lay, micro_batches=4)  # few micro-batches: DP dominates the wire
    hybrid = str(CONFIGS / "hybrid.yaml")
    base = step_time(lay, cl, None)
    assert base["codec_s"] == 0 and base["link_s"]["dp"] > base["link_s"]["tp"]
    fast = step_time(lay, Cluster(**{**cl.__dict__, "codec_gbps": 1e6}), hybrid)
    slow = step_time(lay, Cluster(**{**cl.__dict__, "codec_gbps": 1.0}), hybrid)
    assert fast["total_s"] < base["total_s"] < slow["total_s"]
    # int4 gradients (3.6x on fp16) all-reduced (2 (n-1)/n of the gradient bytes) but exact ZeRO parameter
    # all-gathers ((n-1)/n): (2 / 3.6 + 1) / 3 = 0.52 of the DP wire
    assert fast["link_s"]["dp"] < 0.53 * base["link_s"]["dp"]


def test_given_presets_when_cluster_table_expect_native_speedup_one_and_every_policy(capsys):
    rows = cluster_table([str(CONFIGS / "hybrid.yaml")], 100.0)
    assert {r["preset"] for r in rows} == set(PRESETS)
    assert all(r["speedup"] == 1.0 for r in rows if r["policy"] == "native")
    assert {r["policy"] for r in rows} == {"native", "hybrid"}
    assert "neox20b-v100" in capsys.readouterr().out


def _summary_from_model(lay: Layout, steps: int, policies: dict[str, str | None], sps: dict[str, float]) -> dict:
    pols = {}
    for name, path in policies.items():
        d = per_dim(traffic(lay, path))
        pols[name] = {"bytes": {k: {"raw": v["raw"] * steps, "wire": v["wire"] * steps} for k, v in d.items()},
                      "samples_per_s": sps[name]}
    meta = dict(steps=steps, dp=lay.dp, tp=lay.tp, pp=lay.pp, micro_batch=lay.micro_batch,
                grad_accum=lay.micro_batches, model=dict(hidden=lay.hidden, layers=lay.layers, heads=lay.heads,
                                                         seq_len=lay.seq),
                policies=[p or "unpatched" for p in policies.values()], global_batch=lay.micro_batch * lay.micro_batches * lay.dp,
                netem_rate="100mbit")
    return {"baseline": "baseline", "meta": meta, "policies": pols}


def test_given_summary_when_validate_expect_ok_within_tolerance_and_not_beyond(tmp_path, capsys):
    lay = _tiny()
    hybrid = str(CONFIGS / "hybrid.yaml")
    s = _summary_from_model(lay, 10, {"baseline": str(CONFIGS / "baseline.yaml"), "hybrid": hybrid},
                            {"baseline": 10.0, "hybrid": 12.0})
    res = validate(s)
    assert res["ok"] and res["policies"]["hybrid"]["measured_speedup"] == pytest.approx(1.2)
    assert res["policies"]["hybrid"]["predicted_speedup"] > 1.0 and res["policies"]["hybrid"]["link_gbps"] == 0.1
    bad = copy.deepcopy(s)
    bad["policies"]["hybrid"]["bytes"]["pp"]["wire"] = int(bad["policies"]["hybrid"]["bytes"]["pp"]["wire"] * 1.06)
    res = validate(bad)
    assert not res["ok"] and not res["policies"]["hybrid"]["dims"]["pp"]["ok"]
    assert res["policies"]["hybrid"]["dims"]["dp"]["ok"]
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(bad))
    assert main(["--validate", str(path)]) == 1
    path.write_text(json.dumps(s))
    assert main(["--validate", str(path), "--json", str(tmp_path / "v.json")]) == 0
    assert "predicted" in capsys.readouterr().out and json.loads((tmp_path / "v.json").read_text())["ok"]


def test_given_bad_layout_when_modelled_expect_clear_error(capsys):
    with pytest.raises(CcollError, match="zero stage 4"):
        traffic(_tiny(zero=4))
    with pytest.raises(CcollError, match="tp=3"):
        traffic(_tiny(tp=3))
    assert main(["--layers", "1", "--pp", "2"]) == 2
    assert "layers=1 < pp=2" in capsys.readouterr().err


def test_given_encode_and_decode_rates_when_step_time_expect_codec_seconds_per_pass_of_the_collective():
    # DP4 all_reduce of n values: ccoll encodes n + n/4 (tensor, reduced chunk) and decodes 2n (owned
    # chunks summed, gathered chunks); the ZeRO all-gather stays native under hybrid
    lay = _tiny(dp=4, pp=1)
    hybrid = str(CONFIGS / "hybrid.yaml")
    grads = next(r for r in traffic(lay, hybrid) if r["op"] == "all_reduce")
    cl = Cluster(tp_gbps=1e9, inter_gbps=1e9, codec_gbps=0.5, decode_gbps=2.0, compute_s=0.0, latency_us=0.0)
    t = step_time(lay, cl, hybrid)
    assert t["codec_s"] == pytest.approx(grads["raw_per_rank"] * (1.25 / 0.5 + 2 / 2.0) / 1e9)
    same = step_time(lay, Cluster(**{**cl.__dict__, "decode_gbps": None}), hybrid)
    assert same["codec_s"] == pytest.approx(grads["raw_per_rank"] * 3.25 / 0.5 / 1e9)


def test_given_codec_spec_when_throughput_measured_expect_positive_rates_and_harmonic_mean(capsys):
    from ccoll.model import codec_throughput

    r = codec_throughput("int8:block=256", numel=1 << 14, repeat=1)
    assert r["numel"] >= 1 << 14 and r["encode_gbps"] > 0 and r["decode_gbps"] > 0
    hm = 2 / (1 / r["encode_gbps"] + 1 / r["decode_gbps"])
    assert r["codec_gbps"] == pytest.approx(hm)
    assert main(["--codec-throughput", "int4:block=64", "--codec-numel", "4096"]) == 0
    assert json.loads(capsys.readouterr().out)["spec"].startswith("int4:block=64")


def test_given_target_speedup_when_codec_needed_expect_that_rate_to_reach_it_or_the_bound_that_forbids_it():
    from ccoll.model import codec_gbps_needed, why_line

    lay = _tiny(dp=4, pp=1, hidden=256, heads=4, layers=4, seq=64)
    hybrid = str(CONFIGS / "hybrid.yaml")
    slow_link = Cluster(tp_gbps=0.1, inter_gbps=0.1, codec_gbps=0.1, compute_s=0.5)
    n = codec_gbps_needed(lay, slow_link, hybrid, 1.25)
    assert n["max_speedup"] > 1.25 and n["codec_gbps"] > 0
    at = step_time(lay, Cluster(**{**slow_link.__dict__, "codec_gbps": n["codec_gbps"]}), hybrid)
    assert step_time(lay, slow_link, None)["total_s"] / at["total_s"] == pytest.approx(1.25)
    fast_link = Cluster(**{**slow_link.__dict__, "inter_gbps": 100.0})  # compute-bound: no codec helps enough
    n = codec_gbps_needed(lay, fast_link, hybrid, 1.25)
    assert n["codec_gbps"] is None and 1.0 <= n["max_speedup"] < 1.25
    assert "out of reach" in why_line(lay, fast_link, hybrid, 1.25)


def test_given_preset_without_cluster_when_run_expect_its_sourced_node_and_the_mechanistic_step(capsys, monkeypatch):
    """A preset carries its node file: ``--preset`` alone never falls back to the flat per-GPU rates."""
    from ccoll.model import PRESET_CLUSTERS, preset_cluster
    from ccoll.model.clusters import load_cluster
    from ccoll.model.timing import predict

    assert set(PRESET_CLUSTERS) == set(PRESETS)
    for name, (lay, cl) in PRESETS.items():  # every preset's node exists and has its dtype's peak
        assert load_cluster(preset_cluster(name)).peak(lay.dtype) > 0
    hybrid = str(CONFIGS / "hybrid.yaml")
    assert main(["--preset", "neox20b-v100", "--policy", hybrid]) == 0
    out = capsys.readouterr().out
    lay, cl = PRESETS["neox20b-v100"]
    node = load_cluster("lassen")
    base, t = predict(lay, node, None, mfu=cl.mfu), predict(lay, node, hybrid, mfu=cl.mfu)  # the preset's MFU 0.30
    assert "on its node file lassen" in out and "MFU 0.3," in out
    assert f"native {base['total_s']:.3f} s; speedup {base['total_s'] / t['total_s']:.3f}x" in out
    assert main(["--preset", "neox20b-v100", "--policy", hybrid, "--mfu", "0.5"]) == 0
    assert "MFU 0.5," in capsys.readouterr().out
    with pytest.raises(CcollError, match="unknown"):
        preset_cluster("nope")
    monkeypatch.setitem(PRESETS, "orphan", PRESETS["neox20b-v100"])
    with pytest.raises(CcollError, match="no node file"):
        preset_cluster("orphan")
    assert main(["--preset", "orphan"]) == 2
    assert "give --cluster" in capsys.readouterr().err


def test_given_presets_when_cluster_table_expect_the_mechanistic_step_on_each_presets_node(capsys):
    from ccoll.model.clusters import load_cluster
    from ccoll.model.timing import predict

    hybrid = str(CONFIGS / "hybrid.yaml")
    rows = cluster_table([hybrid], 100.0)
    lay, cl = PRESETS["neox20b-v100"]
    t = predict(lay, load_cluster("lassen"), hybrid, mfu=cl.mfu, codec_gbps=(100.0, 100.0))
    row = next(r for r in rows if r["policy"] == "hybrid")
    assert row["node"] == "lassen" and row["step_s"] == pytest.approx(t["total_s"])
