"""Statistics of a multi-seed comparison: mean, spread, paired delta vs baseline with a 95% interval, verdict.

Why paired by seed: runs with the same seed share initial weights and batches, so most of the
seed-to-seed variation cancels in the per-seed difference; the interval is on that difference.

Definitions (``delta`` in percent of the baseline's loss, per seed s: 100 (x_s - b_s) / b_s):

- interval: mean(delta) +- t_{0.975, n-1} * sd(delta) / sqrt(n), a two-sided 95% Student-t interval over
  the n paired seeds (sd with n-1 in the denominator). With one seed there is no interval (None).
- verdict, from the interval [lo, hi] (the first that applies):

  ``within 1%``      -1 < lo and hi < +1: the policy's loss is shown to be within 1% of the baseline's
                     (an equivalence test at a 1% margin; it may still be measurably above or below)
  ``worse``          lo > 0: the loss is higher than the baseline's beyond the seed noise
  ``better``         hi < 0: the loss is lower than the baseline's beyond the seed noise
  ``not separable``  otherwise: the interval contains 0 and reaches beyond 1%, or there is only one
                     seed; more seeds (or steps) are needed to tell
"""
from __future__ import annotations

import math

#: two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)

WITHIN, WORSE, BETTER, NOT_SEPARABLE = "within 1%", "worse", "better", "not separable"
#: the equivalence margin of "within 1%", in percent
MARGIN_PCT = 1.0


def t975(df: int) -> float:
    """t_{0.975, df}: tabulated to df 30, then the Cornish-Fisher expansion around z = 1.95996 (error
    below 1e-3 for df > 30)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_std(xs: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (n-1); the deviation is None for one value."""
    n = len(xs)
    if n == 0:
        raise ValueError("no values")
    m = sum(xs) / n
    if n == 1:
        return m, None
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))


def paired_delta_pct(values: list[float], baseline: list[float]) -> dict:
    """Per-seed relative differences (percent) and their 95% t-interval: {"mean", "lo", "hi", "n", "per_seed"}
    (lo/hi None with one seed)."""
    if len(values) != len(baseline) or not values:
        raise ValueError(f"paired deltas need the same seeds: {len(values)} values vs {len(baseline)} baseline")
    d = [100.0 * (x - b) / b for x, b in zip(values, baseline)]
    m, sd = mean_std(d)
    if sd is None:
        return {"mean": m, "lo": None, "hi": None, "n": 1, "per_seed": d}
    half = t975(len(d) - 1) * sd / math.sqrt(len(d))
    return {"mean": m, "lo": m - half, "hi": m + half, "n": len(d), "per_seed": d}


def verdict(lo: float | None, hi: float | None, margin_pct: float = MARGIN_PCT) -> str:
    """The verdict for a delta interval [lo, hi] in percent (see the module docstring)."""
    if lo is None or hi is None:
        return NOT_SEPARABLE
    if -margin_pct < lo and hi < margin_pct:
        return WITHIN
    if lo > 0:
        return WORSE
    if hi < 0:
        return BETTER
    return NOT_SEPARABLE
