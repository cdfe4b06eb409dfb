"""Collectives for codecs whose payload size varies (``Codec.variable_size``: the "lossless" codec).

Why a separate path: the fixed-size collectives (ccoll/collectives.py) post receive buffers from
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
Passthrough rules are the fixed path's (``collectives._plan``): those calls go native unchanged.
``async_op=True`` runs the exchange at call time and returns a completed handle (send/recv stay
asynchronous, as on the fixed path). Codecs here are exact, so ``error_feedback`` has nothing to carry
and ``salt`` nothing to seed: both are accepted and ignored.
"""
from __future__ import annotations

import torch

from . import collectives as _c
from .errors import TransportError
from .transports import Handle, done_handle, for_group, op_name


def _rows_from(gathered: torch.Tensor, cap: int) -> torch.Tensor:
    """[p, width] received bytes -> [p, cap] rows for the batched decode (zeros past width, never read)."""
    if gathered.shape[1] == cap:
        return gathered
    rows = torch.zeros(gathered.shape[0], cap, dtype=torch.uint8, device=gathered.device)
    rows[:, :gathered.shape[1]] = gathered
    return rows


def _done(async_op: bool, outputs: list) -> Handle | None:
    return done_handle(outputs=outputs) if async_op else None


def _gather_sizes(tr, used: int, device) -> list[int]:
    mine = torch.tensor([used], dtype=torch.int64, device=device)
    every = torch.empty(tr.world_size, dtype=torch.int64, device=device)
    tr.native_all_gather(every, mine)
    return every.tolist()


def _gather_payload(c, tr, payload: torch.Tensor, used: int) -> tuple[torch.Tensor, int]:
    """All-gather one payload row of ``used`` bytes: ([p, capacity] rows, bytes this rank sent)."""
    width = max(_gather_sizes(tr, used, payload.device))
    gathered = torch.empty(tr.world_size, width, dtype=torch.uint8, device=payload.device)
    tr.all_gather(gathered.view(-1), payload[0, :width])
    return _rows_from(gathered, payload.shape[1]), width


def _begin(tensors: list, group, codec, min_bytes, op: str | None = None):
    """(start, transport, codec) of a compressed call on ``tensors[-1]`` (the tensor the fixed path plans
    on), or None when the fixed path's native call serves it: the passthrough rules of
    ``collectives._plan``, a caller outside the group, or arguments that are not tensors (the native
    call raises the fixed path's errors)."""
    t0 = _c._start()
    if not all(isinstance(x, torch.Tensor) for x in tensors):
        return None
    tr = for_group(group)
    if tr.rank < 0:
        return None
    c = _c._plan(codec, tensors[-1].detach(), min_bytes, tr, op)
    return None if c is None else (t0, tr, c)


# --- all_gather_into_tensor / broadcast ----------------------------------------------------------

def all_gather_into_tensor(output, input, group=None, codec=None, async_op=False, *, min_bytes=None, salt=None):
    """``collectives.all_gather_into_tensor`` for a variable-size codec (see the module docstring)."""
    call = _begin([output, input], group, codec, min_bytes)
    if call is None or output.numel() != call[1].world_size * input.numel() or input.dtype != output.dtype:
        return _c.all_gather_into_tensor(output, input, group, None, async_op)  # native (or its error)
    t0, tr, c = call
    out, inp = output.detach(), input.detach()
    m = inp.numel()
    payload = _c._rows(1, c.encoded_nbytes(m, inp.dtype), inp.device)
    c.encode_rows(_c._contig(inp.reshape(-1)), payload, m)
    rows, wire = _gather_payload(c, tr, payload, c.used_nbytes(payload)[0])
    obuf = _c._output_flat(out)
    c.decode_rows(rows, obuf, m)
    _c._copy_back(out, obuf)
    _c._recorder("all_gather", c.spec, _c._nbytes(inp), wire, t0)()
    return _done(async_op, [output])


def broadcast(tensor, src, group=None, codec=None, async_op=False, *, min_bytes=None, salt=None):
    """``collectives.broadcast`` for a variable-size codec: the root's size, then its used bytes."""
    call = _begin([tensor], group, codec, min_bytes)
    if call is None:
        return _c.broadcast(tensor, src, group, None, async_op)
    t0, tr, c = call
    t = tensor.detach()
    root, n = tr.group_rank(src), t.numel()
    payload = _c._rows(1, c.encoded_nbytes(n, t.dtype), t.device)
    size = torch.zeros(1, dtype=torch.int64, device=t.device)
    if tr.rank == root:
        c.encode_rows(_c._contig(t.reshape(-1)), payload, n)
        size[0] = c.used_nbytes(payload)[0]
    tr.native_broadcast(size, root)
    used = int(size[0])
    if used > payload.shape[1]:
        raise TransportError(f"broadcast: the root announced {used} payload bytes, more than the capacity {payload.shape[1]}")
    tr.broadcast(payload[0, :used], root)
    if tr.rank != root:
        payload[0, used:].zero_()
    obuf = _c._output_flat(t)
    c.decode_rows(payload, obuf, n)  # the root decodes too: every rank holds the same bytes
    _c._copy_back(t, obuf)
    _c._recorder("broadcast", c.spec, _c._nbytes(t), used, t0)()
    return _done(async_op, [tensor])


# --- reduce_scatter_tensor / all_reduce ----------------------------------------------------------

def _exact_reduce(c, tr, flat: torch.Tensor, chunk: int, opn: str) -> tuple[torch.Tensor, int]:
    """This rank's chunk (``chunk`` values of ``flat``'s dtype) of the exact reduction of every rank's
    ``flat`` (p chunks of ``chunk``, zero past its end), and the bytes this rank sent."""
    p, dtype = tr.world_size, flat.dtype
    send = _c._rows(p, c.encoded_nbytes(chunk, dtype), flat.device)
    c.encode_rows(flat, send, chunk)
    used = torch.tensor(c.used_nbytes(send), dtype=torch.int64)
    theirs = torch.empty(p, dtype=torch.int64, device=flat.device)
    tr.native_all_to_all(theirs, used.to(flat.device))
    recv_sizes = theirs.tolist()
    packed = torch.cat([send[j, :int(used[j])] for j in range(p)])
    recv = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=flat.device)
    tr.native_all_to_all(recv, packed, recv_sizes, used.tolist())
    rows = torch.zeros_like(send)
    for i, piece in enumerate(torch.split(recv, recv_sizes)):
        rows[i, :piece.numel()] = piece
    acc = torch.empty(chunk, dtype=torch.float32, device=flat.device)
    c.decode_sum(rows, chunk, dtype, out=acc)
    if opn == "avg":
        acc.div_(p)
    return acc.to(dtype), packed.numel()


def reduce_scatter_tensor(output, input, op="sum", group=None, codec=None, async_op=False, *,
                          error_feedback=None, key=None, min_bytes=None, salt=None):
    """``collectives.reduce_scatter_tensor`` for a variable-size codec (exact reduce, see the module)."""
    opn = op_name(op)
    call = _begin([output, input], group, codec, min_bytes, opn)
    if call is None or input.numel() != call[1].world_size * output.numel() or input.dtype != output.dtype:
        return _c.reduce_scatter_tensor(output, input, op, group, None, async_op)
    t0, tr, c = call
    out, inp = output.detach(), input.detach()
    mine, wire = _exact_reduce(c, tr, _c._contig(inp.reshape(-1)), out.numel(), opn)
    _c._copy_back(out, mine)
    _c._recorder("reduce_scatter", c.spec, _c._nbytes(inp), wire, t0)()
    return _done(async_op, [output])


def all_reduce(tensor, op="sum", group=None, codec=None, async_op=False, *,
               error_feedback=None, key=None, min_bytes=None, salt=None):
    """``collectives.all_reduce`` for a variable-size codec: exact reduce-scatter of ceil(n/p) chunks,
    then the variable-size all-gather of the reduced chunk. Equal, bit for bit, to codec "none"."""
    opn = op_name(op)
    call = _begin([tensor], group, codec, min_bytes, opn)
    if call is None:
        return _c.all_reduce(tensor, op, group, None, async_op)
    t0, tr, c = call
    t = tensor.detach()
    p, n = tr.world_size, t.numel()
    chunk = -(-n // p)
    mine, wire = _exact_reduce(c, tr, _c._contig(t.reshape(-1)), chunk, opn)
    payload = _c._rows(1, c.encoded_nbytes(chunk, t.dtype), t.device)
    c.encode_rows(mine, payload, chunk)
    rows, _ = _gather_payload(c, tr, payload, c.used_nbytes(payload)[0])
    obuf = _c._output_flat(t)
    c.decode_rows(rows, obuf, chunk)
    _c._copy_back(t, obuf)
    # wire: the p encoded chunks of the input, the fixed path's convention (ccoll/collectives.py "Stats")
    _c._recorder("all_reduce", c.spec, _c._nbytes(t), wire, t0)()
    return _done(async_op, [tensor])


# --- point to point --------------------------------------------------------------------------------

def _short_receives(tr) -> bool:
    """Whether a receive may be posted larger than the message that fills it: gloo (its pair checks
    only length <= buffer) and MPI (the count is an upper bound) allow it; NCCL and the simulated world
    match sizes exactly, so there a variable-size payload travels at its capacity (correct, no saving).
    Both ends of a send/recv see the same transport kind, so they agree."""
    return tr.kind == "mpi" or getattr(tr, "backend", "") == "gloo"


def isend(tensor, dst, group=None, codec=None, *, tag=0, min_bytes=None, salt=None):
    """``collectives.isend`` for a variable-size codec: one message of the used bytes (the receiver
    posted a capacity-sized receive and reads the size from the payload's header)."""
    call = _begin([tensor], group, codec, min_bytes)
    if call is None:
        return _c.isend(tensor, dst, group, None, tag=tag)
    t0, tr, c = call
    t = tensor.detach()
    peer, n = tr.group_rank(dst), t.numel()
    payload = _c._rows(1, c.encoded_nbytes(n, t.dtype), t.device)
    c.encode_rows(_c._contig(t.reshape(-1)), payload, n)
    used = c.used_nbytes(payload)[0] if _short_receives(tr) else payload.shape[1]
    work = tr.isend(payload[0, :used], peer, tag)
    keep = [payload]  # the buffer lives until the send completes

    def then() -> None:
        del keep[:]
        _c._recorder("send", c.spec, _c._nbytes(t), used, t0)()

    return Handle([work], then, [tensor])


def irecv(tensor, src, group=None, codec=None, *, tag=0, min_bytes=None):
    """``collectives.irecv`` for a variable-size codec: a capacity-sized receive posted now (so the
    message order per peer and tag is the fixed path's, native messages included); ``wait()`` decodes
    (the header says how many bytes arrived and is validated by the decode)."""
    call = None if src is None else _begin([tensor], group, codec, min_bytes)
    if call is None:
        return _c.irecv(tensor, src, group, None, tag=tag)  # native, or its error for src=None
    t0, tr, c = call
    t = tensor.detach()
    n = t.numel()
    payload = torch.zeros(1, c.encoded_nbytes(n, t.dtype), dtype=torch.uint8, device=t.device)
    work = tr.irecv(payload[0], tr.group_rank(src), tag)

    def then() -> None:
        obuf = _c._output_flat(t)
        c.decode_rows(payload, obuf, n)
        _c._copy_back(t, obuf)
        used = c.used_nbytes(payload)[0] if _short_receives(tr) else payload.shape[1]
        _c._recorder("recv", c.spec, _c._nbytes(t), used, t0)()

    return Handle([work], then, [tensor])


def send(tensor, dst, group=None, codec=None, *, tag=0, min_bytes=None, salt=None) -> None:
    h = isend(tensor, dst, group, codec, tag=tag, min_bytes=min_bytes)
    if h is not None:
        h.wait()


def recv(tensor, src, group=None, codec=None, *, tag=0, min_bytes=None) -> int | None:
    h = irecv(tensor, src, group, codec, tag=tag, min_bytes=min_bytes)
    if h is None:
        return None
    h.wait()
    return src


__all__ = ["all_gather_into_tensor", "all_reduce", "broadcast", "irecv", "isend",
           "recv", "reduce_scatter_tensor", "send"]
