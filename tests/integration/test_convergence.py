"""``python -m ccoll.convergence`` end to end: real DeepSpeed engines (PipelineModule, ZeRO-1) on 4 gloo
CPU ranks launched by the tool itself, with ccoll's patch installed from the shipped policy files.

One short DP2 x PP2 comparison (baseline vs hybrid, 2 seeds, held-out evaluations, tensor capture) is
shared by most tests; one TP2 x DP2 run (1 seed) checks tensor-parallel traffic. Tiny model and few steps:
this checks the plumbing, the statistics fields, the capture and the byte accounting (against the
analytical model in ccoll.model), not convergence quality (that is measured by ``make convergence``).
"""
from __future__ import annotations

import csv
import json
import math
import os

import pytest

import ccoll
from ccoll.convergence.__main__ import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--hidden", "32", "--layers", "2", "--heads", "2", "--seq-len", "32", "--micro-batch", "2",
        "--grad-accum", "2", "--lr", "3e-3", "--timeout", "900"]
STEPS = 14
SEEDS = [1234, 1235]
EVAL_EVERY = 7

# four tiny runs in the shared fixture (2 policies x 2 seeds) and two for TP: minutes on a loaded 2-core machine
pytestmark = [pytest.mark.timeout(1500), pytest.mark.slow]


def _cfg(name: str) -> str:
    return os.path.join(ROOT, "configs", f"{name}.yaml")


@pytest.fixture(scope="module")
def dp2pp2(tmp_path_factory):
    out = tmp_path_factory.mktemp("conv_dp2pp2")
    rc = main(["--policies", _cfg("baseline"), _cfg("hybrid"), "--steps", str(STEPS), "--dp", "2", "--pp", "2",
               "--tp", "1", "--out", str(out), "--seeds", str(len(SEEDS)), "--seed", str(SEEDS[0]),
               "--eval-every", str(EVAL_EVERY), "--eval-batches", "2", "--capture", str(out / "capture"), *TINY])
    assert rc == 0
    with open(out / "summary.json") as f:
        return out, json.load(f)


def _codec_ratio(policy_name: str, dim: str, op: str) -> float:
    """raw/wire of the codec the policy names for (dim, op), on a large fp32 message."""
    import torch

    policy = ccoll.Policy.from_yaml(_cfg(policy_name))
    x = torch.zeros(1 << 20)
    codec = policy.resolve(dim, op, x, step=10**6)
    assert codec is not None, f"{policy_name} does not compress {dim}/{op}"
    return x.numel() * 4 / codec.encoded_nbytes(x.numel(), torch.float32)


def test_given_two_policies_when_run_expect_every_output_file_and_summary_shape(dp2pp2):
    out, s = dp2pp2
    for name in ("losses.csv", "loss.png", "summary.json", "summary.md"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(s["policies"]) == {"baseline", "hybrid"}
    for name, p in s["policies"].items():
        assert isinstance(p["final_loss"], float) and math.isfinite(p["final_loss"]), name
        assert isinstance(p["samples_per_s"], float) and p["samples_per_s"] > 0, name
        assert p["steps"] == STEPS and isinstance(p["steps"], int)
        assert p["seeds"] == SEEDS and [r["seed"] for r in p["per_seed"]] == SEEDS
        assert all(math.isfinite(r["final_val_loss"]) for r in p["per_seed"])
        assert p["final_val_loss"] == pytest.approx(sum(r["final_val_loss"] for r in p["per_seed"]) / 2)
        assert p["final_loss_std"] > 0 and p["final_val_loss_std"] > 0  # seeds differ: other init and batches
        assert p["verdict_on"] == "held-out loss"
        assert set(p["bytes"]) == {"dp", "tp", "pp"}
        for d, b in p["bytes"].items():
            assert set(b) == {"raw", "wire"} and all(isinstance(v, int) for v in b.values()), (name, d)
    h = s["policies"]["hybrid"]
    assert h["delta_val_pct"]["n"] == 2 and h["delta_val_pct"]["lo"] < h["delta_val_pct"]["mean"] < h["delta_val_pct"]["hi"]
    assert h["verdict"] in ("within 1%", "worse", "better", "not separable")
    assert s["policies"]["baseline"]["verdict"] == "baseline"
    # the codec timed in the run itself (ccoll.convergence.shaped predicts step time from it): hybrid
    # encodes its DP gradients and PP activations on every rank; baseline sends everything native
    c = h["codec_in_run"]
    assert c["encode_gbps"] > 0 and c["decode_gbps"] > 0
    assert 0 < c["seconds_per_step_mean"] <= c["seconds_per_step_max"]
    assert s["policies"]["baseline"]["codec_in_run"] is None
    md = (out / "summary.md").read_text()
    assert "| baseline | 2 |" in md and "| hybrid | 2 |" in md and h["verdict"] in md


def test_given_eval_every_when_trained_expect_held_out_losses_at_those_steps_same_batches_every_run(dp2pp2):
    out, s = dp2pp2
    with open(out / "val_losses.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [EVAL_EVERY, STEPS]
    for name in ("baseline", "hybrid"):
        for seed in SEEDS:
            vals = [float(r[f"{name}/seed{seed}"]) for r in rows]
            assert vals[-1] < vals[0] < 5.6  # learning, and below ln(256)
        assert float(rows[-1][name]) == pytest.approx(s["policies"][name]["final_val_loss"], abs=1e-5)
    # (evaluation traffic is excluded from the bytes: test_given_dp2_pp2_runs_when_model_validated_... would
    # see the extra pipeline sends)


def test_given_losses_csv_when_read_expect_one_column_per_policy_matching_final_loss(dp2pp2):
    out, s = dp2pp2
    with open(out / "losses.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))
    for name, p in s["policies"].items():
        losses = [float(r[name]) for r in rows]
        assert all(math.isfinite(x) for x in losses)
        tail = losses[-math.ceil(0.1 * STEPS):]
        assert p["final_loss"] == pytest.approx(sum(tail) / len(tail), abs=1e-5)
        # byte-level text starts near ln(256) = 5.5 and drops fast: the model is learning
        assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5, (name, losses)


def test_given_baseline_policy_when_trained_expect_dp_and_pp_traffic_counted_uncompressed(dp2pp2):
    b = dp2pp2[1]["policies"]["baseline"]["bytes"]
    assert b["dp"]["raw"] > 0 and b["pp"]["raw"] > 0
    assert b["tp"] == {"raw": 0, "wire": 0}  # tp=1: no tensor-parallel group
    for d in ("dp", "pp"):
        assert b[d]["wire"] == b[d]["raw"], d


def test_given_hybrid_policy_when_trained_expect_dp_gradients_at_the_codec_ratio(dp2pp2):
    out, s = dp2pp2
    with open(out / "stats.json") as f:
        rows = json.load(f)["hybrid"]
    grad = [r for r in rows if r["dim"] == "dp" and r["op"] in ("all_reduce", "reduce_scatter") and r["codec"] != "native"]
    assert grad, "hybrid compressed no DP gradient traffic"
    raw, wire = sum(r["raw_bytes"] for r in grad), sum(r["wire_bytes"] for r in grad)
    assert raw / wire == pytest.approx(_codec_ratio("hybrid", "dp", "all_reduce"), rel=0.05)
    # the same DP all-reduce bytes went through as in the baseline run (same model, same steps); only
    # the scalar ones (loss, overflow) stayed native
    with open(out / "stats.json") as f:
        both = json.load(f)
    total = {name: sum(r["raw_bytes"] for r in rows if r["dim"] == "dp" and r["op"] == "all_reduce")
             for name, rows in both.items()}
    assert total["hybrid"] == total["baseline"]
    assert total["hybrid"] - raw < 0.001 * raw
    pp = s["policies"]["hybrid"]["bytes"]["pp"]
    assert pp["raw"] / pp["wire"] > 2.0
    assert s["policies"]["hybrid"]["bytes"]["dp"]["wire"] < s["policies"]["baseline"]["bytes"]["dp"]["wire"]


def test_given_tp2_dp2_when_trained_expect_tp1_losses_and_tp_traffic_compressed(dp2pp2, tmp_path):
    rc = main(["--policies", _cfg("baseline"), _cfg("hybrid"), "--steps", str(STEPS), "--dp", "2", "--tp", "2",
               "--pp", "1", "--out", str(tmp_path), "--seeds", "1", "--seed", str(SEEDS[0]),
               "--capture", str(tmp_path / "capture"), *TINY])
    assert rc == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    s = summary["policies"]
    # same model, data and DP degree as the DP2 x PP2 run: splitting layers across TP ranks (and the
    # DeepSpeed grad-norm over shards) must not change the training, only float summation order
    with open(dp2pp2[0] / "losses.csv") as f:
        ref = [float(r[f"baseline/seed{SEEDS[0]}"]) for r in csv.DictReader(f)]
    with open(tmp_path / "losses.csv") as f:
        tp_losses = [float(r["baseline"]) for r in csv.DictReader(f)]
    assert tp_losses == pytest.approx(ref, rel=1e-4)
    assert s["baseline"]["bytes"]["pp"] == {"raw": 0, "wire": 0}
    assert s["baseline"]["bytes"]["tp"]["raw"] > 0
    tp = s["hybrid"]["bytes"]["tp"]
    assert tp["raw"] == s["baseline"]["bytes"]["tp"]["raw"]
    # TP traffic: activation all-reduces and the logits all-gather (scalar grad-norm reductions stay native)
    assert tp["raw"] / tp["wire"] == pytest.approx(_codec_ratio("hybrid", "tp", "all_reduce"), rel=0.1)
    assert math.isfinite(s["hybrid"]["final_loss"])
    _check_model(summary)
    # TP tensors were captured in both directions: forward activations and backward activation gradients
    from ccoll.bench.rd import tensor_class
    from ccoll.capture import load

    classes = {tensor_class(x["meta"]) for x in load(str(tmp_path / "capture" / "baseline"))}
    assert {"tp/all_reduce:fwd", "tp/all_reduce:bwd", "tp/all_gather", "dp/all_reduce", "dp/all_gather"} <= classes


def _check_model(summary: dict) -> None:
    """ccoll.model predicts every dimension's raw and wire bytes per step within 5% of ccoll.stats."""
    from ccoll.model import validate

    res = validate(summary)
    for name, e in res["policies"].items():
        for d, r in e["dims"].items():
            assert r["ok"], (name, d, r)
    assert res["ok"]


def test_given_dp2_pp2_runs_when_model_validated_expect_every_dimension_within_5_percent(dp2pp2):
    _check_model(dp2pp2[1])


def test_given_capture_when_trained_expect_bounded_samples_of_every_traffic_class_at_three_steps(dp2pp2):
    from ccoll.bench.rd import evaluate, tensor_class
    from ccoll.capture import load

    out, _ = dp2pp2
    samples = load(str(out / "capture" / "baseline"))
    classes = {tensor_class(x["meta"]) for x in samples}
    assert {"dp/all_reduce", "dp/all_gather", "pp/send:activation", "pp/send:gradient"} <= classes
    assert {x["meta"]["step"] for x in samples} == {1, STEPS // 2, STEPS - 1}
    assert (out / "capture" / "hybrid").is_dir() and not any((out / "capture").glob("*/rank*/*.tmp"))
    for x in samples:
        m, t = x["meta"], x["tensor"]
        assert t.dtype.is_floating_point and t.numel() == min(m["numel"], 1 << 20) and bool(t.isfinite().all())
        if m["op"] == "send_recv":  # activations and their gradients: micro-batch x seq x hidden
            assert m["shape"] == [2, 32, 32] and m["pp_stage"] in (0, 1)
    act = [x["tensor"] for x in samples if tensor_class(x["meta"]) == "pp/send:activation"]
    grad = [x["tensor"] for x in samples if tensor_class(x["meta"]) == "pp/send:gradient"]
    # a receive buffer captured by mistake on the last stage would hold activations
    # (activations ~1e-2..1e-1 per value, gradients of a token-averaged loss ~1e-4..1e-3): the classes separate
    assert min(float(a.abs().mean()) for a in act) > max(float(g.abs().mean()) for g in grad)
    rows = evaluate(samples, ["int8:block=256", "bf16"])
    assert {r["class"] for r in rows} == classes
    for r in rows:
        assert r["rel_l2"] < (0.02 if r["codec"] == "int8:block=256" else 0.005) and r["cosine"] > 0.999


def test_given_missing_policy_file_when_run_expect_exit_2_and_the_path(tmp_path, capsys):
    assert main(["--policies", str(tmp_path / "nope.yaml"), "--out", str(tmp_path)]) == 2
    assert "nope.yaml" in capsys.readouterr().err
