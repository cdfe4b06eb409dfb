"""Plot ``python -m ccoll.bench --json`` results: where compression pays and where it stops paying.

    python -m ccoll.bench.plot results/bench/loopback.json -o results/bench/loopback.png

One figure per collective found in the file: left, time per call vs size (log-log), one line per codec;
right, speedup over ``native`` vs size (1.0 = break-even, drawn), when native was measured. A file with
a single size gets bars instead of lines. matplotlib is imported only here (a dev dependency).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from ..units import format_nbytes


def _label_size(nbytes: int) -> str:
    return format_nbytes(nbytes, short=True)


def plot(doc: dict, out: Path, title: str | None = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_coll: dict[str, list[dict]] = defaultdict(list)
    for row in doc["rows"]:
        by_coll[row["collective"]].append(row)
    meta = doc.get("meta", {})
    where = f"{meta.get('world_size', '?')} ranks, {meta.get('backend', '?')}, {meta.get('dtype', '?')}"
    if meta.get("netem"):
        where += f", {meta['netem']}"
    written = []
    for coll, rows in by_coll.items():
        codecs = list(dict.fromkeys(r["codec"] for r in rows))
        sizes = sorted({r["size_bytes"] for r in rows})
        have_speedup = any(r.get("speedup") for r in rows)
        fig, axes = plt.subplots(1, 2 if have_speedup else 1, figsize=(12 if have_speedup else 6.5, 4.5),
                                 squeeze=False)
        ax_t = axes[0][0]
        if len(sizes) == 1:
            times = [next(r["time_us"] for r in rows if r["codec"] == c) / 1e3 for c in codecs]
            ax_t.bar(codecs, times, color="tab:blue")
            ax_t.set_ylabel("time per call (ms)")
            ax_t.set_title(f"{coll}, {_label_size(sizes[0])}")
            ax_t.tick_params(axis="x", rotation=30)
            if have_speedup:
                ax_s = axes[0][1]
                sp = [next(r["speedup"] or 0 for r in rows if r["codec"] == c) for c in codecs]
                ax_s.bar(codecs, sp, color="tab:green")
                ax_s.axhline(1.0, color="black", lw=0.8)
                ax_s.set_ylabel("speedup over native (x)")
                ax_s.tick_params(axis="x", rotation=30)
        else:
            for c in codecs:
                pts = sorted((r["size_bytes"], r["time_us"], r.get("speedup")) for r in rows if r["codec"] == c)
                ax_t.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=c)
                if have_speedup:
                    axes[0][1].plot([p[0] for p in pts], [p[2] for p in pts], marker="o", ms=3, label=c)
            ax_t.set_xscale("log", base=2)
            ax_t.set_yscale("log")
            ax_t.set_xlabel("size (bytes)")
            ax_t.set_ylabel("time per call (us)")
            ax_t.set_title(f"{coll}: time")
            ax_t.set_xticks(sizes, [_label_size(s) for s in sizes])
            ax_t.legend(fontsize=8)
            if have_speedup:
                ax_s = axes[0][1]
                ax_s.axhline(1.0, color="black", lw=0.8)
                ax_s.set_xscale("log", base=2)
                ax_s.set_xticks(sizes, [_label_size(s) for s in sizes])
                ax_s.set_xlabel("size (bytes)")
                ax_s.set_ylabel("speedup over native (x)")
                ax_s.set_title(f"{coll}: speedup (>1: compression pays)")
                ax_s.legend(fontsize=8)
        for row_axes in axes:
            for ax in row_axes:
                ax.grid(True, alpha=0.3)
        fig.suptitle(title or where, fontsize=10)
        fig.tight_layout()
        path = out if len(by_coll) == 1 else out.with_name(f"{out.stem}_{coll}{out.suffix}")
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ccoll.bench.plot", description=__doc__.split("\n\n")[0])
    p.add_argument("json", type=Path)
    p.add_argument("-o", "--out", type=Path, default=None, help="PNG path (default: next to the JSON)")
    p.add_argument("--title", default=None)
    args = p.parse_args(argv)
    doc = json.loads(args.json.read_text())
    for path in plot(doc, args.out or args.json.with_suffix(".png"), args.title):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
