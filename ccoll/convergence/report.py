"""Turn finished runs into losses.csv, loss.png, summary.json and summary.md."""
from __future__ import annotations

import csv
import json
import math
import os

from .runner import RunResult

DIMS = ("dp", "tp", "pp")
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


def summary(results: list[RunResult], meta: dict) -> dict:
    base = final_loss(pick_baseline(results).losses)
    policies = {}
    for r in results:
        fl = final_loss(r.losses)
        policies[r.name] = {
            "final_loss": fl,
            "samples_per_s": r.samples_per_s,
            "steps": len(r.losses),
            "bytes": {d: {"raw": int(r.bytes[d]["raw"]), "wire": int(r.bytes[d]["wire"])} for d in DIMS},
            "delta_vs_baseline_pct": 100.0 * (fl - base) / base if base else float("nan"),
            "compression": {d: _ratio(r.bytes[d]) for d in DIMS},
            "wall_seconds": r.seconds,
            "by_op": _by_op(r.stats),
        }
        grads = [o for o in policies[r.name]["by_op"] if o["dim"] == "dp" and o["op"] in GRADIENT_OPS]
        policies[r.name]["dp_gradients"] = {"raw": sum(o["raw"] for o in grads), "wire": sum(o["wire"] for o in grads)}
    return {"baseline": pick_baseline(results).name, "meta": meta, "policies": policies}


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
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def summary_markdown(s: dict) -> str:
    m = s["meta"]
    lines = [
        f"# Convergence: {', '.join(s['policies'])}",
        "",
        f"{m['steps']} steps, dp={m['dp']} tp={m['tp']} pp={m['pp']}, model {m['model']}, "
        f"global batch {m['global_batch']} x {m['model']['seq_len']} bytes, seed {m['seed']}, data {m['data']}.",
        f"Final loss = mean of the last 10% of steps; bytes summed over all ranks' training steps "
        f"(point-to-point messages counted once, by the sender); dp includes ZeRO-1's parameter all-gather, "
        f"'dp gradients' is the gradient all-reduce/reduce-scatter alone; "
        f"ratio = raw / wire. Baseline: `{s['baseline']}`.",
        "",
        "| policy | final loss | vs baseline | samples/s | " + " | ".join(f"{d} raw | {d} wire | {d} ratio" for d in DIMS)
        + " | dp gradients ratio |",
        "|---|---:|---:|---:|" + "---:|---:|---:|" * len(DIMS) + "---:|",
    ]
    for name, p in s["policies"].items():
        cells = [name, f"{p['final_loss']:.4f}", f"{p['delta_vs_baseline_pct']:+.2f}%", f"{p['samples_per_s']:.2f}"]
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


def write_losses_csv(results: list[RunResult], path: str) -> None:
    steps = max(len(r.losses) for r in results)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", *(r.name for r in results)])
        for i in range(steps):
            w.writerow([i + 1, *(f"{r.losses[i]:.6f}" if i < len(r.losses) else "" for r in results)])


def _smooth(xs: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= window:
            acc -= xs[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_losses(results: list[RunResult], path: str, title: str) -> None:
    """Left: whole run (raw steps faint, moving mean bold). Right: the second half zoomed in, where
    policies that differ by a percent become visible."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, zoom) = plt.subplots(1, 2, figsize=(12, 5), dpi=110, gridspec_kw={"width_ratios": [3, 2]})
    nsteps = max(len(r.losses) for r in results)
    window = max(1, nsteps // 50)
    half = nsteps // 2
    zlo, zhi = float("inf"), float("-inf")
    for i, r in enumerate(results):
        color = f"C{i}"
        steps = list(range(1, len(r.losses) + 1))
        smooth = _smooth(r.losses, window)
        ax.plot(steps, r.losses, color=color, alpha=0.2, linewidth=0.8)
        ax.plot(steps, smooth, color=color, linewidth=1.8, label=f"{r.name} (final {final_loss(r.losses):.3f})")
        zoom.plot(steps[half:], smooth[half:], color=color, linewidth=1.8)
        if smooth[half:]:
            zlo, zhi = min(zlo, min(smooth[half:])), max(zhi, max(smooth[half:]))
    ax.set_xlabel("training step")
    ax.set_ylabel("training loss (cross-entropy, nats/byte)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(title=f"policy (bold: {window}-step mean)" if window > 1 else "policy")
    zoom.set_xlabel("training step")
    zoom.set_title(f"second half, zoomed ({window}-step mean)")
    zoom.grid(True, alpha=0.3)
    if zhi > zlo:
        pad = 0.05 * (zhi - zlo)
        zoom.set_ylim(zlo - pad, zhi + pad)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_all(results: list[RunResult], out_dir: str, meta: dict) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    s = summary(results, meta)
    write_losses_csv(results, os.path.join(out_dir, "losses.csv"))
    title = (f"Byte-level GPT, dp={meta['dp']} tp={meta['tp']} pp={meta['pp']}, "
             f"{meta['model']['layers']}x{meta['model']['hidden']}, {meta['steps']} steps")
    plot_losses(results, os.path.join(out_dir, "loss.png"), title)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(s, f, indent=1)
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(summary_markdown(s))
    with open(os.path.join(out_dir, "stats.json"), "w") as f:
        json.dump({r.name: r.stats for r in results}, f, indent=1)
    return s
