"""The block quantizers' CPU phases against the memory roofline, per backend, in one run.

    python -m ccoll.bench.cpu_codec [--size 64M] [--codecs int8:block=256,int4:block=64]
        [--backends torch,emulated] [--threads 1] [--dtype float32] [--rows 2] [--rounds 5] [--json PATH]

What the data-parallel gradient path runs per all_reduce on a CPU tensor, each timed alone on one
``--size`` tensor:

- ``encode+ef``: ``encode_rows`` with error feedback (x and the residuals read, the residuals and the
  payload written);
- ``decode_sum``: ``decode_sum`` of ``--rows`` payloads of the tensor (each read, one fp32 sum written);
- ``decode``: ``decode_rows`` of one payload into a tensor of ``--dtype``.

Beside them, measured in the same run on buffers of the same size: ``copy`` (``dst.copy_(src)``) and ``add``
(``torch.add(a, b, out=c)``), the rates at which this machine streams memory with as many threads. Each
phase's ``moved_gbs`` counts the bytes it must move at least (above) per second, and ``of_copy`` is that rate
over copy's: 100% is a phase at the memory roofline. ``gbs`` is the tensor's bytes (``--dtype``) per second,
the figure ``ccoll.model`` and ``ccoll.stats.codec_stats()`` use. Rounds are interleaved (every variant once
per round, so load drift hits all alike); the best round is reported, with the machine's load average. The
threads (``--threads``, default 1: a rank's budget when ranks share a node) go to torch and, through the
codec's launch, to the host build's OpenMP team (``ccoll.kernels.call.host_threads``).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from ..codecs import get_codec
from ..units import parse_nbytes

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
COLUMNS = ("variant", "backend", "op", "gbs", "moved_gbs", "of_copy", "ms")


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def variants(args) -> list[tuple[str, str, str, float, object]]:
    """(variant, backend, op, bytes moved, fn) for the roofline rows and every codec x backend x op."""
    dtype = DTYPES[args.dtype]
    numel = args.size // dtype.itemsize
    g = torch.Generator().manual_seed(0)
    x = torch.randn(numel, generator=g).to(dtype)
    src, dst, other = torch.randn(numel, generator=g), torch.empty(numel), torch.randn(numel, generator=g)
    f32 = numel * 4
    out = [
        ("copy", "torch", "copy", 2 * f32, lambda: dst.copy_(src)),
        ("add", "torch", "add", 3 * f32, lambda: torch.add(src, other, out=dst)),
    ]
    for spec in args.codecs:
        for backend in args.backends:
            c = get_codec(spec, backend=backend)
            nbytes = c.encoded_nbytes(numel, dtype)
            payload = torch.empty(1, nbytes, dtype=torch.uint8)
            feedback = torch.zeros(numel, dtype=c.feedback_dtype(dtype))
            c.encode_rows(x, payload, numel, feedback=feedback)
            rows = payload.repeat(args.rows, 1)
            total = torch.empty(numel)
            y = torch.empty(numel, dtype=dtype)
            fb_bytes = 2 * feedback.numel() * feedback.element_size()
            out += [
                (spec, backend, "encode+ef", numel * dtype.itemsize + fb_bytes + nbytes,
                 lambda c=c, p=payload, f=feedback: c.encode_rows(x, p, numel, feedback=f)),
                (spec, backend, "decode_sum", args.rows * nbytes + f32,
                 lambda c=c, r=rows, t=total: c.decode_sum(r, numel, dtype, out=t)),
                (spec, backend, "decode", nbytes + numel * dtype.itemsize,
                 lambda c=c, p=payload: c.decode_rows(p, y, numel)),
            ]
    return out


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()
    todo = variants(args)
    times: list[list[float]] = [[] for _ in todo]
    for _, _, _, _, fn in todo:  # warm-up: builds / loads kernels, faults pages in
        fn()
    for _ in range(args.rounds):
        for i, (_, _, _, _, fn) in enumerate(todo):
            times[i].append(_timed(fn))
    copy_rate = todo[0][3] / min(times[0])
    rows = []
    for (variant, backend, op, moved, _), ts in zip(todo, times):
        t = min(ts)
        rows.append({"variant": variant, "backend": backend, "op": op,
                     "gbs": args.size / t / 1e9, "moved_gbs": moved / t / 1e9,
                     "of_copy": moved / t / copy_rate, "ms": t * 1e3})
    return {"size": args.size, "dtype": args.dtype, "threads": args.threads, "rows_summed": args.rows,
            "rounds": args.rounds, "loadavg_start": load0, "loadavg_end": os.getloadavg(), "rows": rows}


def render(result: dict) -> str:
    w = max(len("variant"), *(len(r["variant"]) for r in result["rows"]))
    lines = [f"# ccoll.bench.cpu_codec: {result['size'] >> 20} MiB of {result['dtype']}, {result['threads']} thread(s), "
             f"decode_sum of {result['rows_summed']} rows, best of {result['rounds']} interleaved rounds",
             f"# load average (1/5/15 min) {' '.join(f'{v:.2f}' for v in result['loadavg_start'])} at start, "
             f"{' '.join(f'{v:.2f}' for v in result['loadavg_end'])} at end",
             "# gbs: tensor bytes per second; moved_gbs: the bytes the phase must move, per second; "
             "of_copy: moved_gbs over copy's",
             f"{'variant':<{w}} {'backend':<9} {'op':<11} {'gbs':>8} {'moved_gbs':>10} {'of_copy':>8} {'ms':>9}"]
    for r in result["rows"]:
        lines.append(f"{r['variant']:<{w}} {r['backend']:<9} {r['op']:<11} {r['gbs']:8.2f} {r['moved_gbs']:10.2f} "
                     f"{r['of_copy']:8.0%} {r['ms']:9.2f}")
    return "\n".join(lines)


def _split_specs(text: str) -> list[str]:
    """Comma-separated specs whose own parameters also use commas: a new spec starts at a word with ':' or
    without '='."""
    specs: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if specs and "=" in part and ":" not in part:
            specs[-1] += "," + part
        else:
            specs.append(part)
    return specs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m ccoll.bench.cpu_codec", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=parse_nbytes, default=parse_nbytes("64M"), help="tensor bytes (default 64M)")
    ap.add_argument("--codecs", type=_split_specs, default=["int8:block=256", "int4:block=64"])
    ap.add_argument("--backends", type=_split_specs, default=["torch", "emulated"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--rows", type=int, default=2, help="payload rows decode_sum adds (default 2: two ranks)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", help="also write the results here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(render(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
