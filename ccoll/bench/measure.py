"""One measurement of the benchmark harness: time a collective on a case (OSU style: a barrier, then
each iteration timed on each rank), read the wire ratio from ccoll's stats, and check the output against
the codec's error bound and across ranks (see :mod:`ccoll.bench.harness` for the definitions)."""
from __future__ import annotations

import hashlib
import math
import time
from typing import Any

import torch

from .cases import Case, Collective
from .worlds import World


#: rounding unit of each dtype (half an ulp at 1.0)
_EPS = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float64: 2.0**-53}


def codec_error_rel(codec) -> float | None:
    """Bound of one encode/decode's absolute error per element, as a fraction of the absmax of the
    encoded values (the block's absmax bounds it, so the tensor-wide absmax does too): the codec's own
    ``Codec.relative_error_bound()`` (each codec derives and documents it). 0 for native; None: no
    known bound (only cross-rank identity is checked)."""
    return 0.0 if codec is None else codec.relative_error_bound()


def _check(w: World, coll: Collective, case: Case, codec, count_out: int) -> tuple[float, int]:
    """(rel_err max over ranks, #wrong summed over ranks) of the output now in ``case.out`` (and, for
    sendrecv_bw, of every message of the window: each is checked against the bound on its own, since
    stochastic rounding encodes each send differently)."""
    out = case.out.cpu()
    wrong = 0
    sq_err = sq_ref = 0.0
    if case.ref is not None:
        rel = codec_error_rel(codec)
        if rel is None:
            tol: Any = math.inf
        else:
            bound = rel * case.absmax_encoded
            if case.absmax_reencoded is not None:
                bound += rel * (case.absmax_reencoded + bound)
            tol = case.scale * ((w.size + 2) * _EPS[out.dtype]) + (bound * 1.01 + 1e-30)
        for i, buf in enumerate((out, *case.window)):
            diff = (buf.cpu().to(torch.float64) - case.ref).abs_()
            wrong += int((~(diff <= tol)).sum())  # NaN counts as wrong
            if i == 0:
                sq_err = float(diff.square().sum())
        sq_ref = float(case.ref.square().sum())
    rel_err = math.sqrt(sq_err / sq_ref) if sq_ref > 0 else math.sqrt(sq_err)
    if not math.isfinite(rel_err):
        rel_err = math.inf
    if coll.identical:
        digest = hashlib.blake2b(out.contiguous().view(torch.uint8).numpy().tobytes(), digest_size=16).digest()
        digests = w.all_gather_bytes(digest)
        if len(set(digests)) > 1:
            root = case.out.clone()
            w.broadcast_bytes_(root)
            itype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[out.element_size()]
            wrong += int((out.view(itype) != root.cpu().view(itype)).sum())
    rel_max, = w.reduce_max([rel_err])
    wrong_sum, = w.reduce_sum([float(wrong)])
    return rel_max, int(wrong_sum)


def _wire_ratio(codec, raw_before: tuple[int, int]) -> float:
    """raw/wire bytes recorded by ccoll's collectives for this codec since ``raw_before`` was read."""
    if codec is None:
        return 1.0
    raw, wire = _recorded(codec.spec)
    raw -= raw_before[0]
    wire -= raw_before[1]
    return raw / wire if wire > 0 else math.nan


def _recorded(spec: str) -> tuple[int, int]:
    from ..stats import stats

    rows = [r for r in stats() if r["codec"] == spec]
    return sum(r["raw_bytes"] for r in rows), sum(r["wire_bytes"] for r in rows)


def timed_call(w: World, coll: Collective, case: Case, codec, min_bytes) -> tuple[float, float]:
    """One call, OSU style: inputs restored (in-place collectives overwrite them), a barrier, then the
    host clock around the call and the device sync; (start, end)."""
    if case.in_place:
        case.out.copy_(case.inp)
    w.barrier()
    t0 = time.perf_counter()
    coll.run(w, case, codec, min_bytes)
    w.sync()
    return t0, time.perf_counter()


def measure(w: World, coll: Collective, case: Case, codec, iters: int, warmup: int, min_bytes: int) -> dict:
    times: list[float] = []
    before = _recorded(codec.spec) if codec is not None else (0, 0)
    recorded_after_warmup = before
    for it in range(warmup + iters):
        if it == warmup and codec is not None:
            recorded_after_warmup = _recorded(codec.spec)
        t0, t1 = timed_call(w, coll, case, codec, min_bytes)
        if it >= warmup:
            times.append(t1 - t0)
    ratio = _wire_ratio(codec, recorded_after_warmup)
    participates = case.participates
    div = coll.time_divisor(case.inp.numel() * case.inp.element_size())
    mean = sum(times) / len(times) / div if participates else 0.0
    median = sorted(times)[len(times) // 2] / div if participates else 0.0
    best = min(times) / div if participates else math.inf
    t_max, t_med = w.reduce_max([mean, median])
    t_min_rank, t_best = (-v for v in w.reduce_max([-mean if participates else -math.inf, -best]))
    rel_err, wrong = _check(w, coll, case, codec, case.out.numel())
    return {"time_us": t_max * 1e6, "time_us_median": t_med * 1e6, "time_us_best": t_best * 1e6,
            "time_us_fastest_rank": t_min_rank * 1e6, "ratio": ratio, "rel_err": rel_err, "wrong": wrong}
