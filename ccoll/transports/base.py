"""The transport interface and reduce op names: what every transport implements and every collective
calls, kept apart from the registry (which transport a group gets) and from the handles (what async
calls return), so a transport module imports only this and :mod:`.handle`.

Ranks given to a transport are GROUP ranks; :meth:`Transport.group_rank` converts the global ranks
that the public collectives take (``torch.distributed`` semantics; for MPI, the rank in
``MPI.COMM_WORLD``). Reduce op names are the strings "sum", "avg", "max", "min", "product";
:func:`op_name` also accepts ``torch.distributed.ReduceOp`` values.
"""
from __future__ import annotations

from typing import Any

import torch

from ..errors import TransportError
from .handle import Handle

OPS = ("sum", "avg", "max", "min", "product")


def op_name(op: Any) -> str:
    """Normalise a reduce op (string or ``torch.distributed.ReduceOp``) to one of :data:`OPS`."""
    if isinstance(op, str):
        name = op.lower()
        name = {"prod": "product", "mean": "avg"}.get(name, name)
        if name in OPS:
            return name
        raise TransportError(f"unknown reduce op {op!r}; available: {', '.join(OPS)}")
    # ReduceOp values and ReduceOp.RedOpType members both print as e.g. "RedOpType.SUM"
    text = str(getattr(op, "name", op)).rsplit(".", 1)[-1].lower()
    name = {"prod": "product"}.get(text, text)
    if name in OPS:
        return name
    raise TransportError(f"reduce op {op!r} is not supported; available: {', '.join(OPS)}")


class Transport:
    """Interface every transport implements. ``rank``/``world_size`` are the caller's rank and the
    size of this group; ``rank`` is -1 when the caller is not a member (collectives then do nothing,
    like ``torch.distributed``). The byte-movement calls and the native all_gather / broadcast /
    isend / irecv default to each other (bytes are a native call on uint8; a native call is a byte
    movement of the tensor's bytes): a transport overrides at least one of each pair."""

    kind: str = ""
    rank: int
    world_size: int

    # ranks -------------------------------------------------------------------------------------
    def group_rank(self, global_rank: int) -> int:
        raise NotImplementedError

    def global_rank(self, group_rank: int) -> int:
        raise NotImplementedError

    # what only the transport knows ---------------------------------------------------------------
    #: whether a receive may be posted larger than the message that fills it (then a variable-size
    #: payload travels at its used size; otherwise at its capacity: correct, no saving). Both ends of a
    #: send/recv hold the same transport kind, so they agree.
    short_receives: bool = False

    def subgroups(self, node: int, local: int, intra: "list[int]", inter: "list[int]") -> "tuple[Any, Any]":
        """The hierarchy's two groups for this rank, as group objects its transports serve: ``intra`` (global
        ranks, increasing: this rank's node) and ``inter`` (the ranks of its local index on every node, in node
        order). ``node``/``local``: this rank's node and index on it. Collective over this group's ranks (every
        member calls it with its own node and local index); created once per process per member list."""
        raise TransportError(f"hierarchy: cannot create subgroups of a {type(self).__name__} group "
                             f"(torch.distributed, MPI and simulated groups only)")

    # byte movement (defaults: check the buffers, then the native call on their bytes) ----------------
    def all_to_all(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False) -> Handle | None:
        """``input`` holds world_size equal chunks along dim 0 (bytes of a 1-D buffer, rows of a [p, nbytes]
        one), chunk j goes to rank j; ``output`` chunk i comes from rank i."""
        check_all_to_all(output, input, self.world_size)
        return self.native_all_to_all(output, input, None, None, async_op)

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False) -> Handle | None:
        check_all_gather(output, input, self.world_size)
        return self.native_all_gather(output, input, async_op)

    def broadcast(self, buf: torch.Tensor, src: int, async_op: bool = False) -> Handle | None:
        check_bytes(buf)
        return self.native_broadcast(buf, src, async_op)

    def isend(self, buf: torch.Tensor, dst: int, tag: int = 0) -> Handle:
        check_bytes(buf)
        return self.native_isend(buf, dst, tag)

    def irecv(self, buf: torch.Tensor, src: int, tag: int = 0) -> Handle:
        check_bytes(buf)
        return self.native_irecv(buf, src, tag)

    # native (exact) calls; any dtype, contiguous tensors -----------------------------------------
    def native_all_reduce(self, tensor: torch.Tensor, op: str, async_op: bool = False) -> Handle | None:
        raise NotImplementedError

    def native_reduce_scatter(
        self, output: torch.Tensor, input: torch.Tensor, op: str, async_op: bool = False
    ) -> Handle | None:
        raise NotImplementedError

    def native_all_gather(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False) -> Handle | None:
        return self.all_gather(_bytes(output), _bytes(input), async_op)

    def native_broadcast(self, tensor: torch.Tensor, src: int, async_op: bool = False) -> Handle | None:
        return self.broadcast(_bytes(tensor), src, async_op)

    def native_all_to_all(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int] | None = None,
                          input_split_sizes: list[int] | None = None, async_op: bool = False) -> Handle | None:
        raise NotImplementedError

    def native_isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Handle:
        return self.isend(_bytes(tensor), dst, tag)

    def native_irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Handle:
        return self.irecv(_bytes(tensor), src, tag)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank={self.rank} world_size={self.world_size}>"


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's storage as a 1-D uint8 view (no copy)."""
    if not t.is_contiguous():
        raise TransportError("transports move contiguous tensors only (the collectives copy for you)")
    return t.reshape(-1).view(torch.uint8)


def check_bytes(*bufs: torch.Tensor) -> None:
    """Byte buffers are contiguous uint8 tensors of any shape (a transport moves their ``numel()`` bytes).
    Why any shape: the collectives' payloads are [rows, nbytes] tensors (what the batched codec calls
    take); flattening each to 1-D for the transport was a view per buffer per call (~1 us of host time
    each) that moved nothing."""
    for b in bufs:
        if not isinstance(b, torch.Tensor) or b.dtype != torch.uint8 or not b.is_contiguous():
            raise TransportError(
                f"transport buffers must be contiguous uint8 tensors, got "
                f"{getattr(b, 'dtype', type(b).__name__)} with shape {tuple(getattr(b, 'shape', ()))}"
            )


def check_all_gather(output: torch.Tensor, input: torch.Tensor, p: int) -> None:
    """An all_gather's buffers: bytes (:func:`check_bytes`), ``output`` holding ``p`` x ``input``'s."""
    check_bytes(output, input)
    if output.numel() != input.numel() * p:
        raise TransportError(f"all_gather output must hold {p} x {input.numel()} bytes, got {output.numel()}")


def check_all_to_all(output: torch.Tensor, input: torch.Tensor, p: int) -> None:
    """An all_to_all's buffers: bytes (:func:`check_bytes`) of equal sizes whose dim 0 splits into ``p``
    equal chunks (a 1-D buffer's bytes, a [p, nbytes] buffer's rows), the chunk each rank gets."""
    check_bytes(output, input)
    if output.numel() != input.numel() or input.dim() == 0 or input.shape[0] % p or output.shape[0] % p:
        raise TransportError(
            f"all_to_all needs equal input/output sizes whose dim 0 divides by {p}, "
            f"got {tuple(input.shape)} and {tuple(output.shape)}"
        )


__all__ = ["OPS", "Transport", "check_all_gather", "check_all_to_all", "check_bytes", "op_name"]
