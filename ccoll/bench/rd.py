"""Rate–distortion of every codec on tensors captured from real training (``CCOLL_CAPTURE=DIR``).

    python -m ccoll.bench.rd results/capture [--json rd.json] [--plot rd.png] [--codec SPEC --codec SPEC...]

For every tensor class and every codec spec: ``bits/value`` (encoded bits per value, from the real
payload size), ``rel_l2`` (pooled over the class: sqrt(sum ||x̂ - x||^2 / sum ||x||^2)), ``worst_l2`` (the
largest per-tensor relative L2 error), ``max_blk`` (max over tensors and over fixed 256-value blocks of
max|x̂ - x| / max|x| in that block: the error an outlier-free neighbourhood suffers; the same blocks for
every codec, so it does not favour a codec's own block size) and ``cosine`` (mean over tensors of
cos(x, x̂): what a gradient direction keeps).

Tensor classes (from the capture metadata): ``dp/all_reduce`` and ``dp/reduce_scatter`` (DP gradient
buckets), ``dp/all_gather`` (ZeRO parameter all-gather: weights), ``tp/all_reduce:fwd`` (TP activations:
partial sums of row-parallel layers), ``tp/all_reduce:bwd`` (TP activation gradients), ``tp/all_gather``
(gathered logits), ``pp/send:activation`` (first pipeline stage's sends), ``pp/send:gradient`` (last
stage's sends), ``pp/send`` (middle stages: both).

The codec specs default to zfp rates 2.5–16 with dims 1 and 2, int8 and int4 at several block sizes
(int4 also with stochastic rounding; int4/int8 also with rotate=hadamard), fp8 e4m3/e5m2, bf16, fp16, and one default spec of any other registered codec.
Output in the ``ccoll.bench`` style: ``#`` metadata lines, a header, fixed columns; ``--json`` and a plot
(rel_l2 vs bits/value, one curve per codec family, one panel per class).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict

ZFP_RATES = (2.5, 3, 4, 5, 6, 8, 10, 12, 16)
DEFAULT_SPECS = [
    *(f"zfp:rate={r},dims={d}" for d in (1, 2) for r in ZFP_RATES),
    *(f"int8:block={b}" for b in (32, 256, 4096)),
    *(f"int4:block={b}" for b in (32, 64, 256)),
    *(f"int4:block={b},round=stochastic" for b in (32, 64, 256)),
    *(f"int4:block={b},rotate=hadamard" for b in (32, 64, 256)),
    *(f"int8:block={b},rotate=hadamard" for b in (32, 256)),
    *(f"fp8:format={f},block={b}" for f in ("e4m3", "e5m2") for b in (32, 256)),
    "fp8:format=e4m3,block=32,rotate=hadamard",
    "bf16",
    "fp16",
]
#: block length of the max-error metric (codec-independent)
BLOCK = 256


def tensor_class(meta: dict) -> str:
    """The class a captured tensor belongs to (see the module docstring)."""
    dim, op = meta["dim"], meta["op"]
    if dim == "tp" and op == "all_reduce":
        return f"tp/all_reduce:{'bwd' if meta.get('in_backward') else 'fwd'}"
    if op == "send_recv":
        stage, size = meta.get("pp_stage"), meta.get("pp_size")
        if stage is None or size is None or size < 2 or 0 < stage < size - 1:
            return f"{dim}/send"
        return f"{dim}/send:{'activation' if stage == 0 else 'gradient'}"
    return f"{dim}/{op}"


def default_specs() -> list[str]:
    """DEFAULT_SPECS for registered codecs, plus one default spec of every other registered codec."""
    from ccoll.codecs import CODECS, parse_spec

    known = {parse_spec(s)[0] for s in DEFAULT_SPECS}
    specs = [s for s in DEFAULT_SPECS if parse_spec(s)[0] in CODECS]
    specs += [n for n in CODECS.names() if n not in known and n != "none"]
    return specs


def family(spec: str) -> str:
    """Plot curve of a spec: zfp dims=1 / dims=2, int8, int4 nearest / stochastic, casts together."""
    from ccoll.codecs import parse_spec

    name, params = parse_spec(spec)
    if name == "zfp":
        return f"zfp dims={params.get('dims', '1')}"
    if name == "int4" and params.get("round") == "stochastic":
        return "int4 stochastic"
    if name == "fp8":
        name = f"fp8 {params.get('format', 'e4m3')}"
    if params.get("rotate") == "hadamard":
        return f"{name} hadamard"
    if name in ("bf16", "fp16"):
        return "bf16/fp16"
    return name


def measure(x, codec) -> dict:
    """Distortion of one encode/decode round trip of the 1-D fp32 tensor ``x``: sums for pooling."""
    import torch

    payload = codec.encode(x)
    y = codec.decode(payload, x.numel(), x.dtype).double()
    xd = x.double()
    err = y - xd
    n = x.numel()
    nb = n // BLOCK * BLOCK
    max_blk = 0.0
    if nb:
        amax = xd[:nb].abs().view(-1, BLOCK).amax(1)
        emax = err[:nb].abs().view(-1, BLOCK).amax(1)
        nz = amax > 0
        if bool(nz.any()):
            max_blk = float((emax[nz] / amax[nz]).max())
        if bool((emax[~nz] > 0).any()):
            max_blk = math.inf  # a block of zeros that did not stay zero
    xn, yn = float(xd.norm()), float(y.norm())
    # a variable-size codec's payload is its capacity; what travels is the used part (ccoll/collectives/varsize.py)
    nbytes = codec.used_nbytes(payload.view(1, -1))[0] if codec.variable_size else payload.numel()
    cos = float(torch.dot(xd, y)) / (xn * yn) if xn > 0 and yn > 0 else (1.0 if xn == yn else 0.0)
    return {"bits": nbytes * 8, "numel": n, "err2": float(err.pow(2).sum()), "x2": xn**2,
            "rel_l2": float(err.norm()) / xn if xn > 0 else (0.0 if float(err.norm()) == 0 else math.inf),
            "max_blk": max_blk, "cos": cos}


def evaluate(samples: list[dict], specs: list[str], max_per_class: int = 12) -> list[dict]:
    """One row per (class, spec): bits_per_value, rel_l2, worst_l2, max_blk, cosine, tensors, values."""
    import ccoll

    by_class: dict[str, list] = defaultdict(list)
    for s in samples:
        by_class[tensor_class(s["meta"])].append(s["tensor"].float().reshape(-1).contiguous())
    rows = []
    for cls in sorted(by_class):
        xs = by_class[cls]
        if len(xs) > max_per_class:  # an even spread over the capture (early, middle, late steps)
            xs = [xs[round(i * (len(xs) - 1) / (max_per_class - 1))] for i in range(max_per_class)]
        for spec in specs:
            codec = ccoll.get_codec(spec, backend="torch")
            ms = [measure(x, codec) for x in xs]
            x2 = sum(m["x2"] for m in ms)
            rows.append({
                "class": cls, "codec": spec, "family": family(spec), "tensors": len(ms),
                "values": sum(m["numel"] for m in ms),
                "bits_per_value": sum(m["bits"] for m in ms) / sum(m["numel"] for m in ms),
                "rel_l2": math.sqrt(sum(m["err2"] for m in ms) / x2) if x2 > 0 else 0.0,
                "worst_l2": max(m["rel_l2"] for m in ms),
                "max_blk": max(m["max_blk"] for m in ms),
                "cosine": sum(m["cos"] for m in ms) / len(ms),
            })
    return rows


def describe(samples: list[dict]) -> list[dict]:
    """Per class: how many tensors, values, steps and ranks were captured and how heavy-tailed they are
    (kurtosis: 3 for a Gaussian) -- the context in which the table is read."""
    import torch

    acc: dict[str, dict] = {}
    for s in samples:
        cls = tensor_class(s["meta"])
        a = acc.setdefault(cls, {"class": cls, "tensors": 0, "values": 0, "steps": set(), "ranks": set(), "kurt": []})
        x = s["tensor"].double().reshape(-1)
        a["tensors"] += 1
        a["values"] += x.numel()
        a["steps"].add(s["meta"]["step"])
        a["ranks"].add(s["meta"]["rank"])
        c = x - x.mean()
        var = float(c.pow(2).mean())
        a["kurt"].append(float(c.pow(4).mean()) / var**2 if var > 0 else float("nan"))
    out = []
    for a in acc.values():
        k = torch.tensor(a["kurt"])
        out.append({"class": a["class"], "tensors": a["tensors"], "values": a["values"], "steps": sorted(a["steps"]),
                    "ranks": sorted(a["ranks"]), "kurtosis_median": float(k.nanmedian())})
    return sorted(out, key=lambda r: r["class"])


def print_table(rows: list[dict], classes: list[dict], directory: str, file=None) -> None:
    file = sys.stdout if file is None else file
    print(f"# ccoll.bench.rd: rate-distortion on captured training tensors from {directory}", file=file)
    for c in classes:
        print(f"# class {c['class']}: {c['tensors']} tensors, {c['values']} values, steps {c['steps']}, "
              f"ranks {c['ranks']}, median kurtosis {c['kurtosis_median']:.1f}", file=file)
    print(f"# rel_l2 pooled over the class; max_blk = max |err| / max|x| over {BLOCK}-value blocks; cosine = mean",
          file=file)
    head = f"{'class':<22} {'codec':<34} {'bits/value':>10} {'rel_l2':>10} {'worst_l2':>10} {'max_blk':>10} {'cosine':>10}"
    print(f"#{head}", file=file)
    print(f"#{'':<22} {'':<34} {'(bits)':>10} {'':>10} {'':>10} {'':>10} {'':>10}", file=file)
    for r in rows:
        print(f" {r['class']:<22} {r['codec']:<34} {r['bits_per_value']:>10.3f} {r['rel_l2']:>10.3e} "
              f"{r['worst_l2']:>10.3e} {r['max_blk']:>10.3e} {r['cosine']:>10.6f}", file=file)


def plot(rows: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    classes = sorted({r["class"] for r in rows})
    ncol = min(3, len(classes))
    nrow = math.ceil(len(classes) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 4.2 * nrow), squeeze=False)
    families = list(dict.fromkeys(r["family"] for r in rows))
    for i, cls in enumerate(classes):
        ax = axes[i // ncol][i % ncol]
        for j, fam in enumerate(families):
            pts = sorted((r["bits_per_value"], r["rel_l2"]) for r in rows if r["class"] == cls and r["family"] == fam)
            pts = [(b, e) for b, e in pts if e > 0]
            if pts:
                ax.plot(*zip(*pts), marker="o", color=f"C{j}", label=fam, linewidth=1.4, markersize=4)
        ax.set_yscale("log")
        ax.set_xlabel("bits per value")
        ax.set_ylabel("relative L2 error")
        ax.set_title(cls)
        ax.grid(True, alpha=0.3, which="both")
    for k in range(len(classes), nrow * ncol):
        axes[k // ncol][k % ncol].axis("off")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ccoll.bench.rd", description=__doc__.split("\n\n")[0])
    p.add_argument("directory", help="a CCOLL_CAPTURE directory (searched recursively for .pt samples)")
    p.add_argument("--codec", action="append", default=None,
                   help="codec spec (repeatable; or several separated by ';'); default: the built-in sweep")
    p.add_argument("--json", default=None, help="write rows and class descriptions here")
    p.add_argument("--plot", default=None, help="write the rate-distortion plot here (png)")
    p.add_argument("--max-per-class", type=int, default=12, help="tensors per class (evenly spread) at most")
    args = p.parse_args(argv)
    from ccoll.capture import load
    from ccoll.errors import CcollError

    samples = load(args.directory)
    if not samples:
        print(f"error: no captured tensors (*.pt) under {args.directory}", file=sys.stderr)
        return 2
    try:
        specs = default_specs() if args.codec is None else [s.strip() for a in args.codec for s in a.split(";") if s.strip()]
        rows = evaluate(samples, specs, args.max_per_class)
    except CcollError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    classes = describe(samples)
    print_table(rows, classes, args.directory)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"directory": args.directory, "classes": classes, "rows": rows}, f, indent=1)
    if args.plot:
        plot(rows, args.plot, f"rate-distortion on captured tensors ({args.directory})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
