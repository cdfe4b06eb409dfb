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
stats dimension (``ccoll.stats.dimension``) that was in effect at the call. Seconds: host clock on CPU;
on CUDA the time between an event at the call and the done event, read lazily when the stats are.

Codec calls: only the batched API (``encode_rows`` straight into the send rows, with the error-feedback
buffer as ``feedback=``; ``decode_rows`` straight into the output; ``decode_sum(out=)``), so each phase of
a segment is one codec call whatever the world size (tests/dist/test_collectives_launch_counts.py counts them).
Chunks are sized with ``codec.align_numel``; codec parameters are never read here.

Streams (CUDA): codec work runs on ccoll's side stream, ordered by events against the caller's stream
and the communication; the caller's stream waits for the outputs when the call ends (sync) or when the
handle's ``wait()`` runs (async). See :mod:`ccoll.streams`. CPU paths are unchanged by this.

Error feedback (all_reduce, reduce_scatter_tensor): see :class:`~ccoll.feedback.ErrorFeedback` and
:func:`all_reduce`; one residual buffer per (key, phase, segment): ``(key, "rs") + seg`` (the p chunks
this rank sends) and ``(key, "ag") + seg`` (the reduced chunk it owns). Stochastic rounding: each
encode gets a salt mixed from the caller's ``salt=`` (the patch/DDP/FSDP layers derive it from (step,
call key)) or, when None, a per-process-and-group call counter, with this rank's global rank, the phase
and the segment (see :func:`_salts`); the codec mixes it into its seed. The salt never travels, so this
changes no invariant above.
"""
from __future__ import annotations

import itertools
import threading
import time
import weakref
from typing import Any, Callable, Hashable

import torch

from . import streams as _streams
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


def _varsize(name: str) -> Callable:
    """Collective ``name`` of ccoll/varsize.py, for codecs whose payload size varies (``variable_size``):
    sizes first, then only the used bytes. Imported on first use: the fixed-size path never loads it."""
    from . import varsize

    return getattr(varsize, name)


_M64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a bijective 64-bit hash."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


_counters: "weakref.WeakKeyDictionary[Transport, Any]" = weakref.WeakKeyDictionary()
_counters_lock = threading.Lock()


def _salts(salt: int | None, tr: Transport) -> Callable[[int, int], int]:
    """``salt_of(phase, segment)`` for one call on this rank. A stochastic-rounding codec with one fixed
    seed would draw the same random numbers on every rank and every call (errors would correlate instead
    of cancelling in the sum, and repeat instead of averaging out over steps), so every encode gets a
    salt mixed from: the caller's ``salt`` (derived from (step, call key) by the patch/DDP/FSDP layers,
    so a resumed run draws what an uninterrupted one would) or, when None, a call counter of this
    process and group (reproducible run to run for a fixed call order); this rank's global rank (ranks
    decorrelate); the phase (reduce-scatter / all-gather) and the segment. Nonzero (0 means "no
    salt" to codecs). Deterministic codecs ignore it."""
    if salt is None:
        with _counters_lock:
            counter = _counters.get(tr)
            if counter is None:
                counter = _counters[tr] = itertools.count()
        base = _mix64(next(counter) ^ (tr.global_rank(0) << 40) ^ (tr.world_size << 20))
    else:
        base = _mix64(int(salt) & _M64)
    mine = _mix64(base ^ _mix64(tr.global_rank(tr.rank)))
    return lambda phase, segment: _mix64(mine ^ (phase << 48) ^ segment) or 1


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


def _finish(async_op: bool, inner: Any, then: Callable[[], Any], outputs: list) -> Handle | None:
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


def _recorder(op: str, codec: str, raw_bytes: int, wire_bytes: int, t0: tuple[float, str],
              call: Any = _streams.NULL) -> Callable[[], None]:
    return lambda: _record_stats(op, codec, raw_bytes, wire_bytes, call.seconds(t0[0]), dim=t0[1])


def _completion(call: Any, body: Callable[[], None], record: Callable[[], None]) -> Callable[[], None]:
    """What runs when a compressed call completes: ``body`` (decoding, copying back) with the side
    stream current, the done event, then the current stream (the caller's) waits for it, then stats."""
    def then() -> None:
        with call.on_side():
            body()
            call.finish()
        call.join()
        record()

    return then


def _copy_back(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy ``src`` (a contiguous buffer of ``dst``'s numel) into ``dst``, unless it is ``dst``'s own
    memory (a view of a contiguous ``dst``), where the copy would move bytes onto themselves."""
    if src is dst or (dst.is_contiguous() and src.data_ptr() == dst.data_ptr() and src.numel() == dst.numel()):
        return
    dst.copy_(src.view(dst.shape) if src.is_contiguous() else src.reshape(dst.shape))


def _output_flat(t: torch.Tensor) -> torch.Tensor:
    """Where to decode into: ``t``'s own memory when contiguous, else a scratch buffer copied back."""
    return t.view(-1) if t.is_contiguous() else torch.empty(t.numel(), dtype=t.dtype, device=t.device)


def _rows(p: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A [p, nbytes] payload buffer (what the batched codec calls and the transports share)."""
    return torch.empty(p, nbytes, dtype=torch.uint8, device=device)


def _feedback(ef: ErrorFeedback | None, key: Hashable, numel: int, dtype: torch.dtype, device, c: Codec):
    return None if ef is None else ef.buffer(key, numel, dtype, device, c)


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
    salt: int | None = None,
    hierarchy: str | None = None,
) -> Handle | None:
    """In-place all-reduce of ``tensor``. ``error_feedback`` (with ``key`` naming the logical tensor)
    compensates both lossy encodes: each rank's reduce-scatter chunks, and the all-gather payload of
    the reduced chunk this rank owns. Compensating only the first would leave the second encode's
    error as a fixed bias in the time average; compensating it on the owning rank keeps every rank
    bit-identical because all of them decode the same compensated payload. ``salt``: see
    :func:`_salts`."""
    if codec is not None and _as_codec(codec).variable_size:
        return _varsize("all_reduce")(tensor, op, group, codec, async_op, min_bytes=min_bytes)
    if hierarchy is not None:  # exact inside a node, compressed between nodes (ccoll.hierarchy)
        from . import hierarchy as _hier
        h = _hier.all_reduce(tensor, op, group, codec, async_op, hierarchy=hierarchy, error_feedback=error_feedback,
                             key=key, min_bytes=min_bytes, salt=salt)
        if h is not _hier.FLAT:
            return h
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
    # (numel, dtype, world size, codec) and issues the same collectives in the same order.
    p, n, dtype = tr.world_size, t.numel(), t.dtype
    call = _streams.begin(t.device)
    salt_of = _salts(salt, tr)
    gathers: list = []  # all-gathers issued, not yet decoded
    wire = 0
    with call.on_side():
        call.keep(t)
        flat = _contig(t.reshape(-1))
        out = _output_flat(t)
        reducing = None  # the segment whose all-to-all is in flight
        for s, (lo, seg_numel, chunk) in enumerate(_segments(n, p, t.element_size(), c.align_numel)):
            send = _rows(p, c.encoded_nbytes(chunk, dtype), t.device)
            fb = _feedback(error_feedback, (key, "rs") + _ef_segment(s), p * chunk, dtype, t.device, c)
            c.encode_rows(flat[lo:lo + seg_numel], send, chunk, feedback=fb, salt=salt_of(0, s))
            recv = torch.empty_like(send)
            wire += send.numel()
            issued = (s, lo, seg_numel, chunk, recv, send, call.wrap(tr.all_to_all(recv.view(-1), send.view(-1), True)))
            if reducing is not None:
                gathers.append(_reduce_and_gather(c, tr, call, reducing, opn, dtype, error_feedback, key, salt_of))
            reducing = issued
            if not async_op and len(gathers) > 1:
                _decode_gathered(c, gathers.pop(0), out)
        gathers.append(_reduce_and_gather(c, tr, call, reducing, opn, dtype, error_feedback, key, salt_of))

    def body() -> None:
        for g in gathers:
            _decode_gathered(c, g, out)
        _copy_back(t, out)

    then = _completion(call, body, _recorder("all_reduce", c.spec, raw, wire, t0, call))
    if async_op:
        return Handle([g[-1] for g in gathers], then, [tensor])
    then()
    return None


#: all_reduce pipelines tensors larger than this (input bytes per segment) so that codec work overlaps
#: communication; each segment costs a few collective launches, so segments must stay large enough for
#: the link time to dominate that fixed cost. Tests shrink it to exercise many segments.
SEGMENT_BYTES = 8 << 20


def _chunk_numel(p: int, element_size: int, align_numel: int) -> int:
    """Per-rank chunk of a full segment: a multiple of the codec's ``align_numel`` (no block straddles
    two chunks or needs padding inside a segment), about SEGMENT_BYTES / p bytes."""
    return max(SEGMENT_BYTES // (element_size * p) // align_numel, 1) * align_numel


def _segments(n: int, p: int, element_size: int, align_numel: int) -> list[tuple[int, int, int]]:
    """``(first element, numel, per-rank chunk numel)`` of each segment of an ``n``-element all_reduce.
    A tensor of at most one segment is a single segment with chunk ``ceil(n / p)``, exactly the
    unsegmented layout; larger ones get full segments of ``p`` aligned chunks and a shorter last one."""
    chunk = _chunk_numel(p, element_size, align_numel)
    seg_numel = p * chunk
    if n <= seg_numel:
        return [(0, n, -(-n // p))]
    full = [(lo, seg_numel, chunk) for lo in range(0, n - seg_numel + 1, seg_numel)]
    rest = n - len(full) * seg_numel
    return full + ([(n - rest, rest, -(-rest // p))] if rest else [])


def _ef_segment(segment: int) -> tuple:
    """Suffix of one segment's error-feedback keys: none for the first segment (an unsegmented
    tensor keeps the keys ``(key, "rs")`` / ``(key, "ag")``), ``(segment,)`` after it. The logical
    key stays first, so ``ErrorFeedback.reset(key)`` drops every segment's residuals."""
    return () if segment == 0 else (segment,)


def _spans(m: int, p: int, element_size: int, align_numel: int) -> list[tuple[int, int]]:
    """``(start, numel)`` spans of a per-rank chunk of ``m`` elements for reduce_scatter / all_gather:
    the per-rank chunks of :func:`_segments`, so each span's collective moves what one all_reduce
    segment's does; ``m`` up to one span is one span (the unsegmented layout)."""
    span = _chunk_numel(p, element_size, align_numel)
    return [(a, min(span, m - a)) for a in range(0, m, span)]


def _span_buffers(call, c: Codec, inp: torch.Tensor, out: torch.Tensor, m: int, p: int):
    """reduce_scatter / all_gather set-up, with the side stream current: the caller's tensors kept
    alive there, the flat input, where to decode (``out``'s memory or scratch), the spans of ``m``."""
    call.keep(inp, out)
    return _contig(inp.reshape(-1)), _output_flat(out), _spans(m, p, inp.element_size(), c.align_numel)


def _reduce_and_gather(c, tr, call, issued, opn, dtype, ef, key, salt_of):
    """Wait for one segment's all-to-all, reduce this rank's chunk (one fused decode-and-sum; the
    second codec round trip starts here) and issue the all-gather of its encoding (one encode, with
    its error feedback); returns what :func:`_decode_gathered` needs."""
    s, lo, seg_numel, chunk, recv, send, handle = issued
    handle.wait()
    reduced = c.decode_sum(recv, chunk, dtype, out=torch.empty(chunk, dtype=torch.float32, device=recv.device))
    if opn == "avg":
        reduced.div_(tr.world_size)
    mine = reduced if dtype == torch.float32 else reduced.to(dtype)
    payload = _rows(1, recv.shape[1], recv.device)
    fb = _feedback(ef, (key, "ag") + _ef_segment(s), chunk, dtype, recv.device, c)
    c.encode_rows(mine, payload, chunk, feedback=fb, salt=salt_of(1, s))
    gathered = _rows(tr.world_size, recv.shape[1], recv.device)
    return (lo, seg_numel, chunk, gathered, payload, call.wrap(tr.all_gather(gathered.view(-1), payload.view(-1), True)))


def _decode_gathered(c, gather, out: torch.Tensor) -> None:
    """Decode one segment's p gathered payloads straight into its slice of the output."""
    lo, seg_numel, chunk, gathered, payload, handle = gather
    handle.wait()
    c.decode_rows(gathered, out[lo:lo + seg_numel], chunk)


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
    salt: int | None = None,
    hierarchy: str | None = None,
) -> Handle | None:
    """``output`` = this rank's chunk of the reduction of every rank's ``input`` (p * output.numel()
    elements, chunk i = flat elements [i*m, (i+1)*m)). One codec round trip: all-to-all of the encoded
    chunks, then a fused decode-and-sum."""
    if codec is not None and _as_codec(codec).variable_size:
        return _varsize("reduce_scatter_tensor")(output, input, op, group, codec, async_op, min_bytes=min_bytes)
    if hierarchy is not None:  # exact inside a node, compressed between nodes (ccoll.hierarchy)
        from . import hierarchy as _hier
        h = _hier.reduce_scatter_tensor(output, input, op, group, codec, async_op, hierarchy=hierarchy,
                                        error_feedback=error_feedback, key=key, min_bytes=min_bytes, salt=salt)
        if h is not _hier.FLAT:
            return h
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
    call = _streams.begin(out.device)
    salt_of = _salts(salt, tr)
    exchanges = []  # (span start, span numel, recv, send, handle), issued, not yet reduced
    wire = 0
    with call.on_side():
        flat, obuf, spans = _span_buffers(call, c, inp, out, m, p)
        for s, (a, span) in enumerate(spans):
            # one span is the whole input; a span of several gathers its p row pieces (one copy)
            src = flat if len(spans) == 1 else flat.view(p, m)[:, a:a + span].reshape(-1)
            send = _rows(p, c.encoded_nbytes(span, dtype), inp.device)
            fb = _feedback(error_feedback, (key, "rs") + _ef_segment(s), p * span, dtype, inp.device, c)
            c.encode_rows(src, send, span, feedback=fb, salt=salt_of(0, s))
            recv = torch.empty_like(send)
            wire += send.numel()
            exchanges.append((a, span, recv, send, call.wrap(tr.all_to_all(recv.view(-1), send.view(-1), True))))
            if not async_op and len(exchanges) > 1:
                _reduce_span(c, exchanges.pop(0), p, opn, obuf)

    def body() -> None:
        for x in exchanges:
            _reduce_span(c, x, p, opn, obuf)
        _copy_back(out, obuf)

    then = _completion(call, body, _recorder("reduce_scatter", c.spec, raw, wire, t0, call))
    if async_op:
        return Handle([x[-1] for x in exchanges], then, [output])
    then()
    return None


def _reduce_span(c: Codec, exchange, p: int, opn: str, obuf: torch.Tensor) -> None:
    """Decode-and-sum one span's p payloads: straight into the output when it is fp32, else through
    an fp32 accumulator rounded once into it."""
    a, span, recv, send, handle = exchange
    handle.wait()
    dst = obuf[a:a + span]
    acc = dst if dst.dtype == torch.float32 else torch.empty(span, dtype=torch.float32, device=dst.device)
    c.decode_sum(recv, span, dst.dtype, out=acc)
    if opn == "avg":
        acc.div_(p)
    if acc is not dst:
        dst.copy_(acc)


# --- all_gather_into_tensor ---------------------------------------------------------------------

def all_gather_into_tensor(
    output: torch.Tensor,
    input: torch.Tensor,
    group: Any = None,
    codec: Any = None,
    async_op: bool = False,
    *,
    min_bytes: int | None = None,
    salt: int | None = None,
    hierarchy: str | None = None,
) -> Handle | None:
    """``output`` = every rank's ``input`` concatenated in rank order; the caller's own slot is decoded
    from its own payload, so every rank holds the same bytes."""
    if codec is not None and _as_codec(codec).variable_size:
        return _varsize("all_gather_into_tensor")(output, input, group, codec, async_op, min_bytes=min_bytes)
    if hierarchy is not None:  # exact inside a node, compressed between nodes (ccoll.hierarchy)
        from . import hierarchy as _hier
        h = _hier.all_gather_into_tensor(output, input, group, codec, async_op, hierarchy=hierarchy,
                                         min_bytes=min_bytes, salt=salt)
        if h is not _hier.FLAT:
            return h
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
    call = _streams.begin(inp.device)
    salt_of = _salts(salt, tr)
    gathers = []  # (span start, span numel, gathered, payload, handle), issued, not yet decoded
    wire = 0
    with call.on_side():
        flat, obuf, spans = _span_buffers(call, c, inp, out, m, p)
        for s, (a, span) in enumerate(spans):
            payload = _rows(1, c.encoded_nbytes(span, inp.dtype), inp.device)
            c.encode_rows(flat[a:a + span], payload, span, salt=salt_of(0, s))
            gathered = _rows(p, payload.shape[1], inp.device)
            wire += payload.numel()
            gathers.append((a, span, gathered, payload, call.wrap(tr.all_gather(gathered.view(-1), payload.view(-1), True))))
            if not async_op and len(gathers) > 1:
                _decode_span(c, gathers.pop(0), obuf, m)

    def body() -> None:
        for g in gathers:
            _decode_span(c, g, obuf, m)
        _copy_back(out, obuf)

    then = _completion(call, body, _recorder("all_gather", c.spec, raw, wire, t0, call))
    if async_op:
        return Handle([g[-1] for g in gathers], then, [output])
    then()
    return None


def _decode_span(c: Codec, gather, obuf: torch.Tensor, m: int) -> None:
    """Decode one span's p payloads into columns [a, a+span) of ``obuf`` viewed as [p, m]: straight
    into it when the span is the whole input (rows are then contiguous in the output); a span of a
    pipelined input lands in p strided pieces, so it is decoded into scratch and placed by one copy
    (``decode_rows`` writes contiguous rows)."""
    a, span, gathered, payload, handle = gather
    handle.wait()
    p = gathered.shape[0]
    if span == m:
        c.decode_rows(gathered, obuf, span)
        return
    scratch = torch.empty(p * span, dtype=obuf.dtype, device=obuf.device)
    c.decode_rows(gathered, scratch, span)
    obuf.view(p, m)[:, a:a + span].copy_(scratch.view(p, span))


# --- broadcast ----------------------------------------------------------------------------------

def broadcast(
    tensor: torch.Tensor,
    src: int,
    group: Any = None,
    codec: Any = None,
    async_op: bool = False,
    *,
    min_bytes: int | None = None,
    salt: int | None = None,
) -> Handle | None:
    """Broadcast from global rank ``src``. With a lossy codec the root adopts the decoded values, so
    every rank (root included) ends with identical bytes."""
    if codec is not None and _as_codec(codec).variable_size:
        return _varsize("broadcast")(tensor, src, group, codec, async_op, min_bytes=min_bytes)
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

    n = t.numel()
    call = _streams.begin(t.device)
    with call.on_side():
        call.keep(t)
        payload = _rows(1, c.encoded_nbytes(n, t.dtype), t.device)
        if tr.rank == root:
            c.encode_rows(_contig(t.reshape(-1)), payload, n, salt=_salts(salt, tr)(0, 0))
        inner = call.wrap(tr.broadcast(payload.view(-1), root, async_op))

    def body() -> None:
        obuf = _output_flat(t)
        c.decode_rows(payload, obuf, n)
        _copy_back(t, obuf)

    then = _completion(call, body, _recorder("broadcast", c.spec, raw, payload.numel(), t0, call))
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
    salt: int | None = None,
) -> Handle | None:
    """Chunk j of ``input`` (along dim 0) goes to rank j; chunk i of ``output`` comes from rank i.
    Equal splits are compressed (the p chunks encoded as the p rows of one call, the own chunk
    decoded too); uneven ``*_split_sizes`` go native, as does an input not divisible into p equal
    chunks."""
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
    call = _streams.begin(inp.device)
    with call.on_side():
        call.keep(inp, out)
        send = _rows(p, c.encoded_nbytes(m, inp.dtype), inp.device)
        c.encode_rows(_contig(inp.reshape(-1)), send, m, salt=_salts(salt, tr)(0, 0))
        recv = torch.empty_like(send)
        inner = call.wrap(tr.all_to_all(recv.view(-1), send.view(-1), async_op))

    def body() -> None:
        obuf = _output_flat(out)
        c.decode_rows(recv, obuf, m)
        _copy_back(out, obuf)
        del send_alive[:]

    send_alive = [send]  # the send buffer lives until the exchange completes
    then = _completion(call, body, _recorder("all_to_all", c.spec, raw, send.numel(), t0, call))
    return _finish(async_op, inner, then, [output])


def _equal_splits(splits: list[int] | None, t: torch.Tensor, p: int) -> bool:
    if not splits:
        return True
    return t.dim() > 0 and len(splits) == p and all(int(s) * p == t.shape[0] for s in splits)


# --- point to point -----------------------------------------------------------------------------

def isend(
    tensor: torch.Tensor, dst: int, group: Any = None, codec: Any = None, *, tag: int = 0,
    min_bytes: int | None = None, salt: int | None = None,
) -> Handle | None:
    """Send ``tensor`` to global rank ``dst``; the handle's ``wait()`` completes the send."""
    if codec is not None and _as_codec(codec).variable_size:
        return _varsize("isend")(tensor, dst, group, codec, tag=tag, min_bytes=min_bytes)
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
    n = t.numel()
    call = _streams.begin(t.device)
    with call.on_side():
        call.keep(t)
        payload = _rows(1, c.encoded_nbytes(n, t.dtype), t.device)
        c.encode_rows(_contig(t.reshape(-1)), payload, n, salt=_salts(salt, tr)(0, 0))
        inner = call.wrap(tr.isend(payload.view(-1), peer, tag))

    def body() -> None:
        del sending[:]  # the payload lives until the send completes

    sending = [payload]
    return Handle([inner], _completion(call, body, _recorder("send", c.spec, raw, payload.numel(), t0, call)), [tensor])


def irecv(
    tensor: torch.Tensor, src: int, group: Any = None, codec: Any = None, *, tag: int = 0,
    min_bytes: int | None = None,
) -> Handle | None:
    """Receive into ``tensor`` from global rank ``src``; the handle's ``wait()`` decodes into it."""
    if codec is not None and _as_codec(codec).variable_size:
        return _varsize("irecv")(tensor, src, group, codec, tag=tag, min_bytes=min_bytes)
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
    n = t.numel()
    call = _streams.begin(t.device)
    with call.on_side():
        call.keep(t)
        payload = _rows(1, c.encoded_nbytes(n, t.dtype), t.device)
        inner = call.wrap(tr.irecv(payload.view(-1), peer, tag))

    def body() -> None:
        obuf = _output_flat(t)
        c.decode_rows(payload, obuf, n)
        _copy_back(t, obuf)

    return Handle([inner], _completion(call, body, _recorder("recv", c.spec, raw, payload.numel(), t0, call)), [tensor])


def send(tensor: torch.Tensor, dst: int, group: Any = None, codec: Any = None, *, tag: int = 0,
         min_bytes: int | None = None, salt: int | None = None) -> None:
    h = isend(tensor, dst, group, codec, tag=tag, min_bytes=min_bytes, salt=salt)
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
