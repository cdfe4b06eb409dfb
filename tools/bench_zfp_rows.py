"""CPU throughput of the zfp batched row API vs a per-row loop (the base class's generic reference), and
of fused error feedback vs separate torch ops. GB/s of fp32 input (64 MiB), best of `--reps`.

    PYTHONPATH=$PWD .venv/bin/python tools/bench_zfp_rows.py [--rows 64] [--mib 64] [--spec zfp:rate=8]
"""
from __future__ import annotations

import argparse
import time

import torch

from ccoll.codecs import get_codec
from ccoll.codecs.base import Codec


def best(fn, reps: int) -> float:
    fn()  # warm-up (host build, allocations)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--spec", default="zfp:rate=8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--backends", default="emulated,torch")
    a = ap.parse_args()
    numel = a.mib * 2**20 // 4
    row_numel = numel // a.rows
    x = torch.randn(numel)
    gb = numel * 4 / 1e9
    for backend in a.backends.split(","):
        c = get_codec(a.spec, backend=backend)
        nbytes = c.encoded_nbytes(row_numel, x.dtype)
        out = torch.empty(a.rows, nbytes, dtype=torch.uint8)
        dec = torch.empty(numel)
        fb = torch.zeros(numel)
        summed = torch.empty(row_numel)
        c.encode_rows(x, out, row_numel)

        def separate_feedback():
            comp = x + fb
            c.encode_rows(comp, out, row_numel)
            c.decode_rows(out, dec, row_numel)
            fb.copy_(comp.sub_(dec).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0))

        rows = {
            "encode_rows": lambda: c.encode_rows(x, out, row_numel),
            "encode per-row loop": lambda: Codec._encode_rows_generic(c, x, out, row_numel, None, 0),
            "decode_rows": lambda: c.decode_rows(out, dec, row_numel),
            "decode per-row loop": lambda: Codec._decode_rows_generic(c, out, dec, row_numel),
            "decode_sum (p rows -> 1)": lambda: c.decode_sum(out, row_numel, x.dtype, out=summed),
            "decode_sum per-row loop": lambda: [summed.zero_()] + [
                summed.add_(c.decode(r, row_numel, x.dtype)) for r in out],
            "encode_rows feedback fused": lambda: c.encode_rows(x, out, row_numel, feedback=fb),
            "feedback separate ops": separate_feedback,
        }
        for name, fn in rows.items():
            t = best(fn, a.reps)
            print(f"{backend:9s} {name:28s} {gb / t:7.3f} GB/s  ({t * 1e3:8.1f} ms)", flush=True)


if __name__ == "__main__":
    main()
