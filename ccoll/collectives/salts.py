"""Stochastic-rounding salts: one per (call, rank, phase, segment), never sent.

A stochastic-rounding codec with one fixed seed would draw the same random numbers on every rank and
every call (errors would correlate instead of cancelling in the sum, and repeat instead of averaging
out over steps), so every encode gets a salt mixed from: the caller's ``salt`` (derived from (step,
call key) by the patch/DDP/FSDP layers, so a resumed run draws what an uninterrupted one would) or,
when None, a call counter of this process and group (reproducible run to run for a fixed call order);
this rank's global rank (ranks decorrelate); the phase and the segment. Deterministic codecs ignore it.
"""
from __future__ import annotations

import itertools
import threading
import weakref
from typing import TYPE_CHECKING, Callable

from ..transports import Transport

if TYPE_CHECKING:
    from ..codecs import Codec

#: phases of one call, each lossy encode of a segment gets its own salt: the encode of the caller's own
#: data (every collective's first), the re-encode of a reduced chunk (all_reduce's all-gather), and a
#: node's partial sum (hierarchical all_reduce, 2 nodes)
OWN, REDUCED, NODE = 0, 1, 2

_M64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's finaliser: a bijective 64-bit hash."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class _Group:
    """One group's salt state: its call counter (for calls without a caller salt) and the two terms of
    the mix that depend on the group alone. Why kept: they are fixed for a transport, and computing them
    per call (two rank translations, one more mix64) was half of :func:`salts`' cost on every compressed
    call, deterministic codecs' included."""

    __slots__ = ("counter", "group_term", "rank_term")

    def __init__(self, tr: Transport) -> None:
        self.counter = itertools.count()
        self.group_term = (tr.global_rank(0) << 40) ^ (tr.world_size << 20)
        self.rank_term = mix64(tr.global_rank(tr.rank))


class _Groups:
    """Per-group salt state (weakly keyed: a destroyed group's state goes with it)."""

    def __init__(self) -> None:
        self.by_transport: "weakref.WeakKeyDictionary[Transport, _Group]" = weakref.WeakKeyDictionary()
        self.lock = threading.Lock()

    def of(self, tr: Transport) -> _Group:
        group = self.by_transport.get(tr)  # a read needs no lock; the lock makes one _Group per transport
        if group is None:
            with self.lock:
                group = self.by_transport.get(tr)
                if group is None:
                    group = self.by_transport[tr] = _Group(tr)
        return group


_groups = _Groups()


def _unsalted(phase: int, segment: int) -> int:
    return 0


def salts(salt: int | None, tr: Transport, c: "Codec") -> Callable[[int, int], int]:
    """``salt_of(phase, segment)`` for one call of codec ``c`` on this rank (nonzero; 0, "no salt", for a
    deterministic codec, which ignores it: its three mixes were ~2 us of every such call's host path).
    The call counter advances either way, so a stochastic call draws the same salts whatever
    deterministic calls ran before it."""
    if salt is not None and c.deterministic:  # first: the group's state is not even looked up
        return _unsalted
    group = _groups.of(getattr(tr, "unlabelled", tr))  # a profiled call's transport counts as the group's own
    if salt is None:
        count = next(group.counter)
        if c.deterministic:
            return _unsalted
        base = mix64(count ^ group.group_term)
    else:
        base = mix64(int(salt) & _M64)
    mine = mix64(base ^ group.rank_term)
    return lambda phase, segment: mix64(mine ^ (phase << 48) ^ segment) or 1


__all__ = ["NODE", "OWN", "REDUCED", "mix64", "salts"]
