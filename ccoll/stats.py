"""Per-(dimension, op, codec) traffic counters: what users read to see what was compressed and how much.

The dimension comes from a context variable that the patch layer sets (``with stats.dimension("dp")``),
so collectives record without knowing about parallelism. Disabled cost: one dict update under a lock.
"""
from __future__ import annotations

import atexit
import contextvars
import json
import os
import threading

_dim: contextvars.ContextVar[str] = contextvars.ContextVar("ccoll_dim", default="direct")
_lock = threading.Lock()
_table: dict[tuple[str, str, str], dict] = {}


class dimension:
    """``with dimension(dim):`` attributes collectives called inside the block to parallel dimension ``dim``.
    A class rather than a generator context manager: the patch enters one per compressed call, and a
    generator's frame, wrapper object and two ``next`` calls cost ~0.5 us more than these two methods."""

    __slots__ = ("dim", "token")

    def __init__(self, dim: str) -> None:
        self.dim = dim
        self.token = None

    def __enter__(self) -> None:
        self.token = _dim.set(self.dim)

    def __exit__(self, *exc: object) -> None:
        _dim.reset(self.token)


#: ``token = enter_dimension(dim)`` ... ``leave_dimension(token)``: :class:`dimension` for a caller on every
#: compressed call's path (the patch), as the context variable's own methods: no Python frame
enter_dimension = _dim.set
leave_dimension = _dim.reset

#: the dimension in effect (``"direct"`` outside any :class:`dimension` block): the context variable's own
#: ``get``, so reading it on every collective call runs no Python frame
current_dimension = _dim.get


_bucket_cache: dict[int, str] = {}


def _bucket(nbytes: int) -> str:
    """Power-of-two upper bound of the message size, as a string key (JSON-friendly). Cached: record()
    runs for every call the patch passes through, and a training run has few distinct sizes."""
    b = _bucket_cache.get(nbytes)
    if b is None:
        b = str(1 << max(0, int(nbytes) - 1).bit_length())
        if len(_bucket_cache) < 4096:
            _bucket_cache[nbytes] = b
    return b


_flushers: list = []


def add_flusher(fn) -> None:
    """Register ``fn()`` to run before the table is read or reset: sources that batch their counts off
    the hot path (ccoll.patch's pass-through calls) hand them over there."""
    _flushers.append(fn)


def _flush() -> None:
    for fn in list(_flushers):
        fn()


#: lazily timed (CUDA) calls kept per row before the completed ones are folded in on the hot path
_PENDING_MAX = 256


def _resolve(row: dict, everything: bool) -> None:
    """Fold lazily timed seconds into ``row``: all of them (reading the table may wait for the GPU), or
    only those whose end event has completed (on the hot path, never blocking)."""
    pending = row["_pending"]
    keep = []
    for s in pending:
        if everything or s.ready():
            row["seconds"] += float(s.seconds())
        else:
            keep.append(s)
    row["_pending"] = keep


_row_hooks: list = []


def add_row_hook(fn) -> None:
    """Register ``fn(dim, op, codec, raw_bytes, wire_bytes, calls)``, called after :func:`record` creates a
    row (the first call of a (dim, op, codec), and again after :func:`reset_stats`), outside the lock and
    with that first record's figures. Why here: every caller -- the patch, the DDP hook, FSDP2's comms,
    the explicit API -- records, so a listener (ccoll.report: "dp compressing: ...") learns of the first
    compressed call whoever made it, at a cost on row creation only, never on the calls after it."""
    _row_hooks.append(fn)


def record(op: str, codec: str, raw_bytes: int, wire_bytes: int, seconds, dim: str | None = None,
           calls: int = 1) -> None:
    """Count ``calls`` calls (one, unless a batching source hands over several of the same size).
    ``raw_bytes``: the uncompressed bytes this rank contributed; ``wire_bytes``: the payload bytes this
    rank sent for them (both totals over the calls). ``seconds``: a float (host clock), or an object
    with ``ready()`` and ``seconds()`` (CUDA events, :class:`ccoll.streams.LazySeconds`) whose elapsed
    time is read when the table is, so recording never synchronises with the GPU."""
    key = (dim or _dim.get(), op, codec)
    new = False
    with _lock:
        row = _table.get(key)
        if row is None:
            new = True
            row = _table[key] = {
                "dim": key[0], "op": op, "codec": codec, "calls": 0, "raw_bytes": 0, "wire_bytes": 0,
                "seconds": 0.0, "histogram": {}, "_pending": [],
            }
        row["calls"] += calls
        row["raw_bytes"] += int(raw_bytes)
        row["wire_bytes"] += int(wire_bytes)
        if isinstance(seconds, (int, float)):
            row["seconds"] += float(seconds)
        else:
            row["_pending"].append(seconds)
            if len(row["_pending"]) > _PENDING_MAX:
                _resolve(row, everything=False)
        size = int(raw_bytes) // calls
        b = _bucket_cache.get(size) or _bucket(size)
        row["histogram"][b] = row["histogram"].get(b, 0) + calls
    if new:
        for fn in _row_hooks:
            fn(key[0], op, codec, int(raw_bytes), int(wire_bytes), calls)


#: host-clock codec seconds: (dim, codec name, phase) -> {"calls", "nbytes", "seconds"}
_codec_table: dict[tuple[str, str, str], dict] = {}
class _CodecClock:
    """Whether batched codec calls are timed (off by default: every compressed call runs through the
    codec, and the clock costs ~5 us per codec call -- a quarter of a 4 KiB encode)."""

    on = False


#: read by the codecs on every batched call (``codec_clock.on``)
codec_clock = _CodecClock()


def time_codecs(on: bool = True) -> None:
    """Start (or stop) timing batched codec calls on host tensors into :func:`codec_stats`."""
    codec_clock.on = bool(on)


def record_codec(codec: str, phase: str, nbytes: int, seconds: float) -> None:
    """Count one batched codec call (``phase``: encode, decode or decode_sum) over ``nbytes`` of
    uncompressed values. Why: a model of step time needs the codec's throughput under the contention
    the training ranks really see, which no separate micro-benchmark reproduces; the codec's own calls
    in the run measure it. Host devices only (a GPU call returns before its kernel has run)."""
    key = (_dim.get(), codec, phase)
    with _lock:
        row = _codec_table.get(key)
        if row is None:
            row = _codec_table[key] = {"dim": key[0], "codec": codec, "phase": phase, "calls": 0, "nbytes": 0,
                                       "seconds": 0.0}
        row["calls"] += 1
        row["nbytes"] += int(nbytes)
        row["seconds"] += float(seconds)


def codec_stats() -> list[dict]:
    """One dict per (dim, codec, phase) of the batched codec calls on host tensors: calls, nbytes
    (uncompressed values in or out), seconds (host clock). The dimension is the one in effect at the
    call (an async collective decodes where its ``wait()`` runs)."""
    with _lock:
        return [dict(_codec_table[k]) for k in sorted(_codec_table)]


def stats() -> list[dict]:
    """One dict per (dim, op, codec): calls, raw_bytes, wire_bytes, seconds, histogram {size<=: calls}."""
    _flush()
    with _lock:
        rows = sorted(_table.values(), key=lambda r: (r["dim"], r["op"], r["codec"]))
        for r in rows:
            _resolve(r, everything=True)
        return [{k: (dict(v) if k == "histogram" else v) for k, v in r.items() if k != "_pending"} for r in rows]


def by_dimension(rows: list[dict] | None = None) -> dict[str, dict]:
    """Per dimension, in the rows' order: calls, raw_bytes, wire_bytes, seconds summed over its ops and
    codecs, native calls included (what the dimension put on the wire, not only its compressed part).
    ``rows``: :func:`stats`' rows or rows with those keys (default: :func:`stats`). Read by the exit
    table's total lines and by the HF Trainer callback (ccoll.hf)."""
    out: dict[str, dict] = {}
    for r in stats() if rows is None else rows:
        t = out.setdefault(r["dim"], {"calls": 0, "raw_bytes": 0, "wire_bytes": 0, "seconds": 0.0})
        for k in t:
            t[k] += r[k]
    return out


def reset_stats() -> None:
    _flush()  # pending counts belong to the period being discarded
    with _lock:
        _table.clear()
        _codec_table.clear()


def _rank_and_world() -> tuple[int, int]:
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    for r, w in (("RANK", "WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if r in os.environ:
            return int(os.environ[r]), int(os.environ.get(w, "1"))
    return 0, 1


def stats_path(path: str) -> str:
    """Per-rank file name: "{rank}" in the path is replaced; otherwise ".rank<R>" goes before ".json"
    when there is more than one rank, so ranks never overwrite each other."""
    rank, world = _rank_and_world()
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    if world > 1:
        stem, ext = os.path.splitext(path)
        return f"{stem}.rank{rank}{ext or '.json'}"
    return path


def dump(path: str, extra: dict | None = None) -> str:
    out = stats_path(path)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"rank": _rank_and_world()[0], "stats": stats(), **(extra or {})}, f, indent=1)
    return out


_exit_notes: list = []


def add_exit_note(fn) -> None:
    """Register ``fn() -> dict | None``: keys added to the CCOLL_STATS file at exit; a dict also makes a
    process that recorded nothing write its file (ccoll.report: a rank that compressed nothing says why)."""
    _exit_notes.append(fn)


def _dump_at_exit() -> None:
    """A launcher process (torchrun, deepspeed) imports torch too, so ccoll-run activates ccoll there;
    it never joins the world and records nothing. Writing its empty table would put a stray rank-0 file
    beside (or over) the real rank 0's, so a process that recorded nothing writes nothing -- unless an exit
    note (ccoll.report: a rank that joined a process group) asks for the file."""
    path = os.environ.get("CCOLL_STATS")
    if not path:
        return
    _flush()  # the patch's pass-through counts are handed over here
    extra: dict = {}
    for fn in _exit_notes:
        extra.update(fn() or {})
    if _table or extra:
        dump(path, extra)


atexit.register(_dump_at_exit)
