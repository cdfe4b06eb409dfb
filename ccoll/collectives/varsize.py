"""Collectives for codecs whose payload size varies (``Codec.variable_size``: the "lossless" codec).

Why a separate path: the fixed-size algorithms (:mod:`.flat`) post receive buffers from
(numel, dtype) alone. A variable-size codec still fits them -- its ``encoded_nbytes`` is a capacity
(raw + 16 bytes) and bytes past a row's ``used_nbytes`` are zero, so they stay correct -- but they would
move the capacity, i.e. more than the raw tensor. Here only the used bytes move:

- send/recv: one message of the used bytes into a capacity-sized receive posted at call time, where the
  transport allows a receive larger than its message (gloo, MPI); the payload's header says how many
  bytes came. A separate size message was tried first and rejected: the payload receive can only be
  posted after the size arrives, so a native message on the same (peer, tag) posted in between (NeoX
  sends the attention mask that way) matched the wrong receive. NCCL and the simulated world need equal
  sizes: there the capacity travels (correct, no saving).
- all_gather_into_tensor / broadcast: sizes first (an all-gather of one int64 per rank; broadcast: the
  root's size), then payloads padded to the largest size of the call (gloo and NCCL all-gathers move
  equal sizes).
- reduce_scatter_tensor / all_reduce: "lossless" for a reduction means: every chunk travels exactly, and
  the reduction is the fp32 rank-order sum of the exact values rounded once to the dtype -- bit for bit
  what codec "none" gives (a sum of floats is not the sum's input; this is the exact reduce of exactly
  transferred chunks). Sizes by an all-to-all, then the payloads by an all-to-all with exact split
  sizes; all_reduce then all-gathers the reduced chunk as above.

Every rank ends with the same bytes (the values are exact, and each rank decodes its own payload too).
Leaves of :mod:`ccoll.collectives`: the router has applied the passthrough rules
(:func:`~ccoll.collectives.call.decide`) and validated the arguments before calling here.
``async_op=True`` runs the exchange and the decode at call time and returns a completed handle (stats
are recorded when it is waited for, as on every path; send/recv stay asynchronous, as on the fixed
path). Codec work runs on the side stream through the call's :class:`~ccoll.collectives.call.Run`. Codecs here are exact, so ``error_feedback`` has nothing to carry
and ``salt`` nothing to seed: both are accepted and ignored.
"""
from __future__ import annotations

import torch

from ..codecs import Codec
from ..errors import TransportError
from ..transports import Transport
from .call import Run, contig, copy_back, flat_view, output_flat, rows


def _rows_from(gathered: torch.Tensor, cap: int) -> torch.Tensor:
    """[p, width] received bytes -> [p, cap] rows for the batched decode (zeros past width, never read)."""
    if gathered.shape[1] == cap:
        return gathered
    out = torch.zeros(gathered.shape[0], cap, dtype=torch.uint8, device=gathered.device)
    out[:, :gathered.shape[1]] = gathered
    return out


def _gather_sizes(tr: Transport, used: int, device) -> list[int]:
    mine = torch.tensor([used], dtype=torch.int64, device=device)
    every = torch.empty(tr.world_size, dtype=torch.int64, device=device)
    tr.native_all_gather(every, mine)
    return every.tolist()


def _gather_payload(tr: Transport, payload: torch.Tensor, used: int) -> tuple[torch.Tensor, int]:
    """All-gather one payload row of ``used`` bytes: ([p, capacity] rows, bytes this rank sent)."""
    width = max(_gather_sizes(tr, used, payload.device))
    gathered = torch.empty(tr.world_size, width, dtype=torch.uint8, device=payload.device)
    tr.all_gather(gathered, payload[0, :width])
    return _rows_from(gathered, payload.shape[1]), width


def _done(run: Run, async_op: bool, c: Codec, raw: int, wire: int, outputs: list):
    """Everything already ran at call time: end the call (done event, stats, a completed handle)."""
    return run.compressed(async_op, [], lambda: None, c, raw, wire, outputs)


# --- all_gather_into_tensor / broadcast ----------------------------------------------------------

def all_gather_into_tensor(run: Run, c: Codec, tr: Transport, output, input, async_op: bool):
    """Sizes first, then the payloads padded to the largest size of the call."""
    out, inp = output.detach(), input.detach()
    m = inp.numel()
    with run.stream.on_side():
        run.stream.keep(inp, out)
        payload = rows(1, c.payload_nbytes(m, inp.dtype), inp.device)
        c.encode_rows(contig(flat_view(inp)), payload, m)
        gathered, wire = _gather_payload(tr, payload, c.used_nbytes(payload)[0])
        obuf = output_flat(out)
        c.decode_rows(gathered, obuf, m)
        copy_back(out, obuf)
    return _done(run, async_op, c, m * inp.element_size(), wire, [output])


def broadcast(run: Run, c: Codec, tr: Transport, tensor, root: int, async_op: bool):
    """The root's size, then its used bytes; the root decodes too (every rank holds the same bytes)."""
    t = tensor.detach()
    n = t.numel()
    with run.stream.on_side():
        run.stream.keep(t)
        payload = rows(1, c.payload_nbytes(n, t.dtype), t.device)
        size = torch.zeros(1, dtype=torch.int64, device=t.device)
        if tr.rank == root:
            c.encode_rows(contig(flat_view(t)), payload, n)
            size[0] = c.used_nbytes(payload)[0]
        tr.native_broadcast(size, root)
        used = int(size[0])
        if used > payload.shape[1]:
            raise TransportError(f"broadcast: the root announced {used} payload bytes, more than the capacity {payload.shape[1]}")
        tr.broadcast(payload[0, :used], root)
        if tr.rank != root:
            payload[0, used:].zero_()
        obuf = output_flat(t)
        c.decode_rows(payload, obuf, n)
        copy_back(t, obuf)
    return _done(run, async_op, c, n * t.element_size(), used, [tensor])


# --- reduce_scatter_tensor / all_reduce ----------------------------------------------------------

def _exact_reduce(c: Codec, tr: Transport, flat: torch.Tensor, chunk: int, opn: str) -> tuple[torch.Tensor, int]:
    """This rank's chunk (``chunk`` values of ``flat``'s dtype) of the exact reduction of every rank's
    ``flat`` (p chunks of ``chunk``, zero past its end), and the bytes this rank sent."""
    p, dtype = tr.world_size, flat.dtype
    send = rows(p, c.payload_nbytes(chunk, dtype), flat.device)
    c.encode_rows(flat, send, chunk)
    used = torch.tensor(c.used_nbytes(send), dtype=torch.int64)
    theirs = torch.empty(p, dtype=torch.int64, device=flat.device)
    tr.native_all_to_all(theirs, used.to(flat.device))
    recv_sizes = theirs.tolist()
    packed = torch.cat([send[j, :int(used[j])] for j in range(p)])
    recv = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=flat.device)
    tr.native_all_to_all(recv, packed, recv_sizes, used.tolist())
    received = torch.zeros_like(send)
    for i, piece in enumerate(torch.split(recv, recv_sizes)):
        received[i, :piece.numel()] = piece
    acc = torch.empty(chunk, dtype=torch.float32, device=flat.device)
    c.decode_sum(received, chunk, dtype, out=acc)
    if opn == "avg":
        acc.div_(p)
    return acc.to(dtype), packed.numel()


def reduce_scatter_tensor(run: Run, c: Codec, tr: Transport, output, input, opn: str, async_op: bool):
    """Exact reduce of exactly transferred chunks (see the module docstring)."""
    out, inp = output.detach(), input.detach()
    with run.stream.on_side():
        run.stream.keep(inp, out)
        mine, wire = _exact_reduce(c, tr, contig(flat_view(inp)), out.numel(), opn)
        copy_back(out, mine)
    return _done(run, async_op, c, inp.numel() * inp.element_size(), wire, [output])


def all_reduce(run: Run, c: Codec, tr: Transport, tensor, opn: str, async_op: bool):
    """Exact reduce-scatter of ceil(n/p) chunks, then the variable-size all-gather of the reduced
    chunk. Equal, bit for bit, to codec "none". Wire: the p encoded chunks of the input, the fixed
    path's convention."""
    t = tensor.detach()
    p, n = tr.world_size, t.numel()
    chunk = -(-n // p)
    with run.stream.on_side():
        run.stream.keep(t)
        mine, wire = _exact_reduce(c, tr, contig(flat_view(t)), chunk, opn)
        payload = rows(1, c.payload_nbytes(chunk, t.dtype), t.device)
        c.encode_rows(mine, payload, chunk)
        gathered, _ = _gather_payload(tr, payload, c.used_nbytes(payload)[0])
        obuf = output_flat(t)
        c.decode_rows(gathered, obuf, chunk)
        copy_back(t, obuf)
    return _done(run, async_op, c, n * t.element_size(), wire, [tensor])


# --- point to point --------------------------------------------------------------------------------

def isend(run: Run, c: Codec, tr: Transport, tensor, peer: int, tag: int):
    """One message of the used bytes (the receiver posted a capacity-sized receive and reads the size
    from the payload's header)."""
    t = tensor.detach()
    n = t.numel()
    with run.stream.on_side():
        run.stream.keep(t)
        payload = rows(1, c.payload_nbytes(n, t.dtype), t.device)
        c.encode_rows(contig(flat_view(t)), payload, n)
        used = c.used_nbytes(payload)[0] if tr.short_receives else payload.shape[1]
        work = run.stream.wrap(tr.isend(payload[0, :used], peer, tag))
    keep = [payload]  # the buffer lives until the send completes

    def body() -> None:
        del keep[:]

    return run.compressed(True, [work], body, c, n * t.element_size(), used, [tensor])


def irecv(run: Run, c: Codec, tr: Transport, tensor, peer: int, tag: int):
    """A capacity-sized receive posted now (so the message order per peer and tag is the fixed path's,
    native messages included); ``wait()`` decodes (the header says how many bytes arrived and is
    validated by the decode)."""
    t = tensor.detach()
    n = t.numel()
    with run.stream.on_side():
        run.stream.keep(t)
        payload = torch.zeros(1, c.payload_nbytes(n, t.dtype), dtype=torch.uint8, device=t.device)
        work = run.stream.wrap(tr.irecv(payload[0], peer, tag))
    used = [payload.shape[1]]

    def body() -> None:
        obuf = output_flat(t)
        c.decode_rows(payload, obuf, n)
        copy_back(t, obuf)
        if tr.short_receives:
            used[0] = c.used_nbytes(payload)[0]

    return run.compressed(True, [work], body, c, n * t.element_size(), lambda: used[0], [tensor])


__all__ = ["all_gather_into_tensor", "all_reduce", "broadcast", "irecv", "isend", "reduce_scatter_tensor"]
