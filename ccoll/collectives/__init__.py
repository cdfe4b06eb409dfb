"""Compressed collectives with ``torch.distributed``'s signatures plus ``codec=``: the router.

Every public collective here does the same four things, through :mod:`.call` (the skeleton):
validate its arguments, ask :func:`.call.decide` whether the call compresses (the passthrough rules,
in one place), pick the algorithm, and end through the call's :class:`.call.Run` (stream ordering,
stats, handle). The algorithms are leaves that never import this module:

- :mod:`.flat` -- every rank talks to every rank (fixed-size codecs);
- :mod:`.hierarchy` -- exact inside a node, compressed between nodes (``hierarchy="node"``), when
  :mod:`.nodes` finds a layout for the group (otherwise flat);
- :mod:`.small` -- the two-rank all_reduce, one exchange per segment (see :func:`.small.one_exchange`);
- :mod:`.varsize` -- codecs whose payload size varies (``Codec.variable_size``: "lossless");
- helpers: :mod:`.segments` (pipelining), :mod:`.salts` (stochastic-rounding seeds).

The path of one compressed all_reduce, ``ccoll.all_reduce(grad, "avg", group, "int8:block=256")``:

1. :func:`all_reduce` checks ``grad`` is a tensor, normalises the op, gets the group's transport
   (``ccoll.transports.for_group``) and returns at once on a rank outside the group;
2. :class:`.call.Run` notes the start time, the stats dimension and (CUDA) records "inputs ready" on
   the caller's stream;
3. :func:`.call.decide` turns the spec into the cached codec and applies the passthrough rules (world
   size 1, non-float/sparse/complex/tiny tensors, MAX/MIN, dtypes the codec does not take -> native);
   :func:`.phases.labelled` then wraps codec and transport so each phase is a profiler range, only
   while a ``torch.profiler`` (or the bench's ``--breakdown``) listens;
4. no hierarchy and a fixed-size codec: on two ranks (:func:`.small.one_exchange`) each segment is
   encoded once, all-gathered and decoded-and-summed by every rank in rank order
   (:func:`.small.all_reduce`: one exchange and one quantization per segment, pipelined); otherwise
   :func:`.flat.all_reduce` encodes each segment's p chunks
   (one ``encode_rows``, with error feedback if given), all-to-alls
   them, decodes-and-sums its own chunk in fp32, re-encodes it and all-gathers it, pipelined over
   segments, all on the side stream;
5. :meth:`.call.Run.compressed` finishes it: decodes the gathered rows into ``grad`` (side stream),
   records the done event, makes the caller's stream wait for it and records the stats row -- now
   (sync) or in the handle's ``wait()`` (``async_op=True``).

Invariants:
- every lossy collective leaves bit-identical results on every rank that should agree: the all-gather
  decodes the caller's own slot from its own payload, all_reduce decodes its own reduced chunk, and the
  broadcast root adopts the decoded values;
- exact passthrough (the native call, unchanged results) for everything :func:`.call.decide` says, and
  for all_to_all with uneven split sizes. Both sides of a send/recv decide from (shape, dtype, codec,
  min_bytes, world size) alone, so they always agree;
- non-contiguous tensors work (results copied back in place); ``op="avg"`` works on every backend;
- ``async_op=True``: every collective is *issued* at call time, in program order, so ranks can never
  issue them in different orders; the handle's ``wait()`` finishes the last communication step,
  decodes and records stats.

Stats: every call records ``(op, codec spec or "native", raw_bytes, wire_bytes, seconds)``; raw is this
rank's uncompressed contribution, wire the encoded bytes that stand for it (all_reduce / all_to_all /
reduce_scatter: the p encoded chunks of its input; all_gather / broadcast / send / recv: the one
payload; hierarchical calls: what entered and left the inter-node phase). Native calls record wire =
raw. Seconds: see :mod:`.call` (one meaning on every path).

Error feedback (all_reduce, reduce_scatter_tensor): one residual per lossy encode, keyed by
:func:`ccoll.feedback.residual_key` (key, phase, segment); a one-exchange all_reduce has one per segment ("whole"). Stochastic rounding: :mod:`.salts`.
``min_bytes=``: the threshold of the rule that chose the codec (a policy's ``min_bytes``), or None for
the default.
"""
from __future__ import annotations

from typing import Any, Hashable, NamedTuple

import torch

from ..defaults import DEFAULT_MIN_BYTES  # tensors below it go native unless min_bytes= says otherwise
from ..errors import PolicyError, TransportError
from ..feedback import ErrorFeedback
from ..transports import Handle, for_group, op_name
from ..transports.base import OPS
from . import flat, hierarchy as _hierarchy, nodes, small, varsize
from ..codecs import Codec
from .call import Run, as_codec, check_tensor, contig, copy_back, decide, nbytes, plain
from .phases import labelled


def _check_hierarchy(hierarchy: Any) -> None:
    if hierarchy is not None and hierarchy not in nodes.HIERARCHIES:
        raise PolicyError(f"hierarchy must be None or one of {', '.join(nodes.HIERARCHIES)}, got {hierarchy!r}")


def _check_feedback(error_feedback: Any, key: Hashable, what: str) -> None:
    if error_feedback is not None and key is None:
        raise PolicyError(f"{what}: error_feedback needs key= naming the logical tensor")


def _layout(hierarchy: Any, group: Any) -> "nodes.Layout | None":
    return None if hierarchy is None else nodes.layout_or_flat(group)


def all_reduce(tensor: torch.Tensor, op: Any = "sum", group: Any = None, codec: Any = None, async_op: bool = False,
               *, error_feedback: ErrorFeedback | None = None, key: Hashable = None, min_bytes: int | None = None,
               salt: int | None = None, hierarchy: str | None = None) -> Handle | None:
    """In-place all-reduce of ``tensor``. ``error_feedback`` (with ``key`` naming the logical tensor)
    compensates both lossy encodes, so every rank stays bit-identical (they all decode the same
    compensated payloads). ``hierarchy="node"``: exact inside a node, compressed between nodes."""
    # the common cases inline (a tensor, a canonical op name, no hierarchy, error feedback with its key): each
    # check below is a function call only when it can fail; a small compressed call's host path is a few dozen
    # such frames
    if not isinstance(tensor, torch.Tensor):
        check_tensor(tensor, "all_reduce")
    opn = op if type(op) is str and op in OPS else op_name(op)
    tr = for_group(group)
    if tr.rank < 0:
        return None
    if hierarchy is not None:
        _check_hierarchy(hierarchy)
    t = plain(tensor)
    run = Run("all_reduce", t.device)
    c = decide(codec, t, op=opn, min_bytes=min_bytes, transport=tr)
    if c is None:
        buf = contig(t)
        return run.native(async_op, tr.native_all_reduce(buf, opn, async_op), lambda: copy_back(t, buf), nbytes(t),
                          [tensor])
    c, tr = labelled(c, tr)
    if c.variable_size:  # exact codecs: nothing to feed back, nothing to gain from a hierarchy
        return varsize.all_reduce(run, c, tr, tensor, opn, async_op)
    if error_feedback is not None and key is None:
        _check_feedback(error_feedback, key, "all_reduce")
    if hierarchy is not None:
        lay = _layout(hierarchy, group)
        if lay is not None:
            return _hierarchy.all_reduce(run, c, lay, tensor, opn, async_op, error_feedback, key, salt)
    algorithm = _all_reduce_algorithm(c, tr.world_size, t.numel(), t.dtype)
    return algorithm.all_reduce(run, c, tr, tensor, opn, async_op, error_feedback, key, salt)


def _all_reduce_algorithm(c: Codec, p: int, numel: int, dtype: torch.dtype) -> Any:
    """The one rule choosing a flat all_reduce's algorithm (module ``small`` or ``flat``): from (codec, p,
    numel, dtype) only, so every rank chooses alike, and :func:`all_reduce_residuals` follows it."""
    return small if small.one_exchange(c, p, numel, dtype) else flat


class ResidualSlot(NamedTuple):
    """One error-feedback residual a compressed all_reduce asks for (``ErrorFeedback.buffer`` with
    ``residual_key(key, phase, segment)``): ``numel`` residuals for the flat tensor's elements from
    ``start`` (past the tensor's end: zero padding of the last segment)."""

    phase: str
    segment: int
    start: int
    numel: int


def all_reduce_residuals(numel: int, dtype: torch.dtype, group: Any = None, codec: Any = None) -> list[ResidualSlot]:
    """The residuals ``all_reduce`` of ``numel`` elements of ``dtype`` on ``group`` with ``codec`` (no hierarchy)
    will ask its error feedback for, by the algorithm it will run. Why: a caller that keeps residuals per
    piece of the tensor (ccoll.ddp: per parameter of a packed bucket) maps them by asking here, so it follows
    any change of the router's rule or of an algorithm's layout instead of re-deriving it."""
    tr = for_group(group)
    c = as_codec(codec)
    if c is None or tr.rank < 0:
        return []
    return residual_slots(c, tr.world_size, tr.rank, numel, dtype)


def residual_slots(codec: Codec, p: int, rank: int, numel: int, dtype: torch.dtype) -> list[ResidualSlot]:
    """:func:`all_reduce_residuals` for rank ``rank`` of ``p`` ranks, without a group."""
    algorithm = _all_reduce_algorithm(codec, p, int(numel), dtype)
    element_size = torch.empty((), dtype=dtype).element_size()
    return [ResidualSlot(*slot) for slot in algorithm.residual_slots(codec, p, rank, int(numel), element_size)]


def _pair(op: str, output: torch.Tensor, input: torch.Tensor, p: int, whole: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, input) detached, once the ``whole`` side is known to hold p x the other side, same dtype:
    a mismatch would otherwise surface as a wrong-size message on the wire, on another rank."""
    out, inp = plain(output), plain(input)
    big, small, part = (inp, out, "output") if whole == "input" else (out, inp, "input")
    if big.numel() != p * small.numel() or inp.dtype != out.dtype:
        raise TransportError(f"{op}: {whole} must hold {p} x {part} ({small.numel()} x {small.dtype}), "
                             f"got {big.numel()} x {big.dtype}")
    return out, inp


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op: Any = "sum", group: Any = None,
                          codec: Any = None, async_op: bool = False, *, error_feedback: ErrorFeedback | None = None,
                          key: Hashable = None, min_bytes: int | None = None, salt: int | None = None,
                          hierarchy: str | None = None) -> Handle | None:
    """``output`` = this rank's chunk of the reduction of every rank's ``input`` (p * output.numel()
    elements, chunk i = flat elements [i*m, (i+1)*m)). One codec round trip."""
    check_tensor(output, "reduce_scatter_tensor")
    check_tensor(input, "reduce_scatter_tensor")
    opn = op_name(op)
    tr = for_group(group)
    if tr.rank < 0:
        return None
    _check_hierarchy(hierarchy)
    out, inp = _pair("reduce_scatter_tensor", output, input, tr.world_size, whole="input")
    run = Run("reduce_scatter", inp.device)
    c = decide(codec, inp, op=opn, min_bytes=min_bytes, transport=tr)
    if c is None:
        obuf = contig(out)
        return run.native(async_op, tr.native_reduce_scatter(obuf, contig(inp), opn, async_op),
                          lambda: copy_back(out, obuf), nbytes(inp), [output])
    c, tr = labelled(c, tr)
    if c.variable_size:
        return varsize.reduce_scatter_tensor(run, c, tr, output, input, opn, async_op)
    _check_feedback(error_feedback, key, "reduce_scatter_tensor")
    lay = _layout(hierarchy, group)
    if lay is not None:
        return _hierarchy.reduce_scatter_tensor(run, c, lay, output, input, opn, async_op, error_feedback, key, salt)
    return flat.reduce_scatter_tensor(run, c, tr, output, input, opn, async_op, error_feedback, key, salt)


def all_gather_into_tensor(output: torch.Tensor, input: torch.Tensor, group: Any = None, codec: Any = None,
                           async_op: bool = False, *, min_bytes: int | None = None, salt: int | None = None,
                           hierarchy: str | None = None) -> Handle | None:
    """``output`` = every rank's ``input`` concatenated in rank order; the caller's own slot is decoded
    from its own payload, so every rank holds the same bytes."""
    if not isinstance(output, torch.Tensor) or not isinstance(input, torch.Tensor):
        check_tensor(output, "all_gather_into_tensor")
        check_tensor(input, "all_gather_into_tensor")
    tr = for_group(group)
    if tr.rank < 0:
        return None
    if hierarchy is not None:
        _check_hierarchy(hierarchy)
    out, inp = _pair("all_gather_into_tensor", output, input, tr.world_size, whole="output")
    run = Run("all_gather", inp.device)
    c = decide(codec, inp, min_bytes=min_bytes, transport=tr)
    if c is None:
        obuf = contig(out)
        return run.native(async_op, tr.native_all_gather(obuf, contig(inp), async_op), lambda: copy_back(out, obuf),
                          nbytes(inp), [output])
    c, tr = labelled(c, tr)
    if c.variable_size:
        return varsize.all_gather_into_tensor(run, c, tr, output, input, async_op)
    if hierarchy is not None:
        lay = _layout(hierarchy, group)
        if lay is not None:
            return _hierarchy.all_gather_into_tensor(run, c, lay, output, input, async_op, salt)
    return flat.all_gather_into_tensor(run, c, tr, output, input, async_op, salt)


def broadcast(tensor: torch.Tensor, src: int, group: Any = None, codec: Any = None, async_op: bool = False, *,
              min_bytes: int | None = None, salt: int | None = None) -> Handle | None:
    """Broadcast from global rank ``src``. With a lossy codec the root adopts the decoded values, so
    every rank (root included) ends with identical bytes."""
    check_tensor(tensor, "broadcast")
    tr = for_group(group)
    if tr.rank < 0:
        return None
    root = tr.group_rank(src)
    t = tensor.detach()
    run = Run("broadcast", t.device)
    c = decide(codec, t, min_bytes=min_bytes, transport=tr)
    if c is None:
        buf = contig(t)
        return run.native(async_op, tr.native_broadcast(buf, root, async_op), lambda: copy_back(t, buf), nbytes(t),
                          [tensor])
    c, tr = labelled(c, tr)
    if c.variable_size:
        return varsize.broadcast(run, c, tr, tensor, root, async_op)
    return flat.broadcast(run, c, tr, tensor, root, async_op, salt)


def _equal_splits(splits: list[int] | None, t: torch.Tensor, p: int) -> bool:
    if not splits:
        return True
    return t.dim() > 0 and len(splits) == p and all(int(s) * p == t.shape[0] for s in splits)


def all_to_all_single(output: torch.Tensor, input: torch.Tensor, group: Any = None, codec: Any = None,
                      async_op: bool = False, *, output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None, min_bytes: int | None = None,
                      salt: int | None = None) -> Handle | None:
    """Chunk j of ``input`` (along dim 0) goes to rank j; chunk i of ``output`` comes from rank i.
    Equal splits are compressed; uneven ``*_split_sizes`` go native, as does an input not divisible
    into p equal chunks (the receiver could not know a chunk's size from its own arguments)."""
    check_tensor(output, "all_to_all_single")
    check_tensor(input, "all_to_all_single")
    tr = for_group(group)
    if tr.rank < 0:
        return None
    p = tr.world_size
    out, inp = output.detach(), input.detach()
    equal = (
        _equal_splits(output_split_sizes, out, p) and _equal_splits(input_split_sizes, inp, p)
        and inp.numel() == out.numel() and inp.dtype == out.dtype
        and inp.dim() > 0 and inp.shape[0] % p == 0
    )
    run = Run("all_to_all", inp.device)
    c = decide(codec, inp, min_bytes=min_bytes, transport=tr) if equal else None
    if c is None:
        obuf = contig(out)
        if equal:
            output_split_sizes = input_split_sizes = None
        work = tr.native_all_to_all(obuf, contig(inp), output_split_sizes, input_split_sizes, async_op)
        return run.native(async_op, work, lambda: copy_back(out, obuf), nbytes(inp), [output])
    c, tr = labelled(c, tr)
    return flat.all_to_all_single(run, c, tr, output, input, async_op, salt)


def isend(tensor: torch.Tensor, dst: int, group: Any = None, codec: Any = None, *, tag: int = 0,
          min_bytes: int | None = None, salt: int | None = None) -> Handle | None:
    """Send ``tensor`` to global rank ``dst``; the handle's ``wait()`` completes the send."""
    check_tensor(tensor, "isend")
    tr = for_group(group)
    if tr.rank < 0:
        return None
    peer = tr.group_rank(dst)
    t = tensor.detach()
    run = Run("send", t.device)
    c = decide(codec, t, min_bytes=min_bytes, transport=tr)
    if c is None:
        buf = contig(t)
        return run.native(True, tr.native_isend(buf, peer, tag), lambda: buf, nbytes(t), [tensor])
    c, tr = labelled(c, tr)
    if c.variable_size:
        return varsize.isend(run, c, tr, tensor, peer, tag)
    return flat.isend(run, c, tr, tensor, peer, tag, salt)


def irecv(tensor: torch.Tensor, src: int, group: Any = None, codec: Any = None, *, tag: int = 0,
          min_bytes: int | None = None) -> Handle | None:
    """Receive into ``tensor`` from global rank ``src``; the handle's ``wait()`` decodes into it."""
    check_tensor(tensor, "irecv")
    if src is None:
        raise TransportError("irecv/recv need src= (a compressed payload's sender must be known)")
    tr = for_group(group)
    if tr.rank < 0:
        return None
    peer = tr.group_rank(src)
    t = tensor.detach()
    run = Run("recv", t.device)
    c = decide(codec, t, min_bytes=min_bytes, transport=tr)
    if c is None:
        buf = contig(t)
        return run.native(True, tr.native_irecv(buf, peer, tag), lambda: copy_back(t, buf), nbytes(t), [tensor])
    c, tr = labelled(c, tr)
    if c.variable_size:
        return varsize.irecv(run, c, tr, tensor, peer, tag)
    return flat.irecv(run, c, tr, tensor, peer, tag)


def send(tensor: torch.Tensor, dst: int, group: Any = None, codec: Any = None, *, tag: int = 0,
         min_bytes: int | None = None, salt: int | None = None) -> None:
    h = isend(tensor, dst, group, codec, tag=tag, min_bytes=min_bytes, salt=salt)
    if h is not None:
        h.wait()


def recv(tensor: torch.Tensor, src: int, group: Any = None, codec: Any = None, *, tag: int = 0,
         min_bytes: int | None = None) -> int | None:
    """Returns the sender's global rank, like ``torch.distributed.recv``."""
    h = irecv(tensor, src, group, codec, tag=tag, min_bytes=min_bytes)
    if h is None:
        return None
    h.wait()
    return src


__all__ = [
    "DEFAULT_MIN_BYTES", "ErrorFeedback", "ResidualSlot", "all_gather_into_tensor", "all_reduce", "all_reduce_residuals",
    "all_to_all_single", "residual_slots",
    "broadcast", "irecv", "isend", "recv", "reduce_scatter_tensor", "send",
]
