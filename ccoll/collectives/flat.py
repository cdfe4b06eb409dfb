"""The flat compressed algorithms: every rank talks to every rank of the group.

Leaves of :mod:`ccoll.collectives`: the router has already validated the arguments, decided that the
call compresses (``c``, never None here) and picked this algorithm; each function issues its
communication and hands the completion to the call's :class:`~ccoll.collectives.call.Run`.

all_reduce = compressed reduce-scatter by all-to-all (each rank decodes the p payloads of its chunk
and sums them in fp32) + compressed all-gather of the reduced chunk: two codec round trips whatever the
world size (compressing at every ring hop would compound the error p-1 times). Two ranks take
:mod:`.small`'s one exchange instead (the router's rule). Tensors above
:data:`~ccoll.collectives.segments.SEGMENT_BYTES` are pipelined over segments so codec work overlaps
the wire. Every rank decodes the all-gather bytes the others receive (its own slot too), so replicas
stay bit-identical. Codec calls are the batched API only (one call per phase and segment).
"""
from __future__ import annotations

from typing import Any, Callable, Hashable

import torch

from ..codecs import Codec
from ..feedback import residual_key
from ..transports import Transport
from .call import Run, contig, copy_back, feedback_buffer, flat_view, output_flat, plain, reduce_into, rows
from .phases import is_labelled
from .salts import OWN, REDUCED, salts
from .segments import segments, spans


# --- all_reduce ---------------------------------------------------------------------------------

def residual_slots(c: Codec, p: int, rank: int, numel: int, element_size: int) -> list[tuple[str, int, int, int]]:
    """The residuals :func:`all_reduce` asks error feedback for, as (phase, segment, first element, numel)
    of the flat tensor (a last segment's chunks may run past it: zero padding): per segment, "rs" (the p
    chunks this rank encodes) and "ag" (the reduced chunk it owns)."""
    out = []
    for s, (lo, _, chunk) in enumerate(segments(numel, p, element_size, c.align_numel)):
        out += [("rs", s, lo, p * chunk), ("ag", s, lo + rank * chunk, chunk)]
    return out


def all_reduce(run: Run, c: Codec, tr: Transport, tensor: torch.Tensor, opn: str, async_op: bool,
               ef: Any, key: Hashable, salt: int | None):
    """A three-stage pipeline over segments: while segment s is encoded, segment s-1's all-to-all and
    segment s-2's all-gather are on the wire; while s-1 is reduced and re-encoded, s's all-to-all is;
    while s-2 is decoded, s's all-to-all and s-1's all-gather are. Unsegmented, codec work and
    communication would run strictly one after the other, so the codec's time would add to the link
    time instead of hiding under it. Error feedback compensates both lossy encodes (each rank's
    reduce-scatter chunks, and the all-gather payload of the reduced chunk it owns): compensating only
    the first would leave the second's error as a fixed bias."""
    t = tensor.detach()
    p, n, dtype = tr.world_size, t.numel(), t.dtype
    side = run.stream
    salt_of = salts(salt, tr, c)
    gathers: list = []  # all-gathers issued, not yet decoded
    wire = 0
    with side.on_side():
        side.keep(t)
        flat = contig(flat_view(t))
        out = output_flat(t)
        reducing = None  # the segment whose all-to-all is in flight
        for s, (lo, seg_numel, chunk) in enumerate(segments(n, p, t.element_size(), c.align_numel)):
            send = rows(p, c.payload_nbytes(chunk, dtype), t.device)
            fb = feedback_buffer(ef, residual_key(key, "rs", s), p * chunk, dtype, t.device, c, side)
            c.encode_rows(flat[lo:lo + seg_numel], send, chunk, feedback=fb, salt=salt_of(OWN, s))
            recv = torch.empty_like(send)
            wire += send.numel()
            issued = (s, lo, seg_numel, chunk, recv, send, side.wrap(tr.all_to_all(recv, send, True)))
            if reducing is not None:
                gathers.append(_reduce_and_gather(c, tr, side, reducing, opn, dtype, ef, key, salt_of))
            reducing = issued
            if not async_op and len(gathers) > 1:
                _decode_gathered(c, gathers.pop(0), out)
        gathers.append(_reduce_and_gather(c, tr, side, reducing, opn, dtype, ef, key, salt_of))

    def body() -> None:
        for g in gathers:
            _decode_gathered(c, g, out)
        copy_back(t, out)

    works = [g[-1] for g in gathers] if async_op else []
    return run.compressed(async_op, works, body, c, t.numel() * t.element_size(), wire, [tensor])


def _reduce_and_gather(c, tr, side, issued, opn, dtype, ef, key, salt_of):
    """Wait for one segment's all-to-all, reduce this rank's chunk (one fused decode-and-sum; the second
    codec round trip starts here) and issue the all-gather of its encoding (one encode, with its error
    feedback); returns what :func:`_decode_gathered` needs."""
    s, lo, seg_numel, chunk, recv, send, handle = issued
    handle.wait()
    reduced = c.decode_sum(recv, chunk, dtype, out=torch.empty(chunk, dtype=torch.float32, device=recv.device))
    if opn == "avg":
        reduced.div_(tr.world_size)
    mine = reduced if dtype == torch.float32 else reduced.to(dtype)
    payload = rows(1, recv.shape[1], recv.device)
    fb = feedback_buffer(ef, residual_key(key, "ag", s), chunk, dtype, recv.device, c, side)
    c.encode_rows(mine, payload, chunk, feedback=fb, salt=salt_of(REDUCED, s))
    gathered = rows(tr.world_size, recv.shape[1], recv.device)
    return (lo, seg_numel, chunk, gathered, payload, side.wrap(tr.all_gather(gathered, payload, True)))


def _decode_gathered(c, gather, out: torch.Tensor) -> None:
    """Decode one segment's p gathered payloads straight into its slice of the output."""
    lo, seg_numel, chunk, gathered, payload, handle = gather
    handle.wait()
    c.decode_rows(gathered, out[lo:lo + seg_numel], chunk)


# --- reduce_scatter_tensor / all_gather_into_tensor -----------------------------------------------

def _span_buffers(side, c: Codec, inp: torch.Tensor, out: torch.Tensor, m: int, p: int):
    """reduce_scatter / all_gather set-up, with the side stream current: the caller's tensors kept
    alive there, the flat input, where to decode (``out``'s memory or scratch), the spans of ``m``."""
    side.keep(inp, out)
    return contig(flat_view(inp)), output_flat(out), spans(m, p, inp.element_size(), c.align_numel)


def reduce_scatter_tensor(run: Run, c: Codec, tr: Transport, output: torch.Tensor, input: torch.Tensor, opn: str,
                          async_op: bool, ef: Any, key: Hashable, salt: int | None):
    """One codec round trip: all-to-all of the encoded chunks, then a fused decode-and-sum. Pipelined
    over spans of the per-rank chunk: span s's decode-and-sum overlaps span s+1's all-to-all."""
    out, inp = output.detach(), input.detach()
    p, m, dtype = tr.world_size, out.numel(), out.dtype
    side = run.stream
    salt_of = salts(salt, tr, c)
    exchanges = []  # (span start, span numel, recv, send, handle), issued, not yet reduced
    wire = 0
    with side.on_side():
        flat, obuf, pieces = _span_buffers(side, c, inp, out, m, p)
        for s, (a, span) in enumerate(pieces):
            # one span is the whole input; a span of several gathers its p row pieces (one copy)
            src = flat if len(pieces) == 1 else flat.view(p, m)[:, a:a + span].reshape(-1)
            send = rows(p, c.payload_nbytes(span, dtype), inp.device)
            fb = feedback_buffer(ef, residual_key(key, "rs", s), p * span, dtype, inp.device, c, side)
            c.encode_rows(src, send, span, feedback=fb, salt=salt_of(OWN, s))
            recv = torch.empty_like(send)
            wire += send.numel()
            exchanges.append((a, span, recv, send, side.wrap(tr.all_to_all(recv, send, True))))
            if not async_op and len(exchanges) > 1:
                _reduce_span(c, exchanges.pop(0), p, opn, obuf)

    def body() -> None:
        for x in exchanges:
            _reduce_span(c, x, p, opn, obuf)
        copy_back(out, obuf)

    works = [x[-1] for x in exchanges] if async_op else []
    return run.compressed(async_op, works, body, c, inp.numel() * inp.element_size(), wire, [output])


def _reduce_span(c: Codec, exchange, p: int, opn: str, obuf: torch.Tensor) -> None:
    """Decode-and-sum one span's p payloads into its slice of the output."""
    a, span, recv, send, handle = exchange
    handle.wait()
    reduce_into(c, recv, obuf[a:a + span], p, opn)


def all_gather_into_tensor(run: Run, c: Codec, tr: Transport, output: torch.Tensor, input: torch.Tensor,
                           async_op: bool, salt: int | None):
    """Every input encoded once; every rank decodes all p payloads, its own too. Pipelined over spans
    of the input: span s's decode overlaps span s+1's all-gather."""
    out, inp = plain(output), plain(input)
    p, m, dtype, device = tr.world_size, inp.numel(), inp.dtype, inp.device  # each read builds an object: once
    side = run.stream
    salt_of = salts(salt, tr, c)
    gathers = []  # (span start, span numel, gathered, payload, handle), issued, not yet decoded
    wire = 0
    with side.on_side():
        flat, obuf, pieces = _span_buffers(side, c, inp, out, m, p)
        # a sync call of one span has nothing to overlap its exchange with: issued sync (no request; the side
        # stream ordered after it, as torch's sync calls order the current stream), unless phases are labelled
        issue_async = async_op or len(pieces) > 1 or is_labelled(tr)
        for s, (a, span) in enumerate(pieces):
            nbytes = c.payload_nbytes(span, dtype)
            payload = rows(1, nbytes, device)
            src = flat if len(pieces) == 1 else flat[a:a + span]  # one span is the whole input: no slice view
            c.encode_rows(src, payload, span, salt=salt_of(OWN, s))
            gathered = rows(p, nbytes, device)
            wire += nbytes
            gathers.append((a, span, gathered, payload,
                            side.wrap(tr.all_gather(gathered, payload, issue_async))))
            if not async_op and len(gathers) > 1:
                _decode_span(c, gathers.pop(0), obuf, m)

    def body() -> None:
        for g in gathers:
            _decode_span(c, g, obuf, m)
        if obuf is not out:
            copy_back(out, obuf)

    works = [g[-1] for g in gathers] if async_op else []
    return run.compressed(async_op, works, body, c, m * dtype.itemsize, wire, [output])


def _decode_span(c: Codec, gather, obuf: torch.Tensor, m: int) -> None:
    """Decode one span's p payloads into columns [a, a+span) of ``obuf`` viewed as [p, m]: straight
    into it when the span is the whole input (rows are then contiguous in the output); a span of a
    pipelined input lands in p strided pieces, so it is decoded into scratch and placed by one copy
    (``decode_rows`` writes contiguous rows)."""
    a, span, gathered, payload, handle = gather
    if handle is not None:  # None: issued sync, done
        handle.wait()
    p = gathered.shape[0]
    if span == m:
        c.decode_rows(gathered, obuf, span)
        return
    scratch = torch.empty(p * span, dtype=obuf.dtype, device=obuf.device)
    c.decode_rows(gathered, scratch, span)
    obuf.view(p, m)[:, a:a + span].copy_(scratch.view(p, span))


# --- broadcast / all_to_all_single ------------------------------------------------------------------

def broadcast(run: Run, c: Codec, tr: Transport, tensor: torch.Tensor, root: int, async_op: bool, salt: int | None):
    """The root encodes once; every rank, the root included, decodes the same payload (so the root
    adopts the decoded values and every replica holds the same bytes)."""
    t = tensor.detach()
    n, side = t.numel(), run.stream
    with side.on_side():
        side.keep(t)
        payload = rows(1, c.payload_nbytes(n, t.dtype), t.device)
        if tr.rank == root:
            c.encode_rows(contig(flat_view(t)), payload, n, salt=salts(salt, tr, c)(OWN, 0))
        inner = side.wrap(tr.broadcast(payload, root, async_op))

    return run.compressed(async_op, [inner], _decoding(c, payload, t, n), c, n * t.element_size(), payload.numel(),
                          [tensor])


def _decoding(c: Codec, payload: torch.Tensor, t: torch.Tensor, row_numel: int) -> Callable[[], None]:
    """The completion of a call that receives payload rows for ``t``: decode them into it (through a
    contiguous buffer when ``t`` is not)."""
    def body() -> None:
        obuf = output_flat(t)
        c.decode_rows(payload, obuf, row_numel)
        copy_back(t, obuf)

    return body


def all_to_all_single(run: Run, c: Codec, tr: Transport, output: torch.Tensor, input: torch.Tensor,
                      async_op: bool, salt: int | None):
    """Equal splits only (the router sends uneven ones native): the p chunks encoded as the p rows of
    one call; the own chunk is decoded too."""
    out, inp = output.detach(), input.detach()
    m, side = inp.numel() // tr.world_size, run.stream
    with side.on_side():
        side.keep(inp, out)
        send = rows(tr.world_size, c.payload_nbytes(m, inp.dtype), inp.device)
        c.encode_rows(contig(flat_view(inp)), send, m, salt=salts(salt, tr, c)(OWN, 0))
        recv = torch.empty_like(send)
        inner = side.wrap(tr.all_to_all(recv, send, async_op))
    send_alive = [send]  # the send buffer lives until the exchange completes

    decode = _decoding(c, recv, out, m)

    def body() -> None:
        decode()
        del send_alive[:]

    return run.compressed(async_op, [inner], body, c, inp.numel() * inp.element_size(), send.numel(), [output])


# --- point to point -------------------------------------------------------------------------------

def isend(run: Run, c: Codec, tr: Transport, tensor: torch.Tensor, peer: int, tag: int, salt: int | None):
    t = tensor.detach()
    n, side = t.numel(), run.stream
    with side.on_side():
        side.keep(t)
        payload = rows(1, c.payload_nbytes(n, t.dtype), t.device)
        c.encode_rows(contig(flat_view(t)), payload, n, salt=salts(salt, tr, c)(OWN, 0))
        inner = side.wrap(tr.isend(payload, peer, tag))
    sending = [payload]

    def body() -> None:
        del sending[:]  # the payload lives until the send completes

    return run.compressed(True, [inner], body, c, n * t.element_size(), payload.numel(), [tensor])


def irecv(run: Run, c: Codec, tr: Transport, tensor: torch.Tensor, peer: int, tag: int):
    t = tensor.detach()
    n, side = t.numel(), run.stream
    with side.on_side():
        side.keep(t)
        payload = rows(1, c.payload_nbytes(n, t.dtype), t.device)
        inner = side.wrap(tr.irecv(payload, peer, tag))

    return run.compressed(True, [inner], _decoding(c, payload, t, n), c, n * t.element_size(), payload.numel(),
                          [tensor])


__all__ = ["all_gather_into_tensor", "all_reduce", "all_to_all_single", "broadcast", "irecv", "isend",
           "reduce_scatter_tensor"]
