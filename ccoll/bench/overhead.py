"""Per-call host overhead of a compressed collective over the native call, at sizes where the wire is
cheap and the fixed cost of a call is what decides whether compressing can pay.

    python -m ccoll.bench.overhead [--ranks 2] [--sizes 4K,64K,1M] [--codecs int8:block=256,bf16]
        [--ops all_reduce,all_gather_into_tensor,sendrecv] [--calls 200] [--rounds 7]
        [--sim 8,64,256] [--sim-sizes 4K,64K] [--sim-calls 10] [--sim-rounds 3] [--json out.json]

Three measurements, one table each:

0. in process (``--in-process 1``): all_reduce and all_gather over a transport that completes every
   exchange at once by local copies, so the time per call (wall and thread CPU) is ccoll's host path alone, the
   codec's time reported beside it (``codec_us``) and subtracted (``host_over_wall``); no peer, no
   wire, no other rank's scheduling, so it is the steadiest figure on a shared machine;
1. real gloo ranks (:func:`ccoll.launch.run_gloo`): per (op, size), every round times a block of
   ``--calls`` calls of each codec and of the native call back to back, the codec order rotating from
   round to round, so load drift and position hit every variant alike. Reported per call, median over
   rounds: wall microseconds and process CPU microseconds (all threads of the rank, gloo's included:
   far less disturbed by other load on a shared machine than wall time), and the overhead over native
   as the median of the per-round differences (each difference from one round, so both sides saw the
   same load). ``sendrecv`` is one round trip: rank 0 sends then receives, rank 1 the reverse.

   Each round times every compressed variant three ways (tables 0 and 1), because the codec's own clock is
   part of what it would measure:

   - ``wall_us`` / ``cpu_us``: the call as users run it, codec clock off (the default);
   - ``codec_us``: the time inside the codec's batched calls, from a second block with
     ``ccoll.stats.time_codecs`` on (its two clock reads and the record per batched call cost ~2-3 us each,
     so they are kept out of ``wall_us``); ``host_over_wall`` = ``over_wall`` less ``codec_us``;
   - ``path_over``: a third block with the codec's arithmetic removed (:func:`codec_arithmetic_removed`:
     the backend's batched hooks return at once; every check, allocation, exchange, decision and Python
     step of ccoll and of the codec's own front end still runs), over native: ccoll's host path and
     nothing else, the figure item 4 of the overhead issue asks for. ``host_over_wall`` exceeds it on a
     CPU by what the codec's torch arithmetic does to the rest of the call (at 64 KiB ~20-30 us for
     int8/int4, a few for bf16; not the allocator: unchanged with glibc's mmap/trim thresholds raised;
     most likely the caches and predictors its kernels evict). On a GPU the arithmetic runs on the device,
     so the host runs ``path_over`` plus the kernel launches.
2. the simulated world (:func:`ccoll.testing.simulated_world`, threads over the memory transport) at
   p = ``--sim``: each rank's thread CPU time per call, median over ranks and rounds, over native. The
   codec clock is not subtracted there (it is wall time, which in threads sharing one interpreter
   includes waiting for it); the codec ``none`` (a byte copy: no codec arithmetic) shows ccoll's
   Python and launch path per rank directly. all_gather's output is p times the
   input on each of p ranks, so sizes with p*p*size above ``--sim-max-bytes`` are skipped (and said).

Every call passes ``min_bytes=0``, so each size is compressed whatever the default threshold; the result
is the evidence for :data:`ccoll.defaults.DEFAULT_MIN_BYTES`.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

from ..units import format_nbytes, parse_nbytes_list

OPS = ("all_reduce", "all_gather_into_tensor", "sendrecv")
SIM_OPS = ("all_reduce", "all_gather_into_tensor")
NATIVE = "native"


def _call(op: str, rank: int, p: int, group: Any, codec: str | None, x, out) -> Callable[[], None]:
    """One call of ``op`` with ``codec`` (None: native) on this rank, as a closure to time.

    all_reduce first restores ``x`` from a copy taken here (one copy of ``size`` bytes, the same in every
    variant, so it cancels in the overhead over native): a sum in place grows the tensor every call (x 2
    per call with equal inputs), so without it the values reach Inf within ~130 calls and every later
    call times the codecs' non-finite path (int8/int4: the isfinite/where/masked_fill branch), not the
    common one."""
    import ccoll

    if op == "all_reduce":
        x0 = x.clone()

        def restored_all_reduce() -> None:
            x.copy_(x0)
            ccoll.all_reduce(x, "sum", group, codec, min_bytes=0)
        return restored_all_reduce
    if op == "all_gather_into_tensor":
        return lambda: ccoll.all_gather_into_tensor(out, x, group, codec, min_bytes=0)
    if op == "sendrecv":
        peer = 1 - rank

        def round_trip() -> None:
            if rank == 0:
                ccoll.send(x, peer, group, codec, min_bytes=0)
                ccoll.recv(x, peer, group, codec, min_bytes=0)
            else:
                ccoll.recv(x, peer, group, codec, min_bytes=0)
                ccoll.send(x, peer, group, codec, min_bytes=0)
        return round_trip
    raise ValueError(op)


def _variants(codecs: list[str]) -> list[tuple[str, str | None]]:
    return [(NATIVE, None)] + [(c, c) for c in codecs]


def _codec_of(name: str) -> str | None:
    return None if name == NATIVE else name


def _rotated(items: list, r: int) -> list:
    k = r % len(items)
    return items[k:] + items[:k]


def _codec_seconds(dim: str) -> float:
    """Host seconds of the batched codec calls recorded under ``dim`` so far (``ccoll.stats.time_codecs``)."""
    from ..stats import codec_stats

    return sum(row["seconds"] for row in codec_stats() if row["dim"] == dim)


@contextlib.contextmanager
def codec_arithmetic_removed(spec: str):
    """Within: the batched hooks (``_encode_rows_<b>``, ``_decode_rows_<b>``, ``_decode_sum_<b>``) of
    ``spec``'s codec class on the host backend return at once, leaving their outputs as they were
    (uninitialised payloads, garbage decodes). Why: what a compressed call costs beyond native and beyond
    the codec's arithmetic is ccoll's host path; removing the arithmetic measures that path directly,
    instead of as a difference of two larger, noisier figures. An instrument only: every rank must enter it
    alike, and the caller restores any tensor a call decodes into before values matter again."""
    import torch

    from ..codecs import get_codec

    cls = type(get_codec(spec))
    backend = get_codec(spec).resolve_backend(torch.device("cpu"))
    names = [f"_{op}_{backend}" for op in ("encode_rows", "decode_rows", "decode_sum") if hasattr(cls, f"_{op}_{backend}")]
    own = {n: cls.__dict__[n] for n in names if n in cls.__dict__}

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    for n in names:
        setattr(cls, n, nothing)
    try:
        yield
    finally:
        for n in names:
            if n in own:
                setattr(cls, n, own[n])
            else:
                delattr(cls, n)


def _block(fn: Callable[[], None], calls: int, dim: str, cpu_clock: Callable[[], float]) -> tuple[float, float, float]:
    """(wall, CPU, codec) microseconds per call of ``calls`` calls of ``fn``; codec = the time spent in
    the codec's batched calls (timed by ``ccoll.stats.time_codecs`` when it is on, recorded under
    dimension ``dim``)."""
    from ..stats import dimension

    with dimension(dim):
        k0, c0, t0 = _codec_seconds(dim), cpu_clock(), time.perf_counter()
        for _ in range(calls):
            fn()
        t1, c1, k1 = time.perf_counter(), cpu_clock(), _codec_seconds(dim)
    return (t1 - t0) / calls * 1e6, (c1 - c0) / calls * 1e6, (k1 - k0) / calls * 1e6


Times = tuple[float, float, float, float]  # wall, CPU, codec, wall without codec arithmetic (us per call)


def _round(fn: Callable[[], None], codec: str | None, calls: int, dim: str, cpu_clock: Callable[[], float],
           restore: list) -> Times:
    """One round of one variant (see the module docstring): clock off, clock on, arithmetic removed.
    ``restore``: tensors a call may decode into, put back after the block without arithmetic so the later
    blocks code the same values (a garbage decode could be non-finite and take the codecs' slow path)."""
    from ..stats import time_codecs

    wall, cpu, _ = _block(fn, calls, dim, cpu_clock)
    if codec is None:
        return wall, cpu, 0.0, wall
    time_codecs(True)
    try:
        codec_us = _block(fn, calls, dim, cpu_clock)[2]
    finally:
        time_codecs(False)
    saved = [t.clone() for t in restore]
    with codec_arithmetic_removed(codec):
        path = _block(fn, calls, dim, cpu_clock)[0]
    for t, s in zip(restore, saved):
        t.copy_(s)
    return wall, cpu, codec_us, path


def _summary(times: dict[str, list[Times]]) -> list[dict]:
    """Per variant: median wall / CPU / codec time per call over rounds, the median per-round difference
    to native, the wall difference less the codec's own time (``host_over_wall``) and the wall without the
    codec's arithmetic over native (``path_over_wall``: ccoll's Python, launches and extra exchanges,
    what this tool is about)."""
    base = times[NATIVE]
    out = []
    for name, ts in times.items():
        out.append({
            "codec": name,
            "wall_us": statistics.median(t[0] for t in ts),
            "cpu_us": statistics.median(t[1] for t in ts),
            "codec_us": statistics.median(t[2] for t in ts),
            "over_wall_us": statistics.median(t[0] - b[0] for t, b in zip(ts, base)),
            "over_cpu_us": statistics.median(t[1] - b[1] for t, b in zip(ts, base)),
            "host_over_wall_us": statistics.median(t[0] - t[2] - b[0] for t, b in zip(ts, base)),
            "path_over_wall_us": statistics.median(t[3] - b[0] for t, b in zip(ts, base)),
        })
    return out


# --- real gloo ranks ----------------------------------------------------------------------------

def _gloo_rank(rank: int, p: int, args: argparse.Namespace) -> list[dict]:
    """One gloo rank (started by :func:`ccoll.launch.run_gloo`)."""
    import torch
    import torch.distributed as dist

    from ..stats import time_codecs

    torch.manual_seed(rank)
    time_codecs(False)
    rows = []
    for op in args.ops:
        if op == "sendrecv" and p != 2:
            continue
        for size in args.sizes:
            n = max(1, size // 4)
            x = torch.randn(n)
            out = torch.empty(n * p)
            variants = [(name, _call(op, rank, p, None, codec, x, out)) for name, codec in _variants(args.codecs)]
            for _, fn in variants:  # warm-up: connections, allocator, codec caches
                for _ in range(max(2, args.calls // 10)):
                    fn()
            times: dict[str, list[Times]] = {name: [] for name, _ in variants}
            for r in range(args.rounds):
                for name, fn in _rotated(variants, r):
                    dist.barrier()
                    times[name].append(_round(fn, _codec_of(name), args.calls, "overhead", time.process_time,
                                              [x, out]))
            for s in _summary(times):
                rows.append({"world": f"gloo p={p}", "op": op, "nbytes": n * 4, **s})
    dist.barrier()
    return rows


def run_gloo_ranks(args: argparse.Namespace) -> list[dict]:
    """Rank 0's rows (every rank measures; the ranks of a collective move in step)."""
    from ..launch import run_gloo

    return run_gloo(args.ranks, _gloo_rank, args, timeout_s=args.timeout)[0]


# --- the simulated world ----------------------------------------------------------------------------

def _sim_rank(rank: int, group: Any, op: str, size: int, codecs: list[str], calls: int, rounds: int) -> dict:
    import torch

    n = max(1, size // 4)
    p = group.ccoll_transport.world_size
    x = torch.randn(n, generator=torch.Generator().manual_seed(rank))
    out = torch.empty(n * p)
    variants = [(name, _call(op, rank, p, group, codec, x, out)) for name, codec in _variants(codecs)]
    for _, fn in variants:
        fn()
    times: dict[str, list[Times]] = {name: [] for name, _ in variants}
    for r in range(rounds):
        for name, fn in _rotated(variants, r):
            times[name].append((*_block(fn, calls, f"overhead-rank{rank}", time.thread_time), 0.0))
    return times


def run_simulated(args: argparse.Namespace) -> tuple[list[dict], list[str]]:
    """(rows, skipped cases) of the simulated world; per variant the median over ranks and rounds of
    each rank's thread CPU time per call."""
    from ..testing import simulated_world

    from ..stats import time_codecs

    codecs = ["none"] + [c for c in args.codecs if c != "none"]
    rows, skipped = [], []
    time_codecs(True)
    for p in args.sim:
        for op in SIM_OPS:
            if op not in args.ops:
                continue
            for size in args.sim_sizes:
                if op == "all_gather_into_tensor" and p * p * size > args.sim_max_bytes:
                    skipped.append(f"{op} {format_nbytes(size)} at p={p} ({format_nbytes(p * p * size)} of outputs)")
                    continue
                per_rank = simulated_world(p, _sim_rank, op, size, codecs, args.sim_calls, args.sim_rounds,
                                           timeout_s=args.timeout)
                merged = {name: [t for rk in per_rank for t in rk[name]] for name in per_rank[0]}
                for s in _summary(merged):
                    # one clock here, CPU per rank; the codec clock is wall time, which in threads sharing
                    # one interpreter includes waiting for it, so it is not subtracted (see codec none)
                    for k in ("wall_us", "over_wall_us", "host_over_wall_us", "codec_us", "path_over_wall_us"):
                        s.pop(k)
                    rows.append({"world": f"simulated p={p}", "op": op, "nbytes": max(1, size // 4) * 4, **s})
    return rows, skipped


# --- in process: a transport that completes at once ----------------------------------------------------

def _instant_group(p: int) -> Any:
    """A group whose transport (rank 0 of ``p``) completes every exchange at once by local copies, so a
    call's time is ccoll's host path alone: no peer, no wire, no scheduling of other ranks."""
    import torch

    from ..transports.base import Transport
    from ..transports.handle import Handle

    def done(async_op: bool) -> Any:
        return Handle([]) if async_op else None

    class Instant(Transport):
        kind = "instant"
        rank, world_size = 0, p

        def group_rank(self, global_rank: int) -> int:
            return int(global_rank)

        def global_rank(self, group_rank: int) -> int:
            return int(group_rank)

        def native_all_reduce(self, tensor: torch.Tensor, op: str, async_op: bool = False) -> Any:
            tensor.mul_(p)  # every rank held the same tensor
            return done(async_op)

        def native_all_gather(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False) -> Any:
            # one copy from a broadcast view: one torch call, as native all_reduce is one (mul_), so the
            # stand-in charges every exchange alike (a copy per row cost ~190 us of Python at p = 256, and
            # 17 us at p = 8 even in log2(p) doubling copies, all counted as ccoll's host path). Single-
            # threaded (main() sets one intra-op thread): with a pool, torch splits this copy from 32K
            # elements and on a busy host waits for a thread (milliseconds, not ccoll's)
            output.view(p, -1).copy_(input.view(1, -1).expand(p, -1))
            return done(async_op)

        def native_all_to_all(self, output, input, output_split_sizes=None, input_split_sizes=None,
                              async_op: bool = False) -> Any:
            output.copy_(input)
            return done(async_op)

    class Group:
        ccoll_transport = Instant()

    return Group()


def run_in_process(args: argparse.Namespace) -> list[dict]:
    """all_reduce and all_gather_into_tensor over :func:`_instant_group` (p = ``--ranks``, at least 2):
    thread CPU time per call, interleaved rounds as on gloo."""
    import torch

    from ..stats import time_codecs

    p = max(2, args.ranks)
    group = _instant_group(p)
    time_codecs(False)
    rows = []
    for op in SIM_OPS:
        if op not in args.ops:
            continue
        for size in args.sizes:
            n = max(1, size // 4)
            x, out = torch.randn(n), torch.empty(n * p)
            variants = [(name, _call(op, 0, p, group, codec, x, out)) for name, codec in _variants(["none"] + [
                c for c in args.codecs if c != "none"])]
            for _, fn in variants:
                for _ in range(max(2, args.calls // 10)):
                    fn()
            times: dict[str, list[Times]] = {name: [] for name, _ in variants}
            for r in range(args.rounds):
                for name, fn in _rotated(variants, r):
                    times[name].append(_round(fn, _codec_of(name), args.calls, "overhead", time.thread_time,
                                              [x, out]))
            for s in _summary(times):
                rows.append({"world": f"in-process p={p}", "op": op, "nbytes": n * 4, **s})
    return rows


# --- command line ----------------------------------------------------------------------------------

def _table(rows: list[dict], wall: bool) -> list[str]:
    head = f"{'world':<17}{'op':<23}{'bytes':>6} {'codec':<15}"
    head += f"{'wall_us':>9}{'over_wall':>10}{'codec_us':>9}{'host_over_wall':>15}{'path_over':>10}" if wall else ""
    lines = [head + f"{'cpu_us':>9}{'over_cpu':>9}"]
    for r in rows:
        line = f"{r['world']:<17}{r['op']:<23}{format_nbytes(r['nbytes'], short=True):>6} {r['codec']:<15}"
        if wall:
            line += (f"{r['wall_us']:>9.1f}{r['over_wall_us']:>10.1f}{r['codec_us']:>9.1f}"
                     f"{r['host_over_wall_us']:>15.1f}{r['path_over_wall_us']:>10.1f}")
        lines.append(line + f"{r['cpu_us']:>9.1f}{r['over_cpu_us']:>9.1f}")
    return lines


def _list(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def _ints(text: str) -> list[int]:
    return [int(s) for s in _list(text)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m ccoll.bench.overhead", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2, help="gloo ranks (0: skip the gloo measurement)")
    ap.add_argument("--sizes", type=parse_nbytes_list, default=parse_nbytes_list("4K,64K,1M"))
    ap.add_argument("--codecs", type=_list, default=["int8:block=256", "bf16"])
    ap.add_argument("--ops", type=_list, default=list(OPS))
    ap.add_argument("--calls", type=int, default=200, help="calls per timed block")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (every variant once each)")
    ap.add_argument("--in-process", type=int, default=1, help="1: measure the host path alone first (0: skip)")
    ap.add_argument("--sim", type=_ints, default=[8, 64, 256], help="simulated world sizes (empty: skip)")
    ap.add_argument("--sim-sizes", type=parse_nbytes_list, default=parse_nbytes_list("4K,64K"))
    ap.add_argument("--sim-calls", type=int, default=10)
    ap.add_argument("--sim-rounds", type=int, default=3)
    ap.add_argument("--sim-max-bytes", type=int, default=1 << 30)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args(argv)
    bad = [op for op in args.ops if op not in OPS]
    if bad or args.calls < 1 or args.rounds < 1 or args.sim_calls < 1 or args.sim_rounds < 1:
        ap.error(f"ops must be among {', '.join(OPS)}; calls and rounds at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    import torch

    args = parse_args(argv)
    # one intra-op thread, as the gloo ranks run (ccoll.launch): on a loaded machine a parallel region
    # waits for its second thread to be scheduled, milliseconds that would be charged to whichever call
    # happened to use one (a 2-row decode_sum did: 61 ms instead of 4 us)
    torch.set_num_threads(1)
    load0 = os.getloadavg()[0]
    print(f"# ccoll per-call overhead over native: load average {load0:.2f} at start, {os.cpu_count()} CPUs",
          flush=True)
    doc = {"load_average": [load0], "cpus": os.cpu_count(), "args": vars(args), "in_process": [], "gloo": [],
           "simulated": [], "skipped": []}

    def save() -> None:
        # after every table, so a later measurement that fails or times out (the simulated world at
        # p = 256 is minutes per call on a small machine) keeps the earlier ones
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)

    if args.in_process:
        doc["in_process"] = run_in_process(args)
        print(f"# in process: a transport that completes every exchange at once (ccoll's host path alone; "
              f"path_over = the call without the codec's arithmetic, over native), "
              f"{args.rounds} rounds x {args.calls} calls, median per call, microseconds")
        print("\n".join(_table(doc["in_process"], wall=True)), flush=True)
        save()
    if args.ranks >= 2:
        doc["gloo"] = run_gloo_ranks(args)
        print(f"# gloo: {args.ranks} ranks, {args.rounds} interleaved rounds x {args.calls} calls, median per call "
              f"(rank 0), microseconds; over_* = median per-round difference to native; host_over_wall = "
              f"over_wall less the codec's own time (codec_us); path_over = the call without the codec's "
              f"arithmetic, over native")
        print("\n".join(_table(doc["gloo"], wall=True)), flush=True)
        save()
    if args.sim:
        doc["simulated"], doc["skipped"] = run_simulated(args)
        print(f"# simulated world: thread CPU time per rank per call, {args.sim_rounds} rounds x {args.sim_calls} "
              f"calls, median over ranks and rounds; codec none = ccoll's path without codec arithmetic")
        print("\n".join(_table(doc["simulated"], wall=False)))
        for s in doc["skipped"]:
            print(f"# skipped: {s}")
    doc["load_average"].append(os.getloadavg()[0])
    print(f"# load average {doc['load_average'][1]:.2f} at end")
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
