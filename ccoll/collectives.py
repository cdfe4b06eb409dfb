"""Compressed collectives with ``torch.distributed``'s signatures plus ``codec=``.

Each algorithm is written once against a :class:`~ccoll.codecs.Codec` (tensor <-> fixed-size payload)
and a :class:`~ccoll.transports.Transport` (moves those payloads), so it runs the same on gloo, NCCL
and MPI, on CPU and CUDA tensors (the codec picks its backend from the tensor's device).

all_reduce = compressed reduce-scatter by all-to-all (each rank decodes the p payloads of its chunk and
sums them in fp32) + compressed all-gather of the reduced chunk. Exactly two codec round trips whatever
the world size; compressing at every hop of a ring would compound the error p-1 times.

Pipelining: all_reduce, reduce_scatter_tensor and all_gather_into_tensor split tensors above
:data:`SEGMENT_BYTES` into segments and issue each segment's exchange asynchronously, so encoding the
next segment and decoding the previous one run while the current one is on the wire (without it the
codec's time adds to the link time). Segments are derived from (numel, dtype, world size) only, so
every rank issues the same collectives in the same order; a tensor of one segment keeps exactly the
unsegmented layout (chunk ``ceil(numel / p)``).

Invariants:
- every lossy collective leaves bit-identical results on every rank that should agree: the all-gather
  decodes the caller's own slot from its own payload, all_reduce decodes its own reduced chunk, and the
  broadcast root adopts the decoded values;
- exact passthrough (the native call, unchanged results) for: ``codec=None``; integer/bool tensors;
  MAX/MIN/PRODUCT; tensors under ``min_bytes`` (default :data:`DEFAULT_MIN_BYTES`; ``min_bytes=0``
  compresses everything); dtypes the codec does not take (e.g. fp64 into int8); world size 1 (nothing
  travels, so nothing is lossy: the result is exact); callers outside the group (nothing, like torch);
  all_to_all with uneven split sizes. Both sides of a send/recv decide from (shape, dtype, codec,
  min_bytes, world size) alone, so they always agree;
- non-contiguous tensors work (results copied back in place); ``op="avg"`` works on every backend.

``async_op=True``: every collective is *issued* at call time, in program order, so ranks can never
issue them in different orders; the handle's ``wait()`` finishes the last communication step, decodes
and records stats. For all_reduce that means the reduce-scatter exchange runs at call time and only the
all-gather overlaps with the caller's work.

Stats: every call records ``(op, codec spec or "native", raw_bytes, wire_bytes, seconds)``; raw is this
rank's uncompressed contribution, wire the encoded bytes that stand for it (all_reduce / all_to_all /
reduce_scatter: the p encoded chunks of its input; all_gather / broadcast / send / recv: the one
payload). Native calls record wire = raw. Async calls record when ``wait()`` completes, under the
stats dimension (``ccoll.stats.dimension``) that was in effect at the call.

Error feedback (all_reduce, reduce_scatter_tensor): see :class:`~ccoll.feedback.ErrorFeedback` and
:func:`all_reduce`. Stochastic rounding: each call encodes with a per-call, per-rank seed (see
:func:`_sender`); the seed never travels, so this changes no invariant above.
"""
from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Callable, Hashable

import torch

from .codecs import Codec, get_codec
from .errors import PolicyError, TransportError
from .feedback import ErrorFeedback
from .log import warn_once
from .stats import current_dimension, record as _record_stats
from .transports import Handle, Transport, for_group, op_name

from .defaults import DEFAULT_MIN_BYTES  # tensors below it go native unless min_bytes= says otherwise

_codecs: dict[str, Codec] = {}
_codecs_lock = threading.Lock()


def _as_codec(codec: Any) -> Codec | None:
    if codec is None or isinstance(codec, Codec):
        return codec
    if not isinstance(codec, str):
        raise PolicyError(f"codec must be a spec string, a Codec or None, got {type(codec).__name__}")
    with _codecs_lock:
        c = _codecs.get(codec)
    if c is None:
        c = get_codec(codec)
        with _codecs_lock:
            _codecs[codec] = c
    return c


_calls = itertools.count()


def _mix32(x: int) -> int:
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _sender(c: Codec, tr: Transport) -> Codec:
    """The codec instance this rank encodes with for this call. A stochastic-rounding codec with one
    fixed seed would draw the same random numbers on every rank and every call (errors would correlate
    instead of cancelling in the sum, and repeat instead of averaging out over steps), so each call gets
    a seed mixed from the spec's seed, this rank's global rank and a per-process call counter. The seed
    never travels: decoding does not use it, so ranks need not agree on it, and results stay
    bit-identical across ranks (everyone decodes the same bytes) and reproducible run to run."""
    if c.params.get("round") != "stochastic" or not hasattr(c, "with_seed"):
        return c
    seed = _mix32(_mix32(int(c.params.get("seed", 0)) ^ _mix32(tr.global_rank(tr.rank) + 0x9E3779B9)) + next(_calls))
    return c.with_seed(seed)


def _check_tensor(t: Any, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TransportError(f"{what} expects a torch.Tensor, got {type(t).__name__}")


def _plan(codec: Any, tensor: torch.Tensor, min_bytes: int | None, tr: Transport, op: str | None = None) -> Codec | None:
    """The codec to use for this call, or None for the exact native call (the passthrough rules)."""
    c = _as_codec(codec)
    if c is None or tr.world_size <= 1 or tr.rank < 0:
        return None
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return None
    if op is not None and op not in ("sum", "avg"):
        return None
    threshold = DEFAULT_MIN_BYTES if min_bytes is None else int(min_bytes)
    if tensor.numel() * tensor.element_size() < threshold:
        return None
    if tensor.dtype not in c.dtypes:
        warn_once(f"dtype-{c.spec}-{tensor.dtype}", "ccoll: codec %s does not take %s; sending those tensors uncompressed", c.spec, tensor.dtype)
        return None
    return c


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _contig(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _finish(async_op: bool, inner: Handle | None, then: Callable[[], Any], outputs: list) -> Handle | None:
    """Sync: wait for ``inner`` and run ``then`` now. Async: a handle that does both in ``wait()``
    and whose future's value is ``outputs`` (torch's convention: the result tensors)."""
    if async_op:
        return Handle([inner] if inner is not None else [], then, outputs)
    if inner is not None:
        inner.wait()
    then()
    return None


def _start() -> tuple[float, str]:
    """Call time and the stats dimension in effect at the call (an async wait() may run elsewhere)."""
    return time.perf_counter(), current_dimension()


def _recorder(op: str, codec: str, raw_bytes: int, wire_bytes: int, t0: tuple[float, str]) -> Callable[[], None]:
    return lambda: _record_stats(op, codec, raw_bytes, wire_bytes, time.perf_counter() - t0[0], dim=t0[1])


def _copy_back(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy ``src`` (a contiguous buffer of ``dst``'s numel) into ``dst``, unless it is ``dst``'s own
    memory (a view of a contiguous ``dst``), where the copy would move bytes onto themselves."""
    if src is dst or (dst.is_contiguous() and src.data_ptr() == dst.data_ptr() and src.numel() == dst.numel()):
        return
    dst.copy_(src.view(dst.shape) if src.is_contiguous() else src.reshape(dst.shape))


def _encode_chunks(
    c: Codec, sender: Codec, flat: torch.Tensor, chunk_numel: int, p: int, ef: ErrorFeedback | None, key: Hashable,
    segment: tuple = (),
) -> tuple[torch.Tensor, int]:
    """Encode ``flat`` as p payloads of ``chunk_numel`` elements each in one [p * nbytes] buffer; a
    chunk that runs past ``flat``'s end (numel not divisible by p) is zero-padded on its own, so the
    whole tensor is never copied for padding. Error-feedback keys: ``(key, "rs", i) + segment``."""
    nbytes = c.encoded_nbytes(chunk_numel, flat.dtype)
    send = torch.empty(p * nbytes, dtype=torch.uint8, device=flat.device)
    rows = send.view(p, nbytes)
    for i in range(p):
        piece = flat[i * chunk_numel:(i + 1) * chunk_numel]
        if piece.numel() < chunk_numel:
            padded = torch.zeros(chunk_numel, dtype=flat.dtype, device=flat.device)
            padded[:piece.numel()] = piece
            piece = padded
        rows[i].copy_(ef.encode((key, "rs", i) + segment, piece, c) if ef is not None else sender.encode(piece))
    return send, nbytes


def _decode_rows(c: Codec, rows: torch.Tensor, chunk_numel: int, out_flat: torch.Tensor) -> None:
    """Decode row i into ``out_flat[i*chunk : (i+1)*chunk]`` (clipped at ``out_flat``'s end)."""
    n = out_flat.numel()
    for i in range(rows.shape[0]):
        lo = i * chunk_numel
        hi = min(lo + chunk_numel, n)
        if hi - lo == chunk_numel:
            c.decode(rows[i], chunk_numel, out_flat.dtype, out=out_flat[lo:hi])
        elif hi > lo:
            out_flat[lo:hi].copy_(c.decode(rows[i], chunk_numel, out_flat.dtype)[: hi - lo])


def _output_flat(t: torch.Tensor) -> torch.Tensor:
    """Where to decode into: ``t``'s own memory when contiguous, else a scratch buffer copied back."""
    return t.view(-1) if t.is_contiguous() else torch.empty(t.numel(), dtype=t.dtype, device=t.device)


# --- all_reduce ---------------------------------------------------------------------------------

def all_reduce(
    tensor: torch.Tensor,
    op: Any = "sum",
    group: Any = None,
    codec: Any = None,
    async_op: bool = False,
    *,
    error_feedback: ErrorFeedback | None = None,
    key: Hashable = None,
    min_bytes: int | None = None,
) -> Handle | None:
    """In-place all-reduce of ``tensor``. ``error_feedback`` (with ``key`` naming the logical tensor)
    compensates both lossy encodes: each rank's reduce-scatter chunks, and the all-gather payload of
    the reduced chunk this rank owns. Compensating only the first would leave the second encode's
    error as a fixed bias in the time average; compensating it on the owning rank keeps every rank
    bit-identical because all of them decode the same compensated payload."""
    t0 = _start()
    _check_tensor(tensor, "all_reduce")
    opn = op_name(op)
    tr = for_group(group)
    if tr.rank < 0:
        return None
    c = _plan(codec, tensor, min_bytes, tr, opn)
    t = tensor.detach()
    raw = _nbytes(t)
    if c is None:
        buf = _contig(t)
        inner = tr.native_all_reduce(buf, opn, async_op)

        def then_native() -> None:
            _copy_back(t, buf)
            _recorder("all_reduce", "native", raw, raw, t0)()

        return _finish(async_op, inner, then_native, [tensor])
    if error_feedback is not None and key is None:
        raise PolicyError("all_reduce: error_feedback needs key= naming the logical tensor")

    # One loop over segments, a three-stage pipeline: while segment s is encoded, segment s-1's
    # all-to-all and segment s-2's all-gather are on the wire; while s-1 is reduced and re-encoded,
    # s's all-to-all is; while s-2 is decoded, s's all-to-all and s-1's all-gather are. Unsegmented,
    # codec work and communication run strictly one after the other, so the codec's CPU/GPU time adds
    # to the link time instead of hiding under it. Every rank derives the same segments from
    # (numel, dtype, world size) and issues the same collectives in the same order.
    p, n, dtype = tr.world_size, t.numel(), t.dtype
    flat = _contig(t.reshape(-1))
    out = _output_flat(t)
    sender = _sender(c, tr)
    segments = _segments(n, p, t.element_size())
    gathers: list[tuple[int, int, int, torch.Tensor, Any]] = []  # all-gathers issued, not yet decoded
    wire = 0
    reducing = None  # the segment whose all-to-all is in flight
    for s, (lo, seg_numel, chunk) in enumerate(segments):
        send, nbytes = _encode_chunks(c, sender, flat[lo:lo + seg_numel], chunk, p, error_feedback, key, _ef_segment(s))
        recv = torch.empty_like(send)
        wire += send.numel()
        issued = (s, lo, seg_numel, chunk, nbytes, recv, send, tr.all_to_all(recv, send, True))
        if reducing is not None:
            gathers.append(_reduce_and_gather(c, sender, tr, reducing, opn, dtype, error_feedback, key))
        reducing = issued
        if not async_op and len(gathers) > 1:
            _decode_gathered(c, gathers.pop(0), out)
    gathers.append(_reduce_and_gather(c, sender, tr, reducing, opn, dtype, error_feedback, key))

    def then() -> None:
        for g in gathers:
            _decode_gathered(c, g, out)
        _copy_back(t, out)
        _recorder("all_reduce", c.spec, raw, wire, t0)()

    if async_op:
        return Handle([g[-1] for g in gathers], then, [tensor])
    then()
    return None


#: all_reduce pipelines tensors larger than this (input bytes per segment) so that codec work overlaps
#: communication; each segment costs a few collective launches, so segments must stay large enough for
#: the link time to dominate that fixed cost. Tests shrink it to exercise many segments.
SEGMENT_BYTES = 8 << 20

#: per-rank chunks of full segments are multiples of this many elements, a multiple of every codec's
#: block size, so no block straddles two chunks or needs padding inside a segment
_CHUNK_ALIGN_NUMEL = 4096


def _segments(n: int, p: int, element_size: int) -> list[tuple[int, int, int]]:
    """``(first element, numel, per-rank chunk numel)`` of each segment of an ``n``-element all_reduce.
    A tensor of at most one segment is a single segment with chunk ``ceil(n / p)``, exactly the
    unsegmented layout; larger ones get full segments of ``p`` aligned chunks and a shorter last one."""
    chunk = max(SEGMENT_BYTES // (element_size * p) // _CHUNK_ALIGN_NUMEL, 1) * _CHUNK_ALIGN_NUMEL
    seg_numel = p * chunk
    if n <= seg_numel:
        return [(0, n, -(-n // p))]
    full = [(lo, seg_numel, chunk) for lo in range(0, n - seg_numel + 1, seg_numel)]
    rest = n - len(full) * seg_numel
    return full + ([(n - rest, rest, -(-rest // p))] if rest else [])


def _ef_segment(segment: int) -> tuple:
    """Suffix of one segment's error-feedback keys: none for the first segment (an unsegmented
    tensor keeps the keys ``(key, "rs", i)`` / ``(key, "ag")``), ``(segment,)`` after it. The logical
    key stays first, so ``ErrorFeedback.reset(key)`` drops every segment's residuals."""
    return () if segment == 0 else (segment,)


def _spans(m: int, p: int, element_size: int) -> list[tuple[int, int]]:
    """``(start, numel)`` spans of a per-rank chunk of ``m`` elements for reduce_scatter / all_gather:
    the per-rank chunks of :func:`_segments`, so each span's collective moves what one all_reduce
    segment's does; ``m`` up to one span is one span (the unsegmented layout)."""
    span = max(SEGMENT_BYTES // (element_size * p) // _CHUNK_ALIGN_NUMEL, 1) * _CHUNK_ALIGN_NUMEL
    return [(a, min(span, m - a)) for a in range(0, m, span)]


def _encode_rows(
    c: Codec, sender: Codec, rows: torch.Tensor, ef: ErrorFeedback | None, key: Hashable, segment: tuple
) -> tuple[torch.Tensor, int]:
    """Encode row i of ``rows`` ([p, numel], rows contiguous) as payload i of one [p * nbytes] buffer.
    Error-feedback keys: ``(key, "rs", i) + segment``."""
    p, numel = rows.shape
    nbytes = c.encoded_nbytes(numel, rows.dtype)
    send = torch.empty(p * nbytes, dtype=torch.uint8, device=rows.device)
    out = send.view(p, nbytes)
    for i in range(p):
        out[i].copy_(ef.encode((key, "rs", i) + segment, rows[i], c) if ef is not None else sender.encode(rows[i]))
    return send, nbytes


def _reduce_and_gather(c, sender, tr, issued, opn, dtype, ef, key):
    """Wait for one segment's all-to-all, reduce this rank's chunk (second codec round trip starts
    here) and issue the all-gather of its encoding; returns what :func:`_decode_gathered` needs."""
    s, lo, seg_numel, chunk, nbytes, recv, send, handle = issued
    p = tr.world_size
    handle.wait()
    reduced = c.decode_sum(recv.view(p, nbytes), chunk, dtype)
    if opn == "avg":
        reduced /= p
    reduced = reduced.to(dtype)
    if ef is not None:
        mine = ef.encode((key, "ag") + _ef_segment(s), reduced, c)
    else:
        mine = sender.encode(reduced)
    gathered = torch.empty(p * nbytes, dtype=torch.uint8, device=recv.device)
    return (lo, seg_numel, chunk, gathered, tr.all_gather(gathered, _contig(mine), True))


def _decode_gathered(c, gather, out: torch.Tensor) -> None:
    lo, seg_numel, chunk, gathered, handle = gather
    handle.wait()
    _decode_rows(c, gathered.view(-1, c.encoded_nbytes(chunk, out.dtype)), chunk, out[lo:lo + seg_numel])


# --- reduce_scatter_tensor ----------------------------------------------------------------------

def reduce_scatter_tensor(
    output: torch.Tensor,
    input: torch.Tensor,
    op: Any = "sum",
    group: Any = None,
    codec: Any = None,
    async_op: bool = False,
    *,
    error_feedback: ErrorFeedback | None = None,
    key: Hashable = None,
    min_bytes: int | None = None,
) -> Handle | None:
    """``output`` = this rank's chunk of the reduction of every rank's ``input`` (p * output.numel()
    elements, chunk i = flat elements [i*m, (i+1)*m)). One codec round trip: all-to-all of the encoded
    chunks, then a fused decode-and-sum."""
    t0 = _start()
    _check_tensor(output, "reduce_scatter_tensor")
    _check_tensor(input, "reduce_scatter_tensor")
    opn = op_name(op)
    tr = for_group(group)
    if tr.rank < 0:
        return None
    p = tr.world_size
    out, inp = output.detach(), input.detach()
    if inp.numel() != p * out.numel() or inp.dtype != out.dtype:
        raise TransportError(
            f"reduce_scatter_tensor: input must hold {p} x output ({out.numel()} x {out.dtype}), "
            f"got {inp.numel()} x {inp.dtype}"
        )
    c = _plan(codec, inp, min_bytes, tr, opn)
    raw = _nbytes(inp)
    if c is None:
        obuf = _contig(out)
        inner = tr.native_reduce_scatter(obuf, _contig(inp), opn, async_op)

        def then_native() -> None:
            _copy_back(out, obuf)
            _recorder("reduce_scatter", "native", raw, raw, t0)()

        return _finish(async_op, inner, then_native, [output])
    if error_feedback is not None and key is None:
        raise PolicyError("reduce_scatter_tensor: error_feedback needs key= naming the logical tensor")

    # Pipelined over spans of the per-rank chunk (see all_reduce): span s's decode-and-sum overlaps
    # span s+1's all-to-all; every all-to-all is issued at call time.
    m, dtype = out.numel(), out.dtype
    rows = _contig(inp.reshape(-1)).view(p, m)
    obuf = _output_flat(out)
    sender = _sender(c, tr)
    exchanges = []  # (span start, span numel, recv, nbytes, handle), issued, not yet reduced
    wire = 0
    for s, (a, span) in enumerate(_spans(m, p, inp.element_size())):
        send, nbytes = _encode_rows(c, sender, rows[:, a:a + span], error_feedback, key, _ef_segment(s))
        recv = torch.empty_like(send)
        wire += send.numel()
        exchanges.append((a, span, recv, nbytes, tr.all_to_all(recv, send, True)))
        if not async_op and len(exchanges) > 1:
            _reduce_span(c, exchanges.pop(0), p, opn, obuf)

    def then() -> None:
        for x in exchanges:
            _reduce_span(c, x, p, opn, obuf)
        _copy_back(out, obuf)
        _recorder("reduce_scatter", c.spec, raw, wire, t0)()

    if async_op:
        return Handle([x[-1] for x in exchanges], then, [output])
    then()
    return None


def _reduce_span(c: Codec, exchange, p: int, opn: str, obuf: torch.Tensor) -> None:
    a, span, recv, nbytes, handle = exchange
    handle.wait()
    reduced = c.decode_sum(recv.view(p, nbytes), span, obuf.dtype)
    if opn == "avg":
        reduced /= p
    obuf[a:a + span].copy_(reduced)


# --- all_gather_into_tensor ---------------------------------------------------------------------

def all_gather_into_tensor(
    output: torch.Tensor,
    input: torch.Tensor,
    group: Any = None,
    codec: Any = None,
    async_op: bool = False,
    *,
    min_bytes: int | None = None,
) -> Handle | None:
    """``output`` = every rank's ``input`` concatenated in rank order; the caller's own slot is decoded
    from its own payload, so every rank holds the same bytes."""
    t0 = _start()
    _check_tensor(output, "all_gather_into_tensor")
    _check_tensor(input, "all_gather_into_tensor")
    tr = for_group(group)
    if tr.rank < 0:
        return None
    p = tr.world_size
    out, inp = output.detach(), input.detach()
    if out.numel() != p * inp.numel() or inp.dtype != out.dtype:
        raise TransportError(
            f"all_gather_into_tensor: output must hold {p} x input ({inp.numel()} x {inp.dtype}), "
            f"got {out.numel()} x {out.dtype}"
        )
    c = _plan(codec, inp, min_bytes, tr)
    raw = _nbytes(inp)
    if c is None:
        obuf = _contig(out)
        inner = tr.native_all_gather(obuf, _contig(inp), async_op)

        def then_native() -> None:
            _copy_back(out, obuf)
            _recorder("all_gather", "native", raw, raw, t0)()

        return _finish(async_op, inner, then_native, [output])

    # Pipelined over spans of the input (see all_reduce): span s's decode overlaps span s+1's
    # all-gather; every all-gather is issued at call time.
    m = inp.numel()
    flat = _contig(inp.reshape(-1))
    obuf = _output_flat(out).view(p, m)
    sender = _sender(c, tr)
    gathers = []  # (span start, span numel, gathered, handle), issued, not yet decoded
    wire = 0
    for a, span in _spans(m, p, inp.element_size()):
        payload = _contig(sender.encode(flat[a:a + span]))
        gathered = torch.empty(p * payload.numel(), dtype=torch.uint8, device=inp.device)
        wire += payload.numel()
        gathers.append((a, span, gathered, tr.all_gather(gathered, payload, True)))
        if not async_op and len(gathers) > 1:
            _decode_span(c, gathers.pop(0), obuf)

    def then() -> None:
        for g in gathers:
            _decode_span(c, g, obuf)
        _copy_back(out, obuf)
        _recorder("all_gather", c.spec, raw, wire, t0)()

    if async_op:
        return Handle([g[-1] for g in gathers], then, [output])
    then()
    return None


def _decode_span(c: Codec, gather, obuf: torch.Tensor) -> None:
    """Decode row i of one span's all-gather into ``obuf[i, span]`` (``obuf``: [p, m])."""
    a, span, gathered, handle = gather
    handle.wait()
    rows = gathered.view(obuf.shape[0], -1)
    for i in range(obuf.shape[0]):
        c.decode(rows[i], span, obuf.dtype, out=obuf[i, a:a + span])


# --- broadcast ----------------------------------------------------------------------------------

def broadcast(
    tensor: torch.Tensor,
    src: int,
    group: Any = None,
    codec: Any = None,
    async_op: bool = False,
    *,
    min_bytes: int | None = None,
) -> Handle | None:
    """Broadcast from global rank ``src``. With a lossy codec the root adopts the decoded values, so
    every rank (root included) ends with identical bytes."""
    t0 = _start()
    _check_tensor(tensor, "broadcast")
    tr = for_group(group)
    if tr.rank < 0:
        return None
    root = tr.group_rank(src)
    t = tensor.detach()
    raw = _nbytes(t)
    c = _plan(codec, t, min_bytes, tr)
    if c is None:
        buf = _contig(t)
        inner = tr.native_broadcast(buf, root, async_op)

        def then_native() -> None:
            _copy_back(t, buf)
            _recorder("broadcast", "native", raw, raw, t0)()

        return _finish(async_op, inner, then_native, [tensor])

    nbytes = c.encoded_nbytes(t.numel(), t.dtype)
    if tr.rank == root:
        payload = _contig(_sender(c, tr).encode(t))
    else:
        payload = torch.empty(nbytes, dtype=torch.uint8, device=t.device)
    inner = tr.broadcast(payload, root, async_op)

    def then() -> None:
        c.decode(payload, t.numel(), t.dtype, out=t)
        _recorder("broadcast", c.spec, raw, nbytes, t0)()

    return _finish(async_op, inner, then, [tensor])


# --- all_to_all_single --------------------------------------------------------------------------

def all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    group: Any = None,
    codec: Any = None,
    async_op: bool = False,
    *,
    output_split_sizes: list[int] | None = None,
    input_split_sizes: list[int] | None = None,
    min_bytes: int | None = None,
) -> Handle | None:
    """Chunk j of ``input`` (along dim 0) goes to rank j; chunk i of ``output`` comes from rank i.
    Equal splits are compressed (each chunk encoded on its own, the own chunk decoded too); uneven
    ``*_split_sizes`` go native, as does an input not divisible into p equal chunks."""
    t0 = _start()
    _check_tensor(output, "all_to_all_single")
    _check_tensor(input, "all_to_all_single")
    tr = for_group(group)
    if tr.rank < 0:
        return None
    p = tr.world_size
    out, inp = output.detach(), input.detach()
    raw = _nbytes(inp)
    equal = (
        _equal_splits(output_split_sizes, out, p) and _equal_splits(input_split_sizes, inp, p)
        and inp.numel() == out.numel() and inp.dtype == out.dtype
        and inp.dim() > 0 and inp.shape[0] % p == 0
    )
    c = _plan(codec, inp, min_bytes, tr) if equal else None
    if c is None:
        obuf = _contig(out)
        if equal:
            output_split_sizes = input_split_sizes = None
        inner = tr.native_all_to_all(obuf, _contig(inp), output_split_sizes, input_split_sizes, async_op)

        def then_native() -> None:
            _copy_back(out, obuf)
            _recorder("all_to_all", "native", raw, raw, t0)()

        return _finish(async_op, inner, then_native, [output])

    m = inp.numel() // p
    send, nbytes = _encode_chunks(c, _sender(c, tr), _contig(inp.reshape(-1)), m, p, None, None)
    recv = torch.empty_like(send)
    inner = tr.all_to_all(recv, send, async_op)

    def then() -> None:
        flat = _output_flat(out)
        _decode_rows(c, recv.view(p, nbytes), m, flat)
        _copy_back(out, flat)
        _recorder("all_to_all", c.spec, raw, p * nbytes, t0)()

    return _finish(async_op, inner, then, [output])


def _equal_splits(splits: list[int] | None, t: torch.Tensor, p: int) -> bool:
    if not splits:
        return True
    return t.dim() > 0 and len(splits) == p and all(int(s) * p == t.shape[0] for s in splits)


# --- point to point -----------------------------------------------------------------------------

def isend(
    tensor: torch.Tensor, dst: int, group: Any = None, codec: Any = None, *, tag: int = 0, min_bytes: int | None = None
) -> Handle | None:
    """Send ``tensor`` to global rank ``dst``; the handle's ``wait()`` completes the send."""
    t0 = _start()
    _check_tensor(tensor, "isend")
    tr = for_group(group)
    if tr.rank < 0:
        return None
    peer = tr.group_rank(dst)
    t = tensor.detach()
    raw = _nbytes(t)
    c = _plan(codec, t, min_bytes, tr)
    if c is None:
        buf = _contig(t)
        return Handle([tr.native_isend(buf, peer, tag)], lambda: (buf, _recorder("send", "native", raw, raw, t0)())[1], [tensor])
    payload = _contig(_sender(c, tr).encode(t))
    return Handle([tr.isend(payload, peer, tag)], lambda: (payload, _recorder("send", c.spec, raw, payload.numel(), t0)())[1], [tensor])


def irecv(
    tensor: torch.Tensor, src: int, group: Any = None, codec: Any = None, *, tag: int = 0, min_bytes: int | None = None
) -> Handle | None:
    """Receive into ``tensor`` from global rank ``src``; the handle's ``wait()`` decodes into it."""
    t0 = _start()
    _check_tensor(tensor, "irecv")
    if src is None:
        raise TransportError("irecv/recv need src= (a compressed payload's sender must be known)")
    tr = for_group(group)
    if tr.rank < 0:
        return None
    peer = tr.group_rank(src)
    t = tensor.detach()
    raw = _nbytes(t)
    c = _plan(codec, t, min_bytes, tr)
    if c is None:
        buf = _contig(t)

        def then_native() -> None:
            _copy_back(t, buf)
            _recorder("recv", "native", raw, raw, t0)()

        return Handle([tr.native_irecv(buf, peer, tag)], then_native, [tensor])
    nbytes = c.encoded_nbytes(t.numel(), t.dtype)
    payload = torch.empty(nbytes, dtype=torch.uint8, device=t.device)

    def then() -> None:
        c.decode(payload, t.numel(), t.dtype, out=t)
        _recorder("recv", c.spec, raw, nbytes, t0)()

    return Handle([tr.irecv(payload, peer, tag)], then, [tensor])


def send(tensor: torch.Tensor, dst: int, group: Any = None, codec: Any = None, *, tag: int = 0, min_bytes: int | None = None) -> None:
    h = isend(tensor, dst, group, codec, tag=tag, min_bytes=min_bytes)
    if h is not None:
        h.wait()


def recv(tensor: torch.Tensor, src: int, group: Any = None, codec: Any = None, *, tag: int = 0, min_bytes: int | None = None) -> int | None:
    """Returns the sender's global rank, like ``torch.distributed.recv``."""
    h = irecv(tensor, src, group, codec, tag=tag, min_bytes=min_bytes)
    if h is None:
        return None
    h.wait()
    return src


__all__ = [
    "DEFAULT_MIN_BYTES", "ErrorFeedback", "all_gather_into_tensor", "all_reduce", "all_to_all_single",
    "broadcast", "irecv", "isend", "recv", "reduce_scatter_tensor", "send",
]
