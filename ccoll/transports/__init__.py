"""Transports: move bytes between the ranks of one group, nothing else.

A transport wraps a ``torch.distributed`` process group (gloo here, NCCL on GPUs) or an mpi4py
communicator behind one small interface, so every collective algorithm is written once:

- byte movement (contiguous uint8 tensors of any shape, equal sizes on every rank, as fixed-size codec
  payloads guarantee; all_to_all splits dim 0): ``all_to_all``, ``all_gather``, ``broadcast``, ``isend``, ``irecv``; the
  collective ones take ``async_op`` and then return a :class:`Handle`;
- the native (uncompressed, exact) calls the collectives fall back to: ``native_all_reduce``,
  ``native_reduce_scatter``, ``native_all_gather``, ``native_broadcast``, ``native_all_to_all``,
  ``native_isend`` / ``native_irecv`` (any dtype, contiguous tensors).

Layout: :mod:`.base` (the :class:`Transport` interface, :func:`op_name`), :mod:`.handle` (what async
calls return), :mod:`.registry` (which transport a group gets: :func:`for_group`, :func:`mpi_comm_for`),
and one module per transport (:mod:`.torch_dist`, :mod:`.mpi`, :mod:`.memory`), each importing only
``base`` and ``handle``. This package only re-exports the names users and the collectives take.
"""
from __future__ import annotations

from ..errors import TransportError
from .base import OPS, Transport, check_bytes, op_name
from .handle import Handle, done_handle
from .registry import KINDS, for_group, is_mpi_comm, mpi_comm_for

__all__ = ["KINDS", "OPS", "Handle", "Transport", "TransportError", "check_bytes", "done_handle", "for_group", "is_mpi_comm",
           "mpi_comm_for", "op_name"]
