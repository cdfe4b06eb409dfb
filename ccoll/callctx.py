"""The context of the torch.distributed call ccoll is handling on this thread.

Low level on purpose: it imports nothing from ccoll, so the patch (which sets the context), the DDP and
FSDP hooks (which run ccoll's own traffic) and :mod:`ccoll.capture` (which reads what kind of call it is
sampling) share it without importing each other.

- :func:`internal` / :data:`local` ``.busy``: this thread is inside a call ccoll handles, so any
  torch.distributed call made now (ccoll's own payload traffic) goes straight to torch;
- :func:`current`: the call being decided (dim, op, step, and for point-to-point which side), set by the
  patch while :mod:`ccoll.capture` is on;
- :func:`stable_salt` and :func:`reduce_name`: the names every rank computes alike.
"""
from __future__ import annotations

import contextlib
import hashlib
import threading
from typing import Any, Iterator, NamedTuple

import torch.distributed as dist


class Call(NamedTuple):
    """A call ccoll decides on: its parallel dimension, policy op, optimizer step, and for point-to-point
    ``sending`` (True: this rank sends, False: it receives; None: not point-to-point)."""

    dim: str
    op: str
    step: int
    sending: bool | None = None


class _Local(threading.local):
    busy = False  # this thread is inside a call ccoll handles: torch.distributed calls go to torch
    native: dict | None = None  # this thread's pass-through counters (ccoll.patch.native)
    call: Call | None = None  # the call being decided, while ccoll.capture is on


#: this thread's call context; the patch's wrappers read ``local.busy`` on every call
local = _Local()


@contextlib.contextmanager
def internal() -> Iterator[None]:
    """Run ccoll's own communication (the DDP / FSDP hooks) with the wrappers passing straight to
    torch, as inside a call the patch handles: the transports' byte traffic is not a user call."""
    was = local.busy
    local.busy = True
    try:
        yield
    finally:
        local.busy = was


def current() -> Call | None:
    """The call being decided on this thread (set by ccoll.patch while capture is on), or None."""
    return local.call


def set_current(call: Call | None) -> None:
    """Name the call being decided on this thread (what :func:`current` returns)."""
    local.call = call


def stable_salt(step: int, key: Any) -> int:
    """A 63-bit salt from (step, key) that every process computes alike (Python's ``hash`` of strings
    is randomised per process, so it cannot be used)."""
    digest = hashlib.blake2b(repr((int(step), key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


_SUM = dist.ReduceOp.SUM
_AVG = dist.ReduceOp.AVG


def reduce_name(op: Any) -> str | None:
    """ccoll's name for a torch reduce op ("sum", "avg"), or None for the ones ccoll leaves to torch."""
    if op is _SUM:  # the common case first: identity is ~20x cheaper than ReduceOp.__eq__
        return "sum"
    if op == _SUM:
        return "sum"
    if op == _AVG:
        return "avg"
    return None
