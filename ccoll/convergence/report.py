"""Turn finished runs into losses.csv, loss.png, summary.json and summary.md."""
from __future__ import annotations

import csv
import json
import math
import os

from ..policy import DENSE_DIMS
from ..units import human_nbytes
from .compare import mean_std, paired_delta_pct, verdict
from .runner import RunResult

DIMS = DENSE_DIMS
#: DP ops that carry gradients (the rest of DP traffic is ZeRO's parameter all-gather and broadcasts)
GRADIENT_OPS = ("all_reduce", "reduce_scatter")


def final_loss(losses: list[float]) -> float:
    """Mean over the last 10% of steps (at least one): less noisy than the last step alone."""
    n = max(1, math.ceil(0.1 * len(losses)))
    tail = losses[-n:]
    return sum(tail) / len(tail)


def pick_baseline(results: list[RunResult]) -> RunResult:
    """The run whose policy stem is "baseline", else the first one given."""
    return next((r for r in results if r.name == "baseline"), results[0])


def group_runs(results: list[RunResult]) -> dict[str, list[RunResult]]:
    """Runs per policy name (in first-seen order), each list sorted by seed."""
    groups: dict[str, list[RunResult]] = {}
    for r in results:
        groups.setdefault(r.name, []).append(r)
    return {k: sorted(v, key=lambda r: r.seed) for k, v in groups.items()}


def final_val_loss(r: RunResult) -> float | None:
    """The held-out loss of the last evaluation (after the last step), or None if none was run."""
    return float(r.val_losses[-1][1]) if r.val_losses else None


def _delta(runs: list[RunResult], base: list[RunResult], metric) -> dict | None:
    """Paired delta over the seeds both policies ran (see compare.py); None without common seeds/values."""
    by_seed = {r.seed: metric(r) for r in base}
    pairs = [(metric(r), by_seed[r.seed]) for r in runs if r.seed in by_seed]
    pairs = [(x, b) for x, b in pairs if x is not None and b is not None]
    if not pairs:
        return None
    return paired_delta_pct([x for x, _ in pairs], [b for _, b in pairs])


def summary(results: list[RunResult], meta: dict) -> dict:
    """Per policy: mean/sd over seeds of final train and held-out loss, paired delta vs baseline with its
    95% interval and verdict (held-out loss when measured, else train loss), bytes of one run."""
    groups = group_runs(results)
    base_name = pick_baseline(results).name
    base = groups[base_name]
    policies = {}
    for name, runs in groups.items():
        first = runs[0]
        train = [final_loss(r.losses) for r in runs]
        vals = [final_val_loss(r) for r in runs]
        fl, fl_sd = mean_std(train)
        fv, fv_sd = mean_std(vals) if all(v is not None for v in vals) else (None, None)
        d_train = _delta(runs, base, lambda r: final_loss(r.losses))
        d_val = _delta(runs, base, final_val_loss)
        decisive = d_val if d_val is not None else d_train
        p = {
            "seeds": [r.seed for r in runs],
            "final_loss": fl,
            "final_loss_std": fl_sd,
            "final_val_loss": fv,
            "final_val_loss_std": fv_sd,
            "samples_per_s": sum(r.samples_per_s for r in runs) / len(runs),
            "steps": len(first.losses),
            "delta_vs_baseline_pct": d_train["mean"] if d_train else float("nan"),
            "delta_train_pct": d_train,
            "delta_val_pct": d_val,
            "verdict": "baseline" if name == base_name else (verdict(decisive["lo"], decisive["hi"]) if decisive else None),
            "verdict_on": "held-out loss" if d_val is not None else "train loss",
            "per_seed": [{"seed": r.seed, "final_loss": final_loss(r.losses), "final_val_loss": final_val_loss(r),
                          "samples_per_s": r.samples_per_s, "wall_seconds": r.seconds} for r in runs],
            # traffic of one run (the first seed): every seed moves the same tensors
            "bytes": {d: {"raw": int(first.bytes[d]["raw"]), "wire": int(first.bytes[d]["wire"])} for d in DIMS},
            "compression": {d: _ratio(first.bytes[d]) for d in DIMS},
            "wall_seconds": sum(r.seconds for r in runs),
            "by_op": _by_op(first.stats),
            "codec_in_run": codec_in_run(runs),
        }
        grads = [o for o in p["by_op"] if o["dim"] == "dp" and o["op"] in GRADIENT_OPS]
        p["dp_gradients"] = {"raw": sum(o["raw"] for o in grads), "wire": sum(o["wire"] for o in grads)}
        policies[name] = p
    return {"baseline": base_name, "meta": meta, "policies": policies}


def codec_in_run(runs: list) -> dict | None:
    """The codec's throughput in the runs themselves (host clock around every batched codec call of
    steps 2.., all ranks and seeds pooled), and its seconds per step (mean and slowest rank): the codec
    under the contention training really puts on it. None when nothing was encoded on a host."""
    per_rank = [c for r in runs for c in r.codec]
    enc = [sum(c["encode"][k] for c in per_rank) for k in ("nbytes", "seconds")]
    dec = [sum(c["decode"][k] for c in per_rank) for k in ("nbytes", "seconds")]
    if not per_rank or enc[1] <= 0:
        return None
    steps = [max(1, len(r.losses) - 1) for r in runs for _ in r.codec]
    per_step = [(c["encode"]["seconds"] + c["decode"]["seconds"]) / n for c, n in zip(per_rank, steps)]
    return {"encode_gbps": enc[0] / enc[1] / 1e9, "decode_gbps": dec[0] / dec[1] / 1e9 if dec[1] > 0 else None,
            "seconds_per_step_mean": sum(per_step) / len(per_step), "seconds_per_step_max": max(per_step)}


def _by_op(rows: list[dict]) -> list[dict]:
    """Stats summed over ranks per (dim, op, codec): shows e.g. DP gradients apart from ZeRO's param gathers."""
    acc: dict[tuple[str, str, str], dict] = {}
    for row in rows:
        key = (row["dim"], row["op"], row["codec"])
        a = acc.setdefault(key, {"dim": key[0], "op": key[1], "codec": key[2], "calls": 0, "raw": 0, "wire": 0,
                                 "seconds": 0.0})
        a["calls"] += int(row["calls"])
        a["raw"] += int(row["raw_bytes"])
        a["wire"] += int(row["wire_bytes"])
        a["seconds"] += float(row["seconds"])
    return [acc[k] for k in sorted(acc)]


def _ratio(b: dict) -> float | None:
    return b["raw"] / b["wire"] if b["wire"] else None


def _fmt_bytes(n: int) -> str:
    return human_nbytes(n, digits=1)


def _fmt_mean_sd(m: float | None, sd: float | None) -> str:
    if m is None:
        return "-"
    return f"{m:.4f}" if sd is None else f"{m:.4f} ± {sd:.4f}"


def _fmt_delta(d: dict | None) -> str:
    if d is None:
        return "-"
    if d["lo"] is None:
        return f"{d['mean']:+.2f}% (1 seed)"
    return f"{d['mean']:+.2f}% [{d['lo']:+.2f}, {d['hi']:+.2f}]"


def summary_markdown(s: dict) -> str:
    m = s["meta"]
    seeds = m.get("seeds") or [m["seed"]]
    lines = [
        f"# Convergence: {', '.join(s['policies'])}",
        "",
        f"{m['steps']} steps, dp={m['dp']} tp={m['tp']} pp={m['pp']}, model {m['model']}, "
        f"global batch {m['global_batch']} x {m['model']['seq_len']} bytes, seeds {seeds}, data {m['data']}.",
        "Loss columns: mean ± standard deviation over seeds. Train loss = mean of the last 10% of steps; held-out "
        "loss = the last evaluation (after the last step) on the same fixed held-out batches for every run. "
        "'vs baseline' = per-seed relative difference (paired by seed), mean and [95% t-interval]. Verdict "
        f"(on {next((p['verdict_on'] for p in s['policies'].values()), 'held-out loss')}): 'within 1%' = interval "
        "inside (-1%, +1%); else 'worse' = interval above 0; 'better' = below 0; 'not separable' = otherwise "
        "(or one seed).",
        f"Bytes: one run (first seed), summed over all ranks' training steps (point-to-point messages counted "
        f"once, by the sender; evaluation traffic excluded); dp includes ZeRO-1's parameter all-gather, "
        f"'dp gradients' is the gradient all-reduce/reduce-scatter alone; ratio = raw / wire. Baseline: "
        f"`{s['baseline']}`.",
        "",
        "| policy | seeds | train loss | held-out loss | held-out vs baseline | verdict | train vs baseline | samples/s | "
        + " | ".join(f"{d} raw | {d} wire | {d} ratio" for d in DIMS) + " | dp gradients ratio |",
        "|---|---:|---:|---:|---:|---|---:|---:|" + "---:|---:|---:|" * len(DIMS) + "---:|",
    ]
    for name, p in s["policies"].items():
        cells = [name, str(len(p["seeds"])), _fmt_mean_sd(p["final_loss"], p["final_loss_std"]),
                 _fmt_mean_sd(p["final_val_loss"], p["final_val_loss_std"]), _fmt_delta(p["delta_val_pct"]),
                 p["verdict"] or "-", _fmt_delta(p["delta_train_pct"]), f"{p['samples_per_s']:.2f}"]
        for d in DIMS:
            b, r = p["bytes"][d], p["compression"][d]
            cells += [_fmt_bytes(b["raw"]), _fmt_bytes(b["wire"]), "-" if r is None else f"{r:.2f}x"]
        r = _ratio(p["dp_gradients"])
        cells.append("-" if r is None else f"{r:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Traffic by operation (all ranks; calls below the policy's min_bytes stay native; seconds = time "
              "inside the call, including waiting for peers and, for compressed calls, encoding/decoding):", "",
              "| policy | dim | op | codec | calls | raw | wire | ratio | seconds (sum over ranks) |",
              "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for name, p in s["policies"].items():
        for o in p.get("by_op", []):
            r = _ratio(o)
            lines.append(f"| {name} | {o['dim']} | {o['op']} | {o['codec']} | {o['calls']} | {_fmt_bytes(o['raw'])} | "
                         f"{_fmt_bytes(o['wire'])} | {'-' if r is None else f'{r:.2f}x'} | {o['seconds']:.2f} |")
    return "\n".join(lines) + "\n"


def _mean_curve(curves: list[list[float]]) -> list[float]:
    n = min(len(c) for c in curves)
    return [sum(c[i] for c in curves) / len(curves) for i in range(n)]


def write_losses_csv(results: list[RunResult], path: str) -> None:
    """One row per step: each policy's mean over seeds, then every run as ``<policy>/seed<S>``."""
    groups = group_runs(results)
    steps = max(len(r.losses) for r in results)
    means = {k: _mean_curve([r.losses for r in v]) for k, v in groups.items()}
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", *groups, *(f"{r.name}/seed{r.seed}" for v in groups.values() for r in v)])
        for i in range(steps):
            row = [i + 1, *(f"{m[i]:.6f}" if i < len(m) else "" for m in means.values())]
            row += [f"{r.losses[i]:.6f}" if i < len(r.losses) else "" for v in groups.values() for r in v]
            w.writerow(row)


def write_val_csv(results: list[RunResult], path: str) -> None:
    """Held-out loss per evaluation step: each policy's mean over seeds, then every run."""
    groups = group_runs(results)
    steps = sorted({int(s) for r in results for s, _ in r.val_losses})
    runs = [r for v in groups.values() for r in v]
    at = {(r.name, r.seed): {int(s): v for s, v in r.val_losses} for r in runs}
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", *groups, *(f"{r.name}/seed{r.seed}" for r in runs)])
        for step in steps:
            row = [step]
            for name, v in groups.items():
                xs = [at[(name, r.seed)].get(step) for r in v]
                row.append(f"{sum(xs) / len(xs):.6f}" if all(x is not None for x in xs) else "")
            row += [f"{at[(r.name, r.seed)][step]:.6f}" if step in at[(r.name, r.seed)] else "" for r in runs]
            w.writerow(row)


def _smooth(xs: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= window:
            acc -= xs[i - window]
        out.append(acc / min(i + 1, window))
    return out


def _band(curves: list[list[float]]) -> tuple[list[float], list[float], list[float]]:
    """Mean and mean -/+ one standard deviation over seeds, point by point (no band for one seed)."""
    n = min(len(c) for c in curves)
    mean, lo, hi = [], [], []
    for i in range(n):
        m, sd = mean_std([c[i] for c in curves])
        sd = sd or 0.0
        mean.append(m)
        lo.append(m - sd)
        hi.append(m + sd)
    return mean, lo, hi


def plot_losses(results: list[RunResult], path: str, title: str) -> None:
    """Left: training loss, moving mean over steps, mean over seeds with a +-1 sd band. Middle: its second
    half zoomed in, where policies that differ by a percent become visible. Right: held-out loss at each
    evaluation, mean over seeds with a +-1 sd band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = group_runs(results)
    fig, (ax, zoom, val) = plt.subplots(1, 3, figsize=(16, 5), dpi=110, gridspec_kw={"width_ratios": [3, 2, 2]})
    nsteps = max(len(r.losses) for r in results)
    window = max(1, nsteps // 50)
    half = nsteps // 2
    zlo, zhi = float("inf"), float("-inf")
    for i, (name, runs) in enumerate(groups.items()):
        color = f"C{i}"
        mean, lo, hi = _band([_smooth(r.losses, window) for r in runs])
        steps = list(range(1, len(mean) + 1))
        fl = sum(final_loss(r.losses) for r in runs) / len(runs)
        ax.plot(steps, mean, color=color, linewidth=1.8, label=f"{name} (final {fl:.3f}, {len(runs)} seed(s))")
        ax.fill_between(steps, lo, hi, color=color, alpha=0.2, linewidth=0)
        zoom.plot(steps[half:], mean[half:], color=color, linewidth=1.8)
        zoom.fill_between(steps[half:], lo[half:], hi[half:], color=color, alpha=0.2, linewidth=0)
        if mean[half:]:
            zlo, zhi = min(zlo, min(lo[half:])), max(zhi, max(hi[half:]))
        if all(r.val_losses for r in runs):
            vsteps = [int(s) for s, _ in runs[0].val_losses]
            vmean, vlo, vhi = _band([[v for _, v in r.val_losses] for r in runs])
            val.plot(vsteps[:len(vmean)], vmean, color=color, marker="o", linewidth=1.8, label=name)
            val.fill_between(vsteps[:len(vmean)], vlo, vhi, color=color, alpha=0.2, linewidth=0)
    ax.set_xlabel("training step")
    ax.set_ylabel("training loss (cross-entropy, nats/byte)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(title=f"mean over seeds ({window}-step mean), band ±1 sd")
    zoom.set_xlabel("training step")
    zoom.set_title(f"second half, zoomed ({window}-step mean)")
    zoom.grid(True, alpha=0.3)
    if zhi > zlo:
        pad = 0.05 * (zhi - zlo)
        zoom.set_ylim(zlo - pad, zhi + pad)
    val.set_xlabel("training step")
    val.set_ylabel("held-out loss")
    val.set_title("held-out loss (mean over seeds, band ±1 sd)")
    val.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_all(results: list[RunResult], out_dir: str, meta: dict) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    s = summary(results, meta)
    write_losses_csv(results, os.path.join(out_dir, "losses.csv"))
    write_val_csv(results, os.path.join(out_dir, "val_losses.csv"))
    title = (f"Byte-level GPT, dp={meta['dp']} tp={meta['tp']} pp={meta['pp']}, "
             f"{meta['model']['layers']}x{meta['model']['hidden']}, {meta['steps']} steps")
    os.makedirs(out_dir, exist_ok=True)
    plot_losses(results, os.path.join(out_dir, "loss.png"), title)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(s, f, indent=1)
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(summary_markdown(s))
    with open(os.path.join(out_dir, "stats.json"), "w") as f:
        # one run per policy (the first seed), as the summary's bytes
        json.dump({k: v[0].stats for k, v in group_runs(results).items()}, f, indent=1)
    return s
