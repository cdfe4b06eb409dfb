"""In-memory transport: the ranks of a simulated world are threads of one process sharing a
:class:`MemoryWorld`; payloads move by tensor copies (CPU or one CUDA device).

It exists so the same collective code runs at p = 2..256 in one process (:func:`ccoll.testing.
simulated_world`): CI tests large worlds cheaply, and one GPU measures the algorithm at world sizes NCCL
cannot give it (NCCL refuses two ranks on one GPU).

Semantics follow ``torch.distributed``: collectives are matched by issue order (the n-th collective a
rank issues meets the n-th of every other rank; a mismatch of kinds raises
:class:`~ccoll.errors.TransportError` naming both), point-to-point messages by (source, destination,
tag) in send order. A sender's buffer is copied at issue, so it may be reused as soon as the call
returns; receivers copy out when they wait. Every wait has the world's timeout and stops with an error
as soon as another rank failed, so a bug cannot hang a test.

Reductions add the ranks' tensors in rank order in their own dtype (like gloo), so every rank gets the
same bytes.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

import torch

from ..errors import TransportError
from .base import Transport
from .handle import Handle


class _Slot:
    """One collective: the ranks' deposits and how many have read the result."""

    __slots__ = ("kind", "deposits", "arrived", "read")

    def __init__(self, kind: str, p: int) -> None:
        self.kind, self.deposits, self.arrived, self.read = kind, [None] * p, 0, 0


class MemoryWorld:
    """The shared state of ``world_size`` ranks: collective slots by issue number, mailboxes by
    (src, dst, tag), and the first failure."""

    def __init__(self, world_size: int, timeout_s: float = 120.0) -> None:
        if int(world_size) < 1:
            raise TransportError(f"a simulated world needs at least one rank, got {world_size}")
        self.world_size = int(world_size)
        self.timeout_s = float(timeout_s)
        self.cond = threading.Condition()
        self.slots: dict[int, _Slot] = {}
        self.mail: dict[tuple[int, int, int, int], Any] = {}
        self.failed: str | None = None
        #: free-form shared state for code running on the ranks (tests exchange Python objects here)
        self.objects: dict[Any, Any] = {}
        self.groups = [MemoryGroup(self, r) for r in range(self.world_size)]

    def abort(self, why: str) -> None:
        """Make every waiting and future wait raise (another rank failed)."""
        with self.cond:
            if self.failed is None:
                self.failed = why
            self.cond.notify_all()

    def wait_for(self, ready: Callable[[], bool], what: str, rank: int) -> None:
        deadline = time.monotonic() + self.timeout_s
        with self.cond:
            while not ready():
                if self.failed is not None:
                    raise TransportError(f"simulated world: rank {rank} stopped waiting for {what}: {self.failed}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransportError(f"simulated world: rank {rank} waited {self.timeout_s:g} s for {what}")
                self.cond.wait(min(left, 0.5))


class MemoryGroup:
    """What ``fn(rank, group)`` receives: the group handle of one rank; collectives take it as
    ``group=`` (:func:`ccoll.transports.for_group` returns its :attr:`ccoll_transport`)."""

    def __init__(self, world: MemoryWorld, rank: int) -> None:
        self.world, self.rank = world, rank
        self.ccoll_transport = MemoryTransport(self)

    def size(self) -> int:
        return self.world.world_size

    def __repr__(self) -> str:
        return f"<MemoryGroup rank {self.rank} of {self.world.world_size}>"


def _deposit(t: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """A private copy of ``t`` and, on CUDA, an event recorded after the copy (readers on other
    threads' streams wait for it)."""
    copy = t.detach().clone()
    event = None
    if copy.is_cuda:
        event = torch.cuda.Event()
        event.record()
    return copy, event


def _read(dep: tuple[torch.Tensor, Any]) -> torch.Tensor:
    t, event = dep
    if event is not None:
        torch.cuda.current_stream(t.device).wait_event(event)
    return t


class _Request:
    """A posted operation: ``wait()`` blocks until it can complete, then runs ``finish`` once."""

    __slots__ = ("_ready", "_finish", "_what", "_rank", "_world", "_done", "_lock")

    def __init__(self, world: MemoryWorld, rank: int, what: str, ready: Callable[[], bool], finish: Callable[[], None]):
        self._world, self._rank, self._what, self._ready, self._finish = world, rank, what, ready, finish
        self._done = False
        self._lock = threading.Lock()

    def wait(self, timeout: Any = None) -> bool:
        with self._lock:
            if not self._done:
                self._world.wait_for(self._ready, self._what, self._rank)
                self._finish()
                self._done = True
        return True

    def is_completed(self) -> bool:
        if self._done:
            return True
        with self._world.cond:
            return self._ready()


class MemoryTransport(Transport):
    kind = "memory"

    def subgroups(self, node: int, local: int, intra: "list[int]", inter: "list[int]") -> "tuple[Any, Any]":
        """Each a simulated world of its own shared by its members: one :class:`MemoryWorld` per member list,
        created by the first member to get here; its transport names the parent world's ranks (salts and
        rank arguments stay global). A failing rank aborts the parent world only: waits in a subgroup end at
        the world's timeout."""
        return self._subgroup(intra), self._subgroup(inter)

    def _subgroup(self, members: "list[int]") -> Any:
        world, key = self.world, ("ccoll.hierarchy", tuple(members))
        with world.cond:
            sub = world.objects.get(key)
            if sub is None:
                sub = world.objects[key] = MemoryWorld(len(members), world.timeout_s)
        group = sub.groups[members.index(self.global_rank(self.rank))]
        group.ccoll_transport = _SubgroupTransport(group, members)
        return group

    def __init__(self, group: MemoryGroup) -> None:
        self.world = group.world
        self.rank = group.rank
        self.world_size = group.world.world_size
        self._issued = 0  # collectives issued by this rank: the n-th meets every rank's n-th
        self._sent: dict[tuple[int, int], int] = {}
        self._posted: dict[tuple[int, int], int] = {}

    # ranks -------------------------------------------------------------------------------------
    def group_rank(self, global_rank: int) -> int:
        if not 0 <= int(global_rank) < self.world_size:
            raise TransportError(f"rank {global_rank} is not in the simulated world of {self.world_size} ranks")
        return int(global_rank)

    def global_rank(self, group_rank: int) -> int:
        return self.group_rank(group_rank)

    # the collective rendezvous -----------------------------------------------------------------
    def _collective(self, kind: str, deposit: Any, finish: Callable[[list], None], async_op: bool) -> Handle | None:
        """Deposit this rank's contribution to the next collective; the request completes when every
        rank has deposited, then ``finish(deposits)`` fills this rank's outputs."""
        w, seq, me = self.world, self._issued, self.rank
        self._issued += 1
        with w.cond:
            slot = w.slots.get(seq)
            if slot is None:
                slot = w.slots[seq] = _Slot(kind, self.world_size)
            elif slot.kind != kind:
                raise TransportError(
                    f"simulated world: collective #{seq} is {slot.kind} on another rank but {kind} on rank {me} "
                    "(ranks must issue collectives in the same order)"
                )
            slot.deposits[me] = deposit
            slot.arrived += 1
            w.cond.notify_all()

        def done() -> None:
            finish(slot.deposits)
            with w.cond:
                slot.read += 1
                if slot.read == self.world_size:
                    del w.slots[seq]

        req = _Request(w, me, f"{kind} #{seq}", lambda: slot.arrived == self.world_size, done)
        if async_op:
            return Handle([req])
        req.wait()
        return None

    # native calls ------------------------------------------------------------------------------
    def native_all_reduce(self, tensor: torch.Tensor, op: str, async_op: bool = False) -> Handle | None:
        def finish(deps: list) -> None:
            tensor.copy_(_reduce([_read(d) for d in deps], op))

        return self._collective(f"all_reduce/{op}", _deposit(tensor), finish, async_op)

    def native_reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str, async_op: bool = False) -> Handle | None:
        if input.numel() != output.numel() * self.world_size:
            raise TransportError(f"reduce_scatter input must hold {self.world_size} x output")
        me, m = self.rank, output.numel()

        def finish(deps: list) -> None:
            output.view(-1).copy_(_reduce([_read(d).view(-1)[me * m:(me + 1) * m] for d in deps], op))

        return self._collective(f"reduce_scatter/{op}", _deposit(input), finish, async_op)

    def native_all_gather(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False) -> Handle | None:
        if output.numel() != input.numel() * self.world_size:
            raise TransportError(f"all_gather output must hold {self.world_size} x input")

        def finish(deps: list) -> None:
            rows = output.view(self.world_size, -1)
            for i, d in enumerate(deps):
                rows[i].copy_(_read(d).view(-1))

        return self._collective("all_gather", _deposit(input), finish, async_op)

    def native_broadcast(self, tensor: torch.Tensor, src: int, async_op: bool = False) -> Handle | None:
        me = self.rank

        def finish(deps: list) -> None:
            if me != src:
                tensor.copy_(_read(deps[src]))

        return self._collective(f"broadcast/{src}", _deposit(tensor) if me == src else None, finish, async_op)

    def native_all_to_all(self, output, input, output_split_sizes=None, input_split_sizes=None, async_op=False):
        p, me = self.world_size, self.rank
        out_rows = _split_rows(output, output_split_sizes, p)
        _split_rows(input, input_split_sizes, p)  # validate now, at the caller

        def finish(deps: list) -> None:
            for i, (t, splits) in enumerate(deps):
                out_rows[i].copy_(_split_rows(_read(t), splits, p)[me])

        copy, event = _deposit(input)
        return self._collective("all_to_all", ((copy, event), input_split_sizes), finish, async_op)

    def native_isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Handle:
        w, key = self.world, (dst, tag)
        n = self._sent.get(key, 0)
        self._sent[key] = n + 1
        dep = _deposit(tensor.reshape(-1))
        with w.cond:
            w.mail[(self.rank, dst, tag, n)] = dep
            w.cond.notify_all()
        return Handle()  # buffered: complete at once

    def native_irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Handle:
        w, key = self.world, (src, tag)
        n = self._posted.get(key, 0)
        self._posted[key] = n + 1
        mail = (src, self.rank, tag, n)

        def finish() -> None:
            with w.cond:
                dep = w.mail.pop(mail)
            t = _read(dep)
            if t.numel() != tensor.numel() or t.dtype != tensor.dtype:
                raise TransportError(
                    f"simulated world: rank {self.rank} received {t.numel()} x {t.dtype} from rank {src} "
                    f"into a buffer of {tensor.numel()} x {tensor.dtype}"
                )
            tensor.view(-1).copy_(t)

        return Handle([_Request(w, self.rank, f"recv from {src} tag {tag}", lambda: mail in w.mail, finish)])


def _reduce(ts: list[torch.Tensor], op: str) -> torch.Tensor:
    """Rank-order reduction in the tensors' dtype (avg: the sum divided by the count, as gloo does)."""
    acc = ts[0].clone()
    for t in ts[1:]:
        if op in ("sum", "avg"):
            acc.add_(t)
        elif op == "max":
            torch.maximum(acc, t, out=acc)
        elif op == "min":
            torch.minimum(acc, t, out=acc)
        elif op == "product":
            acc.mul_(t)
        else:
            raise TransportError(f"unknown reduce op {op!r}")
    if op == "avg":
        if acc.is_floating_point() or acc.is_complex():
            acc.div_(len(ts))
        else:
            raise TransportError("avg of integer tensors is not supported by this transport (as gloo)")
    return acc


def _split_rows(t: torch.Tensor, split_sizes, p: int) -> list[torch.Tensor]:
    """Views of ``t`` along dim 0 as ``all_to_all_single`` splits it (equal splits when none given)."""
    if not split_sizes:
        if t.dim() == 0 or t.shape[0] % p:
            raise TransportError(f"all_to_all: dim 0 of {tuple(t.shape)} is not divisible by {p}")
        split_sizes = [t.shape[0] // p] * p
    if len(split_sizes) != p or sum(split_sizes) != t.shape[0]:
        raise TransportError(f"all_to_all: split sizes {list(split_sizes)} do not match dim 0 {t.shape[0]} / {p} ranks")
    return list(torch.split(t, list(split_sizes), dim=0))


__all__ = ["MemoryGroup", "MemoryTransport", "MemoryWorld"]


class _SubgroupTransport(MemoryTransport):
    """A simulated subgroup's transport: its ranks are named by the parent world's (``members``, in order)."""

    def __init__(self, group: MemoryGroup, members: "list[int]") -> None:
        super().__init__(group)
        self.members = list(members)

    def group_rank(self, global_rank: int) -> int:
        if int(global_rank) not in self.members:
            raise TransportError(f"rank {global_rank} is not in the simulated subgroup {self.members}")
        return self.members.index(int(global_rank))

    def global_rank(self, group_rank: int) -> int:
        return self.members[int(group_rank)]
