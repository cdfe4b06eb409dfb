"""Per-call host overhead of a compressed collective over the native call, at sizes where the wire is
cheap and the fixed cost of a call is what decides whether compressing can pay.

    python -m ccoll.bench.overhead [--ranks 2] [--sizes 4K,64K,1M] [--codecs int8:block=256,bf16]
        [--ops all_reduce,all_gather_into_tensor,sendrecv] [--calls 200] [--rounds 7]
        [--patched 1] [--fake-pg 1] [--fake-pg-calls 5000] [--policy hybrid]
        [--sim 8,64,256] [--sim-sizes 4K,64K] [--sim-calls 10] [--sim-rounds 3] [--json out.json]

Five measurements, one table each (0, 0b and 0c in this process: the steadiest on a shared machine):

0. in process (``--in-process 1``): all_reduce and all_gather over a transport that completes every
   exchange at once by local copies, so the time per call (wall and thread CPU) is ccoll's host path alone, the
   codec's time reported beside it (``codec_us``) and subtracted (``host_over_wall``); no peer, no
   wire, no other rank's scheduling, so it is the steadiest figure on a shared machine;
0b. through the patch (``--patched 1``, :func:`run_patched`): ``torch.distributed.all_reduce`` /
   ``all_gather_into_tensor`` as a training script calls them, compressed by a policy (every call on "dp",
   error feedback on), over the same stand-in transport, codec arithmetic removed: the whole host path of
   a compressed call (wrapper, policy, resolver, router, call skeleton, stats, handle). ``floor_us`` times
   alone what any such call must run that is not ccoll's (the codec's batched calls, its front end, and the
   stand-in's exchange of the payload rows); ``ccoll_us`` = the call less that: ccoll's own Python per call
   (issue 41 item 3's figure; ``tests/dist/test_host_path.py`` keeps its frame count from growing);
0c. pass-through on torch's fake process group (``--fake-pg 1``, :func:`fake_pg_rows`): per function, torch's
   own call and what the patch adds with ``--policy`` (default: the shipped hybrid) at 64 B, below every
   ``min_bytes``: the cost of the patch on the calls it leaves to torch;
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
import itertools
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


def _cases(args: argparse.Namespace, p: int):
    """(op, numel, input, output) of every in-process table's case: each op of ``--ops`` the in-process
    stand-in serves, at each ``--sizes`` (fp32 input; the output holds ``p`` inputs for all_gather)."""
    import torch

    for op in SIM_OPS:
        if op in args.ops:
            for size in args.sizes:
                n = max(1, size // 4)
                yield op, n, torch.randn(n), torch.empty(n * p)


def run_in_process(args: argparse.Namespace) -> list[dict]:
    """all_reduce and all_gather_into_tensor over :func:`_instant_group` (p = ``--ranks``, at least 2):
    thread CPU time per call, interleaved rounds as on gloo."""
    from ..stats import time_codecs

    p = max(2, args.ranks)
    group = _instant_group(p)
    time_codecs(False)
    rows = []
    for op, n, x, out in _cases(args, p):
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


# --- through the patch: compressed calls in process, pass-through on torch's fake process group -------

@contextlib.contextmanager
def fake_world():
    """torch.distributed initialised on torch's fake process group (``torch.testing._internal.distributed.
    fake_pg``: rank 0 of 2, every call completes at once, nothing is sent) for the block, destroyed after."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _install_alone(policy: Any, resolver: Any, **kwargs: Any) -> None:
    """``ccoll.patch.install`` in a process that is the only rank, before any process group exists (install
    compares policy fingerprints across the ranks of an initialised one; the fake group has no second rank to
    publish one, and its store stores nothing): the fingerprint counts as compared."""
    import torch.distributed as dist

    from .. import patch

    if dist.is_initialized():
        raise RuntimeError("the bench installs the patch before initialising torch.distributed")
    patch.install(policy, resolver, **kwargs)
    patch.SLOT.current.checked = True


def _patched_policy(spec: str) -> Any:
    """Every call on dimension "dp" compressed with ``spec`` (error feedback on, as the shipped hybrid policy's
    dp rule: used by all_reduce), every other dimension native."""
    from ..policy import Policy

    return Policy.from_dict({"version": 1, "default": {"codec": "native"},
                             "dp": {"codec": spec, "min_bytes": 0, "error_feedback": True}})


#: compressed calls per optimizer step in the "through the patch" table (``--calls-per-step``): ``ccoll.patch.step()``
#: (numbering the next step's calls, ~1-2 us) runs once per step, not per call, and a step makes many compressed calls
#: (one per gradient bucket; four per layer under tensor parallelism); 8 is the few-bucket end, so each call carries
#: 1/8 of a step (1: a step after every call, the table before issue 41's last round)
CALLS_PER_STEP = 8


def run_patched(args: argparse.Namespace) -> list[dict]:
    """Compressed calls as the patch makes them (``torch.distributed.all_reduce`` / ``all_gather_into_tensor``
    on a group every call resolves to "dp", compressed by the policy of :func:`_patched_policy`; one
    ``ccoll.patch.step()`` after every ``--calls-per-step`` calls (:data:`CALLS_PER_STEP`), each call its own
    residual), over
    :func:`_instant_group`,
    with the codec's arithmetic removed (:func:`codec_arithmetic_removed`): the wrapper, policy, resolver,
    router, call skeleton, stats, handle and the codec's front end, nothing else. Per variant, interleaved
    rounds, thread CPU time per call: ``path_us`` (through the patch), ``path_over_us`` (over native: the
    stand-in transport's own call on the uncompressed tensor, no ccoll), ``direct_over_us`` (``ccoll.all_reduce`` called
    directly, over native) and ``patch_us`` (their difference: the patch's share)."""
    import torch.distributed as dist

    from .. import patch
    from ..stats import time_codecs

    p = max(2, args.ranks)
    group = _instant_group(p)
    time_codecs(False)
    rows = []
    try:  # no process group: the group of every call is the stand-in, and the patch needs none to compress
        for op, n, x, out in _cases(args, p):
            x0 = x.clone()
            calls, per_step = itertools.count(1), args.calls_per_step
            if op == "all_reduce":
                def through_patch() -> None:
                    x.copy_(x0)
                    dist.all_reduce(x, group=group)
                    if not next(calls) % per_step:
                        patch.step()
            else:
                def through_patch() -> None:
                    dist.all_gather_into_tensor(out, x, group=group)
                    if not next(calls) % per_step:
                        patch.step()
            tr = group.ccoll_transport
            if op == "all_reduce":
                def native() -> None:  # the stand-in's own call: no ccoll at all
                    x.copy_(x0)
                    tr.native_all_reduce(x, "sum")
            else:
                def native() -> None:
                    tr.native_all_gather(out, x)
            times: dict[str, list[tuple[float, float, float]]] = {c: [] for c in args.codecs}
            base: list[float] = []
            for r in range(args.rounds + 1):  # round 0: warm-up, not kept
                nat = _block(native, args.calls, "overhead", time.thread_time)[1]
                for spec in _rotated(list(args.codecs), r):
                    direct = _call(op, 0, p, group, spec, x, out)
                    floor = _floor(op, spec, tr, x, x0, out)
                    with codec_arithmetic_removed(spec):
                        f = _block(floor, args.calls, "overhead", time.thread_time)[1]
                        d = _block(direct, args.calls, "overhead", time.thread_time)[1]
                        _install_alone(_patched_policy(spec), lambda g, o: "dp", step_counter="manual")
                        t = _block(through_patch, args.calls, "overhead", time.thread_time)[1]
                    x.copy_(x0)
                    if r:
                        times[spec].append((t, d, f))
                if r:
                    base.append(nat)
                patch.uninstall()
            for spec, ts in times.items():
                rows.append({"world": f"patched p={p}", "op": op, "nbytes": n * 4, "codec": spec,
                             "native_us": statistics.median(base),
                             "path_us": statistics.median(t for t, _, _ in ts),
                             "path_over_us": statistics.median(t - b for (t, _, _), b in zip(ts, base)),
                             "direct_over_us": statistics.median(d - b for (_, d, _), b in zip(ts, base)),
                             "patch_us": statistics.median(t - d for t, d, _ in ts),
                             "floor_us": statistics.median(f for _, _, f in ts),
                             "ccoll_us": statistics.median(t - f for t, _, f in ts)})
    finally:
        patch.uninstall()
    return rows


def _floor(op: str, spec: str, tr: Any, x: Any, x0: Any, out: Any) -> Callable[[], None]:
    """What a compressed ``op`` of ``x`` must run whatever runs around it, as one closure over buffers made
    here once: the codec's batched calls (its front end; the caller removes the arithmetic) and the stand-in
    transport's exchange of the payload rows (all_reduce of one segment on two ranks: encode, all-gather,
    decode-and-sum, after the same restore of ``x`` as the other variants; all_gather: encode, all-gather,
    decode). The patched call's time less this is ccoll's own host path (``ccoll_us``: policy, resolver,
    router, call skeleton, stats, its buffers)."""
    import torch

    from ..codecs import get_codec

    c = get_codec(spec)
    n, p = x.numel(), out.numel() // x.numel()
    nb = c.payload_nbytes(n, x.dtype)
    payload = torch.empty(1, nb, dtype=torch.uint8)
    gathered = torch.empty(p, nb, dtype=torch.uint8)
    send, recv = payload.view(-1), gathered.view(-1)
    fb = torch.zeros(n, dtype=c.feedback_dtype(x.dtype)) if c.lossy else None
    if op == "all_reduce":
        def floor() -> None:
            x.copy_(x0)
            c.encode_rows(x, payload, n, feedback=fb)
            tr.native_all_gather(recv, send, False)
            c.decode_sum(gathered, n, x.dtype, out=x)
    else:
        def floor() -> None:
            c.encode_rows(x, payload, n)
            tr.native_all_gather(recv, send, False)
            c.decode_rows(gathered, out, n)
    return floor


FAKE_PG_OPS = ("all_reduce", "all_gather_into_tensor", "broadcast", "send", "recv", "isend+wait")


def fake_pg_rows(policy: Any, calls: int, nbytes: int = 64) -> list[dict]:
    """Per function of :data:`FAKE_PG_OPS` on torch's fake process group (:func:`fake_world`), in this process,
    a tensor of ``nbytes`` (fp32; the default 64 B is below every shipped policy's ``min_bytes``, so every call
    passes through): thread CPU time per call (median of 7 blocks of ``calls``) of torch's call
    (``torch_us``), the patched call with the resolver users get by default (``patched_us``:
    ``AutoResolver``, the call resolved, passed through and counted) and with a resolver that places nothing
    (``wrapper_only_us``: the wrapper's layers alone). send/recv run two wrapper layers: torch's send calls
    the wrapped isend."""
    import torch
    import torch.distributed as dist

    from .. import patch

    def per_call_us(fn: Callable[[], Any]) -> float:
        for _ in range(max(1, calls // 5)):
            fn()
        samples = []
        for _ in range(7):
            t0 = time.thread_time_ns()
            for _ in range(calls):
                fn()
            samples.append((time.thread_time_ns() - t0) / calls)
        return statistics.median(samples) / 1e3

    x, out = torch.ones(max(1, nbytes // 4)), torch.empty(2 * max(1, nbytes // 4))
    fns = {"all_reduce": lambda: dist.all_reduce(x), "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(out, x),
           "broadcast": lambda: dist.broadcast(x, src=0), "send": lambda: dist.send(x, 1),
           "recv": lambda: dist.recv(x, 1), "isend+wait": lambda: dist.isend(x, 1).wait()}
    with fake_world():
        rows = {name: {"op": name, "torch_us": per_call_us(fn)} for name, fn in fns.items()}
    for key, resolver in (("patched_us", None), ("wrapper_only_us", lambda group, op: None)):
        _install_alone(policy, resolver)  # then a fresh fake group: AutoResolver places what exists at call time
        try:
            with fake_world():
                for name, fn in fns.items():
                    rows[name][key] = per_call_us(fn)
        finally:
            patch.uninstall()
    return list(rows.values())


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


def _patched_table(rows: list[dict]) -> list[str]:
    lines = [f"{'world':<17}{'op':<23}{'bytes':>6} {'codec':<15}{'native_us':>10}{'path_us':>9}{'path_over':>10}"
             f"{'direct_over':>12}{'patch':>7}{'floor_us':>9}{'ccoll_us':>9}"]
    for r in rows:
        lines.append(f"{r['world']:<17}{r['op']:<23}{format_nbytes(r['nbytes'], short=True):>6} {r['codec']:<15}"
                     f"{r['native_us']:>10.1f}{r['path_us']:>9.1f}{r['path_over_us']:>10.1f}{r['direct_over_us']:>12.1f}"
                     f"{r['patch_us']:>7.1f}{r['floor_us']:>9.1f}{r['ccoll_us']:>9.1f}")
    return lines


def _fake_pg_table(rows: list[dict]) -> list[str]:
    lines = [f"{'op':<24}{'torch_us':>10}{'patched_+us':>13}{'wrapper_only_+us':>18}"]
    for r in rows:
        lines.append(f"{r['op']:<24}{r['torch_us']:>10.2f}{r['patched_us'] - r['torch_us']:>13.2f}"
                     f"{r['wrapper_only_us'] - r['torch_us']:>18.2f}")
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
    ap.add_argument("--patched", type=int, default=1,
                    help="1: compressed calls through the patch, in process, without codec arithmetic (0: skip)")
    ap.add_argument("--calls-per-step", type=int, default=CALLS_PER_STEP,
                    help="compressed calls per ccoll.patch.step() in the through-the-patch table")
    ap.add_argument("--fake-pg", type=int, default=1,
                    help="1: pass-through calls on torch's fake process group, torch vs patched (0: skip)")
    ap.add_argument("--fake-pg-calls", type=int, default=5000, help="calls per timed block on the fake group")
    ap.add_argument("--policy", default="hybrid", help="the policy of the fake-group pass-through table")
    ap.add_argument("--sim", type=_ints, default=[8, 64, 256], help="simulated world sizes (empty: skip)")
    ap.add_argument("--sim-sizes", type=parse_nbytes_list, default=parse_nbytes_list("4K,64K"))
    ap.add_argument("--sim-calls", type=int, default=10)
    ap.add_argument("--sim-rounds", type=int, default=3)
    ap.add_argument("--sim-max-bytes", type=int, default=1 << 30)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args(argv)
    bad = [op for op in args.ops if op not in OPS]
    if bad or min(args.calls, args.rounds, args.sim_calls, args.sim_rounds, args.calls_per_step) < 1:
        ap.error(f"ops must be among {', '.join(OPS)}; calls, rounds and calls per step at least 1")
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
    doc = {"load_average": [load0], "cpus": os.cpu_count(), "args": vars(args), "in_process": [], "patched": [],
           "fake_pg": [], "gloo": [], "simulated": [], "skipped": []}

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
    if args.patched:
        doc["patched"] = run_patched(args)
        print(f"# through the patch, in process: torch.distributed calls compressed by the policy (dp: the codec, "
              f"error feedback on; one ccoll.patch.step() per {args.calls_per_step} calls) over the stand-in transport, codec arithmetic "
              f"removed; {args.rounds} rounds x {args.calls} calls, median thread CPU per call, microseconds; "
              f"path_over = over the stand-in's own native call; direct_over = ccoll.{{op}} called directly; "
              f"patch = the patch's share (path less direct); load average {os.getloadavg()[0]:.2f}")
        print("\n".join(_patched_table(doc["patched"])), flush=True)
        save()
    if args.fake_pg:
        from ..policy import find_policy

        doc["fake_pg"] = fake_pg_rows(find_policy(args.policy), args.fake_pg_calls)
        print(f"# pass-through on torch's fake process group (64 B, nothing sent), policy {args.policy}, median of 7 "
              f"blocks x {args.fake_pg_calls} calls, thread CPU per call, microseconds: torch's call, added by the "
              f"patch (default AutoResolver), added by its wrapper layers alone; load average {os.getloadavg()[0]:.2f}")
        print("\n".join(_fake_pg_table(doc["fake_pg"])), flush=True)
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
