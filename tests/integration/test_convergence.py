"""``python -m ccoll.convergence`` end to end: real DeepSpeed engines (PipelineModule, ZeRO-1) on 4 gloo
CPU ranks launched by the tool itself, with ccoll's patch installed from the shipped policy files.

One short DP2 x PP2 comparison (baseline vs hybrid) is shared by most tests; one TP2 x DP2 run checks
tensor-parallel traffic. Tiny model and few steps: this checks the plumbing and the byte accounting,
not convergence quality (that is measured by ``make convergence``, not timed here).
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
        "--grad-accum", "2", "--lr", "3e-3", "--timeout", "300"]
STEPS = 14

pytestmark = pytest.mark.timeout(400)


def _cfg(name: str) -> str:
    return os.path.join(ROOT, "configs", f"{name}.yaml")


@pytest.fixture(scope="module")
def dp2pp2(tmp_path_factory):
    out = tmp_path_factory.mktemp("conv_dp2pp2")
    rc = main(["--policies", _cfg("baseline"), _cfg("hybrid"), "--steps", str(STEPS), "--dp", "2", "--pp", "2",
               "--tp", "1", "--out", str(out), *TINY])
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
        assert set(p["bytes"]) == {"dp", "tp", "pp"}
        for d, b in p["bytes"].items():
            assert set(b) == {"raw", "wire"} and all(isinstance(v, int) for v in b.values()), (name, d)
    md = (out / "summary.md").read_text()
    assert "| baseline |" in md and "| hybrid |" in md


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
               "--pp", "1", "--out", str(tmp_path), *TINY])
    assert rc == 0
    s = json.loads((tmp_path / "summary.json").read_text())["policies"]
    # same model, data and DP degree as the DP2 x PP2 run: splitting layers across TP ranks (and the
    # DeepSpeed grad-norm over shards) must not change the training, only float summation order
    with open(dp2pp2[0] / "losses.csv") as f:
        ref = [float(r["baseline"]) for r in csv.DictReader(f)]
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


def test_given_missing_policy_file_when_run_expect_exit_2_and_the_path(tmp_path, capsys):
    assert main(["--policies", str(tmp_path / "nope.yaml"), "--out", str(tmp_path)]) == 2
    assert "nope.yaml" in capsys.readouterr().err
