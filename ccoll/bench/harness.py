"""One benchmark harness for every collective, in the nccl-tests / OSU style.

    python -m ccoll.bench all_reduce -b 1K -e 64M -f 4 --np 4 --codec native,bf16,int8:block=256

Each collective is one :class:`Collective` entry (how the size maps to per-rank buffers, the busbw
factor, how to build inputs and the uncompressed reference, how to run it); the harness owns sweeping,
timing, checking and printing, so every collective takes the same options and prints the same columns.

Sizes (``-b``/``-e``, the ``size`` column) follow nccl-tests: the size of the largest buffer of the
call, i.e. the full tensor: all_reduce / broadcast / all_to_all / sendrecv the tensor each rank holds,
all_gather the gathered output (each rank contributes size/n), reduce_scatter the input (each rank
keeps size/n).

Bandwidths: ``algbw = size / time``; ``busbw = algbw * factor`` where factor makes busbw comparable
with the link bandwidth whatever the world size n (the bytes a rank must move per byte of size under a
bandwidth-optimal algorithm):

    all_reduce      2(n-1)/n     (reduce-scatter + all-gather)
    all_gather      (n-1)/n
    reduce_scatter  (n-1)/n
    all_to_all      (n-1)/n
    broadcast       1
    sendrecv        1            (time = half the ping-pong round trip, OSU osu_latency style)
    sendrecv_bw     1            (OSU osu_bw style: a window of min(64, 64 MiB / size) non-blocking
                                  messages 2k -> 2k+1, then an ack; time = window time / messages)

Timing (OSU style): every iteration is preceded by a barrier and timed on each rank; ``time_us`` is the
mean over iterations on the slowest rank (max over ranks). In-place inputs are restored before the
barrier, outside the timed region.

Correctness, in the same run, on the last timed iteration's output: ``rel_err`` = ||out - ref||_2 /
||ref||_2 against the float64 uncompressed result of the same inputs (max over ranks); ``#wrong`` =
elements outside the codec's error bound (summed over ranks) plus elements that differ bit-wise from
rank 0 where every rank must hold the same result (all_reduce, all_gather, broadcast). The bound is the
codec's per-encode absolute error bound (see :func:`codec_error_rel`) applied to each encode on the
collective's path, using the tensor-wide absmax (an upper bound of every block's absmax), plus
accumulation rounding of the dtype.

``ratio`` is the wire compression: this rank's raw bytes / the encoded bytes that stand for them, as the
collectives recorded them in :func:`ccoll.stats` during the timed iterations. ``speedup`` = native
time / this codec's time at the same size, when ``native`` (the backend's own uncompressed collective:
``torch.distributed`` on gloo, mpi4py on MPI) is among the codecs of the run.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from pathlib import Path

import torch

from .. import launch
from ..codecs import example_specs
from ..errors import BenchError
from ..units import DTYPES, dtype_name, nbytes_arg, parse_nbytes
from .breakdown import format_breakdown, measure_breakdown, parse_rate, write_trace
from .cases import COLLECTIVES, Collective
from .measure import codec_error_rel, measure
from .worlds import MPIWorld, TorchWorld, World

__all__ = ["COLLECTIVES", "NATIVE", "BenchError", "MPIWorld", "TorchWorld", "codec_error_rel", "main", "measure",
           "run_rank", "size_sweep", "split_codecs"]

NATIVE = "native"
#: --codec item that expands to every registered codec's example specs
ALL_CODECS = "all"


# --- sizes ----------------------------------------------------------------------------------------

def size_sweep(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    if min_bytes <= 0 or max_bytes < min_bytes:
        raise BenchError(f"need 0 < -b ({min_bytes}) <= -e ({max_bytes})")
    if factor < 2:
        raise BenchError(f"-f must be an integer >= 2, got {factor}")
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes


def split_codecs(values: list[str]) -> list[str]:
    """Comma lists of specs; a spec's own parameters also use commas ("int4:block=64,round=stochastic"),
    so an item with '=' but no ':' continues the previous spec."""
    specs: list[str] = []
    for value in values:
        for item in value.split(","):
            item = item.strip()
            if not item:
                continue
            if "=" in item and ":" not in item and specs and ":" in specs[-1]:
                specs[-1] += "," + item
            elif item == ALL_CODECS:  # every registered codec's example specs (Codec.example_specs)
                specs += example_specs()
            else:
                specs.append(item)
    if not specs:
        raise BenchError("--codec needs at least one codec (e.g. native,bf16,int8:block=256)")
    return specs


# --- one measurement ------------------------------------------------------------------------------

COLUMNS = ("size", "count", "type", "codec", "time", "algbw", "busbw", "ratio", "rel_err", "#wrong", "speedup")
UNITS = ("(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "(x)", "", "", "(x)")
WIDTHS = (12, 11, 9, 26, 11, 8, 8, 7, 9, 8, 8)


def _fmt_row(cells) -> str:
    return " ".join(f"{c:>{w}}" for c, w in zip(cells, WIDTHS))


# --- the sweep ------------------------------------------------------------------------------------

#: default iteration counts, OSU style: fewer repetitions for large messages, whose time is long
#: and steady, so a 1K..64M sweep stays minutes long on a CPU machine
ITERS_SMALL, WARMUP_SMALL, ITERS_LARGE, WARMUP_LARGE, LARGE_BYTES = 20, 5, 5, 1, 1 << 20


def _iters_for(args, nbytes: int) -> tuple[int, int]:
    large = nbytes > LARGE_BYTES
    iters = args.iters if args.iters is not None else (ITERS_LARGE if large else ITERS_SMALL)
    warmup = args.warmup if args.warmup is not None else (WARMUP_LARGE if large else WARMUP_SMALL)
    return iters, warmup


def _describe_iters(args) -> str:
    small, large = _iters_for(args, 0), _iters_for(args, LARGE_BYTES + 1)
    if small == large:
        return f"{small[0]}  warmup {small[1]}"
    return f"{small[0]} ({large[0]} above {LARGE_BYTES >> 20} MiB)  warmup {small[1]} ({large[1]} above {LARGE_BYTES >> 20} MiB)"

def _header(w: World, args, colls: list[Collective], specs: list[str]) -> list[str]:
    import ccoll

    load = "/".join(f"{v:.2f}" for v in os.getloadavg())
    lines = [
        f"# ccoll {ccoll.__version__}  torch {torch.__version__}  python {platform.python_version()}  {w.versions()}",
        f"# host {platform.node()}  cpus {os.cpu_count()}  torch threads {torch.get_num_threads()}  "
        f"load avg (1/5/15 min) {load}",
        f"# collective {','.join(c.name for c in colls)}  world_size {w.size}  backend {w.backend}  "
        f"dtype {args.dtype}  iters {_describe_iters(args)}  min_bytes {args.min_bytes}  seed {args.seed}",
        f"# codecs {', '.join(specs)}",
        "# busbw factor: " + ", ".join(f"{c.name} {c.factor_doc} = {c.busbw_factor(w.size):.3g}" for c in colls),
        "# time: mean per iteration on the slowest rank (barrier before each); sendrecv: one way (ping-pong / 2); "
        "sendrecv_bw: per message of a window",
    ]
    link = os.environ.get("CCOLL_NETEM")
    if link:
        lines.append(f"# link: {link}  (interface {os.environ.get('GLOO_SOCKET_IFNAME', '?')})")
    return lines


def _resolve_codecs(specs: list[str], dtype: torch.dtype):
    from ..codecs import get_codec
    from ..errors import CcollError

    codecs = []
    for spec in specs:
        if spec == NATIVE:
            codecs.append((NATIVE, None))
            continue
        try:
            c = get_codec(spec)
        except CcollError as e:
            raise BenchError(f"--codec {spec!r}: {e}") from None
        if dtype not in c.dtypes:
            names = ", ".join(str(d).replace("torch.", "") for d in c.dtypes)
            raise BenchError(f"codec {c.spec!r} does not take {dtype} (it takes {names}); choose another --dtype")
        codecs.append((spec, c))
    # native first: every other row's speedup is relative to it
    return sorted(codecs, key=lambda lc: lc[1] is not None)


def run_rank(args) -> int:
    dtype = DTYPES[args.dtype]
    colls = list(COLLECTIVES.values()) if args.collective == "all" else [COLLECTIVES[args.collective]]
    codecs = _resolve_codecs(split_codecs(args.codec), dtype)
    sizes = size_sweep(args.minbytes, args.maxbytes, args.stepfactor)
    if not os.environ.get("OMP_NUM_THREADS"):
        local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1")))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local)))
    w: World = MPIWorld() if args.backend == "mpi" else TorchWorld(args.timeout, args.backend)
    try:
        if args.np is not None and args.np != w.size:
            raise BenchError(f"--np {args.np} but the launcher started {w.size} ranks")
        for c in colls:
            if w.size < c.min_world:
                raise BenchError(f"{c.name} needs at least {c.min_world} ranks, got {w.size}")
        head = _header(w, args, colls, [label if c is None else c.spec for label, c in codecs])
        meta = {"world_size": w.size, "backend": w.backend, "dtype": args.dtype, "iters": _describe_iters(args),
                "min_bytes": args.min_bytes, "header": head,
                "loadavg_start": os.getloadavg(), "netem": os.environ.get("CCOLL_NETEM")}
        rows: list[dict] = []
        link_bps = parse_rate(args.link_rate) if args.link_rate else None
        if w.rank == 0:
            print("\n".join(head))
            print("#" + _fmt_row(COLUMNS)[1:])
            print("#" + _fmt_row(UNITS)[1:], flush=True)
        for coll in colls:
            if w.rank == 0 and len(colls) > 1:
                print(f"# --- {coll.name} (busbw factor {coll.factor_doc})", flush=True)
            gran = coll.granularity(w.size)
            seen = set()
            for size in sizes:
                count = max(gran, size // dtype.itemsize // gran * gran)
                if count in seen:
                    continue
                seen.add(count)
                case = coll.build(w, count, dtype, args.seed)  # on the CPU: the reference stays there
                case.inp, case.out = case.inp.to(w.device), case.out.to(w.device)
                case.window = [b.to(w.device) for b in case.window]
                native_time = None
                for label, codec in codecs:
                    iters, warmup = _iters_for(args, count * dtype.itemsize)
                    m = measure(w, coll, case, codec, iters, warmup, args.min_bytes)
                    nbytes = count * dtype.itemsize
                    algbw = nbytes / (m["time_us"] * 1e-6) / 1e9 if m["time_us"] > 0 else math.inf
                    if codec is None:
                        native_time = m["time_us"]
                    row = {"collective": coll.name, "size_bytes": nbytes, "count": count, "dtype": args.dtype,
                           "codec": label, "codec_spec": NATIVE if codec is None else codec.spec,
                           "algbw_gbps": algbw,
                           "busbw_gbps": algbw * coll.busbw_factor(w.size),
                           "busbw_factor": coll.busbw_factor(w.size), "iters": iters, "warmup": warmup,
                           "speedup": (native_time / m["time_us"]) if native_time else None, **m}
                    rows.append(row)
                    if w.rank == 0:
                        print(_fmt_row(_cells(row)), flush=True)
                    if args.trace:
                        write_trace(w, coll, case, codec, args.min_bytes, args.trace,
                                    f"{coll.name}-{nbytes}-{label.replace(':', '_').replace(',', '_')}")
                    if args.breakdown and codec is not None:
                        bd = measure_breakdown(w, coll, case, codec, args.min_bytes, link_bps)
                        row["breakdown"] = bd
                        if w.rank == 0:
                            print("\n".join(format_breakdown(row, bd, link_bps)), flush=True)
                    if w.rank == 0 and args.json:
                        _write_json(args.json, meta, rows)
                del case
        if w.rank == 0:
            bad = sum(r["wrong"] for r in rows)
            print(f"# out of bounds: {bad}  load avg now {'/'.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
            if args.json:
                meta["loadavg_end"] = os.getloadavg()
                _write_json(args.json, meta, rows)
        w.barrier()
        return 1 if any(r["wrong"] for r in rows) else 0
    finally:
        w.close()


def _cells(r: dict) -> list[str]:
    def g(v, spec):
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)

    return [str(r["size_bytes"]), str(r["count"]), r["dtype"], r["codec"], g(r["time_us"], ".1f"),
            g(r["algbw_gbps"], ".3f"), g(r["busbw_gbps"], ".3f"), g(r["ratio"], ".2f"), g(r["rel_err"], ".2e"),
            str(r["wrong"]), g(r["speedup"], ".2f")]


def _write_json(path: str, meta: dict, rows: list[dict]) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(_finite({"meta": meta, "rows": rows}), indent=1))
    tmp.replace(p)


def _finite(v):
    """Strict JSON: non-finite floats (a rank that timed nothing, an overflowed error) become null."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def _launch(args, argv: list[str]) -> int:
    """``--np`` local ranks running this same command line (gloo: RANK/WORLD_SIZE; mpi: under mpiexec)."""
    return launch.run_local([sys.executable, "-m", "ccoll.bench", *argv], args.np, mpi=args.backend == "mpi",
                            timeout_s=args.timeout)


# --- command line ---------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ccoll.bench",
        description="Benchmark ccoll's compressed collectives against the backend's own (nccl-tests / OSU style).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2] if __doc__ else None,
    )
    p.add_argument("collective", choices=[*COLLECTIVES, "all"])
    p.add_argument("-b", "--minbytes", type=nbytes_arg, default=parse_nbytes("1K"),
                   help="smallest size: 1K, 64KiB, 1.5M, 4096 (binary multiples, as nccl-tests; default 1K)")
    p.add_argument("-e", "--maxbytes", type=nbytes_arg, default=parse_nbytes("64M"), help="largest size (default 64M)")
    p.add_argument("-f", "--stepfactor", type=int, default=4, help="size multiplication factor (default 4)")
    p.add_argument("-n", "--iters", type=int, default=None,
                   help=f"timed iterations per size (default {ITERS_SMALL}, {ITERS_LARGE} above {LARGE_BYTES >> 20} MiB)")
    p.add_argument("-w", "--warmup", type=int, default=None,
                   help=f"untimed iterations first (default {WARMUP_SMALL}, {WARMUP_LARGE} above {LARGE_BYTES >> 20} MiB)")
    p.add_argument("--codec", action="append", default=None,
                   help="comma list of codec specs to compare in one run; 'native' is the backend's own "
                        "uncompressed collective (default: native); 'all': every registered codec's example specs")
    p.add_argument("--backend", choices=["gloo", "nccl", "mpi"], default="gloo",
                   help="gloo: CPU tensors; nccl: CUDA tensors, one GPU per rank; mpi: mpi4py (CPU tensors)")
    p.add_argument("--dtype", default="float32", type=dtype_name, choices=list(DTYPES))
    p.add_argument("--np", type=int, default=None,
                   help="launch this many local ranks (gloo: subprocesses, mpi: mpiexec); not needed when "
                        "started by a launcher (RANK/WORLD_SIZE, mpiexec, ccoll.bench.netem)")
    p.add_argument("--min-bytes", type=int, default=0,
                   help="ccoll's native-below threshold (default 0: every size compressed, so each row is what it says)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before hung ranks are stopped")
    p.add_argument("--breakdown", action="store_true",
                   help="after each compressed row, a few extra calls split into phases (encode, exchanges, "
                        "waits, decode) and the wall time into idle codec / idle host / in flight (see "
                        "ccoll.bench.breakdown)")
    p.add_argument("--link-rate", default=None, metavar="RATE",
                   help="per-rank link rate for --breakdown's ideal (tc units: 1gbit, 100mbit)")
    p.add_argument("--trace", default=None, metavar="DIR",
                   help="write a Chrome trace (torch.profiler) of one extra call per row and rank to DIR")
    p.add_argument("--json", default=None, metavar="PATH", help="also write rows + metadata as JSON (rank 0)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        args.codec = args.codec or [NATIVE]
        if (args.iters is not None and args.iters < 1) or (args.warmup is not None and args.warmup < 0):
            raise BenchError("-n must be >= 1 and -w >= 0")
        _resolve_codecs(split_codecs(args.codec), DTYPES[args.dtype])  # fail here, not in N ranks
        if args.link_rate is not None:
            try:
                if parse_rate(args.link_rate) <= 0:
                    raise ValueError
            except ValueError:
                raise BenchError(f"--link-rate {args.link_rate!r}: give a rate as tc writes it (1gbit, 100mbit)") from None
        size_sweep(args.minbytes, args.maxbytes, args.stepfactor)
        env = os.environ
        if args.backend == "mpi" and launch.under_mpi(env):
            return run_rank(args)
        if args.backend == "mpi" or launch.under_mpi(env):
            if args.np is None:
                raise BenchError("--backend mpi without mpiexec: give --np N (the harness runs mpiexec) "
                                 "or start it under mpiexec")
            if launch.under_mpi(env):
                raise BenchError("started under mpiexec: use --backend mpi")
            return _launch(args, argv)
        if "RANK" in env and "WORLD_SIZE" in env:
            return run_rank(args)
        if args.np is not None:
            if args.np < 1:
                raise BenchError(f"--np must be >= 1, got {args.np}")
            return _launch(args, argv)
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(launch.free_port()))
        return run_rank(args)
    except (BenchError, launch.LaunchError) as e:
        print(f"ccoll.bench: error: {e}", file=sys.stderr)
        return 2
