"""Codec benchmark (used by `make bench`; a measurement, not a test).

(a) Rate-distortion on the same data for every codec family: bits/value, relative L2 error, max abs error
    (absolute and relative to max|x|), on Gaussian, heavy-tailed (Student-t, df=2) and log-normal-scaled
    data (gradient-like: magnitudes spread over decades), 2^22 values each, fp32.
(b) CPU throughput: GB/s of fp32 input, 64 MiB, encode and decode, per backend ("torch", "emulated"), with
    1 and 2 threads. "wall" is elapsed time (best of --repeat); "cpu" is input bytes per CPU-second of this
    process (user + sys, so page faults count) -- on a loaded machine that is the per-core figure.

(c) With --rows P: the batched API at P rows of the same tensor (1 thread unless --threads), GB/s of fp32
    input per CPU-second: encode_rows, encode_rows with error feedback, decode_rows, decode_sum (P payloads of numel/P
    values), each beside the per-row loop it replaces (the base class's reference loop: one encode /
    decode per row; with feedback compensate + encode + decode + subtract as separate ops per row).

(d) With --all-reduce P: the codec calls flat.all_reduce makes on one rank of P for an fp32 tensor of
    --tp-numel values, with the shapes it makes them (segments.py's segments and chunks; two ranks take the
    one-exchange path of ccoll/collectives/small.py instead), every segment in its own part of
    tensor-sized buffers, one thread: GB/s of fp32 values per CPU-second, per op, and the sum over the
    call -- the codec CPU time a rank spends per all_reduce.

Only the generic API is used (ccoll.get_codec(spec, backend=...)); specs whose codec is not registered
are skipped with a note. Fresh-page faults dominate decode on machines where they are expensive (VMs):
run with THP_MEM_ALLOC_ENABLE=1 (torch then asks for transparent huge pages) to see the codec itself.

    python tools/bench_codecs.py [--quick] [--json results/bench_codecs.json]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import ccoll  # noqa: E402
from ccoll.codecs import CODECS, example_specs, parse_spec  # noqa: E402
from ccoll.errors import CcollError  # noqa: E402

#: rate-distortion: every registered codec's example specs (Codec.example_specs), then a sweep of rates and
#: block sizes for the curves
RD_SPECS = [
    *(s for s in example_specs() if ccoll.get_codec(s).lossy),
    *(f"zfp:rate={r},dims=1" for r in (4, 8, 12, 16)),
    *(f"zfp:rate={r},dims=2" for r in (2, 4, 8, 12, 16)),
    *(f"int8:block={b}" for b in (32, 256, 4096)),
    *(f"int4:block={b}" for b in (32, 64, 256)),
    "int4:block=64,round=stochastic",
    *(f"int4:block={b},rotate=hadamard" for b in (32, 64, 256)),
    "int8:block=256,rotate=hadamard",
    *(f"fp8:format={f},block={b}" for f in ("e4m3", "e5m2") for b in (32, 256)),
    "bf16",
    "fp16",
]
#: throughput: every registered codec's example specs
TP_SPECS = example_specs()


def datasets(numel: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    gauss = torch.randn(numel, generator=g)
    # Student-t with df=2: z / sqrt(chi2_2 / 2), chi2_2 = -2 log U
    u = torch.rand(numel, generator=g).clamp_min_(1e-12)
    student = torch.randn(numel, generator=g) / torch.sqrt(-torch.log(u))
    lognormal = torch.randn(numel, generator=g) * torch.exp(2.0 * torch.randn(numel, generator=g))
    return {"gaussian": gauss, "student_t_df2": student, "lognormal_scaled": lognormal}


def available(spec: str) -> bool:
    name, _ = parse_spec(spec)
    if name not in CODECS:
        print(f"# note: codec {name!r} is not registered yet; skipping {spec}")
        return False
    return True


def rate_distortion(numel: int) -> list[dict]:
    rows = []
    specs = [s for s in dict.fromkeys(RD_SPECS) if available(s)]
    for data_name, x in datasets(numel).items():
        xd = x.double()
        norm, xmax = float(xd.norm()), float(xd.abs().max())
        print(f"\n### rate-distortion: {data_name}, {numel} fp32 values (max|x| = {xmax:.3g})\n")
        print("| codec | bits/value | rel L2 error | max abs error | max abs error / max abs x |")
        print("|---|---:|---:|---:|---:|")
        for spec in specs:
            codec = ccoll.get_codec(spec, backend="torch")
            try:
                payload = codec.encode(x)
            except CcollError as e:
                print(f"| {spec} | - | skipped: {e} | | |")
                continue
            y = codec.decode(payload, numel, torch.float32).double()
            err = (y - xd).abs()
            row = {
                "data": data_name, "spec": spec, "bits_per_value": 8 * payload.numel() / numel,
                "rel_l2": float((y - xd).norm()) / norm, "max_abs": float(err.max()),
                "max_abs_rel": float(err.max()) / xmax,
            }
            rows.append(row)
            print(f"| {spec} | {row['bits_per_value']:.3f} | {row['rel_l2']:.3e} | {row['max_abs']:.3e} | "
                  f"{row['max_abs_rel']:.3e} |")
    return rows


def _set_threads(n: int) -> None:
    torch.set_num_threads(n)
    try:  # the emulated backend's OpenMP runtime (the system libgomp its .so links against)
        ctypes.CDLL("libgomp.so.1").omp_set_num_threads(n)
    except OSError:
        pass


def _time(fn, repeat: int) -> tuple[float, float]:
    """(best wall seconds, CPU seconds of that same run)."""
    fn()  # warm-up: builds / loads kernels, faults in code paths
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        w, c = time.perf_counter() - w0, time.process_time() - c0
        if w < best[0]:
            best = (w, c)
    return best


def throughput(numel: int, threads: list[int], backends: list[str], repeat: int, only: list[str] | None = None) -> list[dict]:
    rows = []
    x = torch.randn(numel)
    nbytes = x.numel() * x.element_size()
    print(f"\n### CPU throughput: GB/s of fp32 input, {nbytes >> 20} MiB, best of {repeat} "
          f"(wall = elapsed; cpu = per CPU-second of this process)\n")
    print("| codec | backend | threads | encode wall | encode cpu | decode wall | decode cpu |")
    print("|---|---|---:|---:|---:|---:|---:|")
    specs = [s for s in (only or TP_SPECS) if available(s)]
    for nthreads in threads:
        _set_threads(nthreads)
        for spec in specs:
            for backend in backends:
                try:
                    codec = ccoll.get_codec(spec, backend=backend)
                    payload = codec.encode(x)
                except CcollError as e:
                    print(f"| {spec} | {backend} | {nthreads} | skipped: {e} | | | |")
                    continue
                enc = _time(lambda: codec.encode(x), repeat)
                dec = _time(lambda: codec.decode(payload, numel, torch.float32), repeat)
                row = {
                    "spec": spec, "backend": backend, "threads": nthreads,
                    "encode_wall_gbs": nbytes / enc[0] / 1e9, "encode_cpu_gbs": nbytes / max(enc[1], 1e-9) / 1e9,
                    "decode_wall_gbs": nbytes / dec[0] / 1e9, "decode_cpu_gbs": nbytes / max(dec[1], 1e-9) / 1e9,
                }
                rows.append(row)
                print(f"| {spec} | {backend} | {nthreads} | {row['encode_wall_gbs']:.2f} | {row['encode_cpu_gbs']:.2f} | "
                      f"{row['decode_wall_gbs']:.2f} | {row['decode_cpu_gbs']:.2f} |", flush=True)
    if "none" in specs:
        print("\n(none: encode/decode of contiguous input return views, no copy -- its figures are call overhead)")
    return rows


def rows_throughput(numel: int, p: int, specs: list[str], backends: list[str], repeat: int) -> list[dict]:
    from ccoll.codecs.base import Codec

    x = torch.randn(numel)
    row = -(-numel // p)
    nbytes = numel * x.element_size()
    print(f"\n### batched API, {p} rows of a {nbytes >> 20} MiB fp32 tensor: GB/s per CPU-second (a loaded machine's "
          f"per-core figure), batched vs per-row loop\n")
    print("| codec | backend | op | batched | per-row loop | speedup |")
    print("|---|---|---|---:|---:|---:|")
    out_rows = []
    for spec in [s for s in specs if available(s)]:
        for backend in backends:
            c = ccoll.get_codec(spec, backend=backend)
            enc = torch.empty(p, c.encoded_nbytes(row, x.dtype), dtype=torch.uint8)
            fb = torch.zeros(p * row)
            y = torch.empty(numel)
            c.encode_rows(x, enc, row)
            ops = {  # name: (batched, per-row loop)
                "encode_rows": (lambda: c.encode_rows(x, enc, row),
                                lambda: Codec._encode_rows_generic(c, x, enc, row, None, 0)),
                "encode_rows+feedback": (lambda: c.encode_rows(x, enc, row, feedback=fb),
                                         lambda: Codec._encode_rows_generic(c, x, enc, row, fb, 0)),
                "decode_rows": (lambda: c.decode_rows(enc, y, row),
                                lambda: Codec._decode_rows_generic(c, enc, y, row)),
                "decode_sum": (lambda: c.decode_sum(enc, row, x.dtype, out=y[:row]),
                               lambda: sum(c.decode(r, row, x.dtype) for r in enc)),
            }
            for op, (batched, loop) in ops.items():
                tb, tl = _time(batched, repeat)[1], _time(loop, repeat)[1]
                r = {"spec": spec, "backend": backend, "op": op, "rows": p,
                     "batched_gbs": nbytes / tb / 1e9, "loop_gbs": nbytes / tl / 1e9}
                out_rows.append(r)
                print(f"| {spec} | {backend} | {op} | {r['batched_gbs']:.2f} | {r['loop_gbs']:.2f} | {tl / tb:.2f}x |",
                      flush=True)
    return out_rows


def all_reduce_ops(numel: int, p: int, specs: list[str], backends: list[str], repeat: int,
                   feedback: bool) -> list[dict]:
    """Table (d): flat.all_reduce's codec calls over every segment of a ``numel``-value tensor, one op at
    a time (CPU seconds, best of ``repeat``). Each segment reads and writes its own part of tensor-sized
    buffers, as the collective does, so the data comes from memory rather than from a warm cache."""
    from ccoll.collectives.segments import segments

    print(f"\n### all_reduce's codec calls on one rank of {p}, {numel * 4 >> 20} MiB fp32"
          f"{' with error feedback' if feedback else ''}: GB/s of fp32 values per CPU-second\n")
    print("| codec | backend | encode (scatter) | decode_sum | encode (reduced) | decode_rows | call codec ms |")
    print("|---|---|---:|---:|---:|---:|---:|")
    out_rows = []
    x = torch.randn(numel)
    for spec in [s for s in specs if available(s)]:
        for backend in backends:
            c = ccoll.get_codec(spec, backend=backend)
            segs = segments(numel, p, 4, c.align_numel)
            scatter_rows = p  # flat.all_reduce encodes every chunk (two ranks take ccoll.collectives.small instead)
            send, gathered, acc, fb_scatter, fb_reduced = [], [], [], [], []
            for lo, seg_numel, chunk in segs:  # per segment, as flat.all_reduce allocates them
                nbytes = c.encoded_nbytes(chunk, x.dtype)
                send.append(c.encode_rows(x[lo:lo + seg_numel], torch.empty(p, nbytes, dtype=torch.uint8), chunk))
                gathered.append(c.encode_rows(x[lo:lo + seg_numel], torch.empty(p, nbytes, dtype=torch.uint8), chunk))
                acc.append(torch.empty(chunk))
                fb_scatter.append(torch.zeros(scatter_rows * chunk) if feedback else None)
                fb_reduced.append(torch.zeros(chunk) if feedback else None)
            out = torch.empty(numel)

            def every_segment(call):
                return lambda: [call(i, lo, seg_numel, chunk) for i, (lo, seg_numel, chunk) in enumerate(segs)]

            def src(lo, seg_numel, chunk):  # what flat.all_reduce encodes (the padded tail of a short segment too)
                return x[lo:min(lo + seg_numel, lo + scatter_rows * chunk)]

            ops = {  # op: (all segments, fp32 values they handle)
                "encode (scatter)": (every_segment(lambda i, lo, m, chunk: c.encode_rows(
                    src(lo, m, chunk), send[i][:scatter_rows], chunk, feedback=fb_scatter[i])),
                    sum(scatter_rows * ch for _, _, ch in segs)),
                "decode_sum": (every_segment(lambda i, lo, m, chunk: c.decode_sum(
                    send[i][:scatter_rows], chunk, x.dtype, out=acc[i])), sum(scatter_rows * ch for _, _, ch in segs)),
                "encode (reduced)": (every_segment(lambda i, lo, m, chunk: c.encode_rows(
                    acc[i], send[i][:1], chunk, feedback=fb_reduced[i])), sum(ch for _, _, ch in segs)),
                "decode_rows": (every_segment(lambda i, lo, m, chunk: c.decode_rows(
                    gathered[i], out[lo:lo + m], chunk)), numel),
            }
            r = {"spec": spec, "backend": backend, "ranks": p, "numel": numel, "feedback": feedback, "call_ms": 0.0}
            for op, (fn, values) in ops.items():
                cpu = _time(fn, repeat)[1]
                r[op] = values * 4 / cpu / 1e9
                r["call_ms"] += cpu * 1e3
            out_rows.append(r)
            print(f"| {spec} | {backend} | " + " | ".join(f"{r[op]:.2f}" for op in ops) + f" | {r['call_ms']:.1f} |",
                  flush=True)
    return out_rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rd-numel", type=int, default=1 << 22, help="values per rate-distortion data set")
    ap.add_argument("--tp-numel", type=int, default=1 << 24, help="fp32 values for throughput (2^24 = 64 MiB)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--backends", default="torch,emulated")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--specs", help="semicolon-separated codec specs for the throughput table (default: all)")
    ap.add_argument("--skip-rd", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--rows", type=int, help="also measure the batched API at this many rows (table c)")
    ap.add_argument("--all-reduce", type=int, metavar="P",
                    help="also measure flat.all_reduce's codec calls on one rank of P (table d)")
    ap.add_argument("--feedback", action="store_true", help="table (d) with error feedback")
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = ap.parse_args(argv)
    if args.quick:
        args.rd_numel, args.tp_numel, args.repeat = 1 << 16, 1 << 18, 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# ccoll codec benchmark: torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average {load:.1f}, THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', '0')}")
    result: dict = {"load_average": load, "thp": os.environ.get("THP_MEM_ALLOC_ENABLE", "0")}
    if not args.skip_rd:
        result["rate_distortion"] = rate_distortion(args.rd_numel)
    if not args.skip_throughput:
        threads = [int(t) for t in args.threads.split(",") if t]
        only = [s.strip() for s in args.specs.split(";") if s.strip()] if args.specs else None
        result["throughput"] = throughput(args.tp_numel, threads, args.backends.split(","), args.repeat, only)
    if args.rows:
        _set_threads(int(args.threads.split(",")[0]))
        specs = [s.strip() for s in args.specs.split(";") if s.strip()] if args.specs else ["int8:block=256", "int4:block=64"]
        result["rows"] = rows_throughput(args.tp_numel, args.rows, specs, args.backends.split(","), args.repeat)
    if args.all_reduce:
        _set_threads(int(args.threads.split(",")[0]))
        specs = [s.strip() for s in args.specs.split(";") if s.strip()] if args.specs else ["int8:block=256", "int4:block=128"]
        result["all_reduce"] = all_reduce_ops(args.tp_numel, args.all_reduce, specs, args.backends.split(","),
                                              args.repeat, args.feedback)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
        print(f"\n# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
