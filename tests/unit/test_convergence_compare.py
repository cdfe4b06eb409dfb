"""Multi-seed statistics of ``python -m ccoll.convergence``: paired deltas, t-intervals, verdicts, summary
fields, on synthetic numbers (no process group)."""
from __future__ import annotations

import csv
import json
import math

import pytest

from ccoll.convergence.compare import (BETTER, NOT_SEPARABLE, WITHIN, WORSE, mean_std, paired_delta_pct, t975,
                                       verdict)
from ccoll.convergence.report import write_all
from ccoll.convergence.runner import RunResult


def test_given_small_and_large_df_when_t975_expect_table_values_and_normal_limit():
    assert t975(1) == pytest.approx(12.706)
    assert t975(2) == pytest.approx(4.303)
    assert t975(30) == pytest.approx(2.042)
    assert t975(31) == pytest.approx(2.0395, abs=2e-3)  # continuous with the table
    assert t975(120) == pytest.approx(1.980, abs=1e-3)
    assert t975(10**6) == pytest.approx(1.95996, abs=1e-4)
    with pytest.raises(ValueError):
        t975(0)


def test_given_values_when_mean_std_expect_sample_std_and_none_for_one_value():
    m, sd = mean_std([1.0, 2.0, 3.0])
    assert m == 2.0 and sd == pytest.approx(1.0)
    assert mean_std([5.0]) == (5.0, None)


def test_given_paired_losses_when_delta_expect_percent_per_seed_and_t_interval():
    base = [2.00, 2.10, 1.90]
    pol = [2.02, 2.12, 1.92]  # +1.0%, +0.952%, +1.053%
    d = paired_delta_pct(pol, base)
    per = [1.0, 100 * 0.02 / 2.10, 100 * 0.02 / 1.90]
    assert d["per_seed"] == pytest.approx(per)
    m, sd = mean_std(per)
    half = 4.303 * sd / math.sqrt(3)
    assert (d["mean"], d["lo"], d["hi"], d["n"]) == pytest.approx((m, m - half, m + half, 3))
    # pairing matters: the same numbers shuffled across seeds give a far wider interval
    wide = paired_delta_pct([2.12, 1.92, 2.02], base)
    assert wide["hi"] - wide["lo"] > 20 * (d["hi"] - d["lo"])
    one = paired_delta_pct([2.02], [2.0])
    assert one["lo"] is None and one["hi"] is None and one["mean"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        paired_delta_pct([1.0, 2.0], [1.0])


@pytest.mark.parametrize("lo,hi,expected", [
    (-0.5, 0.5, WITHIN),
    (0.2, 0.9, WITHIN),        # separably above 0 but shown within the 1% margin
    (-0.99, 0.99, WITHIN),
    (-1.0, 0.5, NOT_SEPARABLE),  # touches the margin: not shown within
    (0.1, 1.5, WORSE),
    (1.2, 3.0, WORSE),
    (-3.0, -1.2, BETTER),
    (-1.5, -0.1, BETTER),
    (-0.5, 1.5, NOT_SEPARABLE),
    (-2.0, 2.0, NOT_SEPARABLE),
    (None, None, NOT_SEPARABLE),  # one seed: no interval
])
def test_given_interval_when_verdict_expect_the_documented_category(lo, hi, expected):
    assert verdict(lo, hi) == expected


def _run(name, seed, final, val, steps=20):
    losses = [5.0 - (5.0 - final) * i / (steps - 1) for i in range(steps)]
    losses[-2:] = [final, final]  # final_loss = mean of the last 10% = 2 steps
    b = {"dp": {"raw": 800, "wire": 800 if name == "baseline" else 200}, "tp": {"raw": 0, "wire": 0},
         "pp": {"raw": 100, "wire": 100}}
    return RunResult(name, losses, 10.0 + seed % 3, 1.0, b, [], seed, [[10, val + 0.5], [20, val]])


def test_given_three_seeds_per_policy_when_written_expect_means_intervals_verdicts_and_files(tmp_path):
    seeds = [1, 2, 3]
    base_final, base_val = [2.0, 2.1, 1.9], [2.2, 2.3, 2.1]
    runs = [_run("baseline", s, f, v) for s, f, v in zip(seeds, base_final, base_val)]
    runs += [_run("good", s, f * 1.001, v * (1.002 + 0.001 * i)) for i, (s, f, v) in enumerate(zip(seeds, base_final, base_val))]
    runs += [_run("bad", s, f * 1.03, v * (1.05 + 0.002 * i)) for i, (s, f, v) in enumerate(zip(seeds, base_final, base_val))]
    runs += [_run("noisy", s, f, v * m) for s, f, v, m in zip(seeds, base_final, base_val, (0.97, 1.04, 1.0))]
    meta = dict(steps=20, dp=2, tp=1, pp=2, seed=1, seeds=seeds, model=dict(hidden=8, layers=2, heads=2, seq_len=8),
                global_batch=4, data="x")
    s = write_all(runs, str(tmp_path), meta)
    p = s["policies"]
    assert s["baseline"] == "baseline" and p["baseline"]["verdict"] == "baseline"
    assert p["good"]["verdict"] == WITHIN and p["bad"]["verdict"] == WORSE and p["noisy"]["verdict"] == NOT_SEPARABLE
    assert all(q["verdict_on"] == "held-out loss" for q in p.values())
    assert p["baseline"]["final_val_loss"] == pytest.approx(2.2)
    assert p["baseline"]["final_val_loss_std"] == pytest.approx(0.1)
    assert p["baseline"]["final_loss"] == pytest.approx(2.0) and p["baseline"]["final_loss_std"] == pytest.approx(0.1)
    assert p["bad"]["delta_val_pct"]["mean"] == pytest.approx(5.2, abs=0.01)
    assert p["bad"]["delta_train_pct"]["mean"] == pytest.approx(3.0)
    assert p["bad"]["delta_val_pct"]["lo"] > 5.0 - 1 and p["bad"]["delta_val_pct"]["n"] == 3
    assert p["good"]["seeds"] == seeds and [r["seed"] for r in p["good"]["per_seed"]] == seeds
    assert p["good"]["compression"]["dp"] == 4.0
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["policies"]["bad"]["verdict"] == "worse"
    md = (tmp_path / "summary.md").read_text()
    assert "| bad | 3 |" in md and "| worse |" in md and "within 1%" in md
    with open(tmp_path / "losses.csv") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[-1]["bad"]) == pytest.approx(sum(f * 1.03 for f in base_final) / 3)
    assert float(rows[-1]["bad/seed2"]) == pytest.approx(2.1 * 1.03)
    with open(tmp_path / "val_losses.csv") as f:
        vrows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in vrows] == [10, 20]
    assert float(vrows[1]["baseline"]) == pytest.approx(2.2)
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_given_one_seed_when_written_expect_no_interval_and_not_separable(tmp_path):
    runs = [_run("baseline", 7, 2.0, 2.2), _run("hybrid", 7, 2.02, 2.21)]
    meta = dict(steps=20, dp=2, tp=1, pp=2, seed=7, seeds=[7], model=dict(hidden=8, layers=2, heads=2, seq_len=8),
                global_batch=4, data="x")
    s = write_all(runs, str(tmp_path), meta)
    h = s["policies"]["hybrid"]
    assert h["final_loss_std"] is None and h["delta_val_pct"]["lo"] is None
    assert h["verdict"] == NOT_SEPARABLE
    assert "(1 seed)" in (tmp_path / "summary.md").read_text()
