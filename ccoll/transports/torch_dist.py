"""Transport over a ``torch.distributed`` process group (gloo, NCCL, or any other c10d backend).

Every call goes to ``torch.distributed.distributed_c10d.<fn>``, never ``torch.distributed.<fn>``: the
patch layer replaces the ``torch.distributed`` attributes with ccoll wrappers, and a transport that
called those would recurse into itself.

What gloo supports in torch 2.13 (checked with real gloo ranks, see tests/dist): uint8
``all_to_all_single`` (equal splits), ``all_gather_single``, ``broadcast``, ``send``/``recv``,
``reduce_scatter_single`` and ``ReduceOp.AVG`` for floating tensors. Older gloo builds lack AVG and
some backends lack all-to-all, so:
- ``avg`` is computed as SUM followed by a division on every backend but NCCL (identical results on
  every rank; NCCL keeps its native AVG). Integer tensors get ``ReduceOp.AVG`` unchanged, so the
  backend's own behaviour (NCCL: supported; gloo: an error) is preserved;
- a backend whose ``all_to_all_single`` raises "not supported" / ``NotImplementedError`` switches
  (once, logged) to point-to-point exchanges, which every backend has.

ccoll's own byte exchanges (``all_to_all`` / ``all_gather`` of payloads) of at least :data:`P2P_MIN_NBYTES` per
peer go point to point on gloo, every receive posted before any send (``exchange_impl="auto"``; the environment
variable ``CCOLL_EXCHANGE=native|p2p`` overrides it for every transport made after it is set). Why: gloo sends a buffer only once its peer has
said it is ready to receive, and that message travels on the same TCP stream as the peer's own data; torch's
gloo all_to_all_single and all_gather post their sends first, so when one rank starts first its "ready"
waits behind its whole payload and the two directions of a link run one after the other. Measured on two
ranks over shaped links (``ccoll.bench.netem``), back-to-back exchanges, ms each, torch's / receives first:
4 MiB per peer at 1 Gbit/s all_gather 49.0 / 35.5, all_to_all 63.7 / 34.9 (the wire: 33.5); 1 MiB at 100 Mbit/s
125.5 / 90.6 and 156.5 / 89.1 (the wire: 84); at 256 KiB the two tie at 1 Gbit/s and receives first wins at
100 Mbit/s (22.3 against 24.0 / 33.8); at 64 KiB and 1 Gbit/s torch's collectives win (0.61 / 0.96), hence the
threshold. An async exchange is posted on one ccoll thread (:class:`_Posted`: posting can block the poster
for the copy into the socket), so the caller's codec work overlaps it. The exchanges carry tags of their own (a range no user tag reaches, one per
exchange, counted alike on every rank), so they never match a user's send/recv on the same group.
"""
from __future__ import annotations

import concurrent.futures
import itertools
import os
import threading
from typing import Any

import torch
from torch.distributed import distributed_c10d as c10d

from ..errors import TransportError
from ..log import warn_once
from ..once import once
from .base import Transport, check_all_gather, check_all_to_all
from .handle import Handle

_REDUCE_OPS = {
    "sum": c10d.ReduceOp.SUM,
    "max": c10d.ReduceOp.MAX,
    "min": c10d.ReduceOp.MIN,
    "product": c10d.ReduceOp.PRODUCT,
    "avg": c10d.ReduceOp.AVG,
}

# the *_single names are torch >= 2.10's non-deprecated spellings; older torch has only the *_tensor ones
_all_gather = getattr(c10d, "all_gather_single", None) or c10d.all_gather_into_tensor
_reduce_scatter = getattr(c10d, "reduce_scatter_single", None) or c10d.reduce_scatter_tensor


def _original(name: str) -> Any:
    """``distributed_c10d.<name>`` as torch defines it, also while ccoll.patch has replaced it (the patch
    marks its wrappers with ``__ccoll_original__``): ccoll's own payload traffic never goes through the
    patch (no double-counted stats, no second policy decision)."""
    fn = getattr(c10d, name)
    return getattr(fn, "__ccoll_original__", fn)


def default_group() -> Any:
    if not c10d.is_initialized():
        raise TransportError("torch.distributed is not initialized: call init_process_group() first")
    return c10d._get_default_group()


def _unsupported(err: Exception) -> bool:
    text = str(err).lower()
    return isinstance(err, NotImplementedError) or "not supported" in text or "unsupported" in text


def _wrap(work: Any, then=None) -> Handle:
    return Handle([work], then)


_subgroups: dict[tuple[int, ...], Any] = {}  # member global ranks -> torch group (created once per process)
_subgroups_lock = threading.Lock()


def _subgroup(members: "list[int]", backend: str) -> Any:
    key = tuple(members)
    with _subgroups_lock:
        g = _subgroups.get(key)
    if g is None:
        g = torch.distributed.new_group(ranks=list(members), backend=backend, use_local_synchronization=True)
        with _subgroups_lock:
            _subgroups[key] = g
    return g


class TorchTransport(Transport):
    """A ``torch.distributed`` group's transport (see the module docstring for what travels how)."""

    kind = "torch"

    def __init__(self, group: Any = None, exchange_impl: str = "auto"):
        """``exchange_impl``: how ccoll's byte exchanges (all_to_all, all_gather) travel: "auto" (point to point
        with receives first on gloo, torch's collectives elsewhere), "native" (torch's collectives) or "p2p"
        (point to point, receives first, on any backend; the exact ``native_all_to_all`` goes point to point
        too: the tests force it so the fallback runs every time). Whatever the choice, a backend without
        ``all_to_all_single`` switches its all-to-alls to point to point at the first call that says so."""
        if exchange_impl == "auto":
            exchange_impl = os.environ.get("CCOLL_EXCHANGE", "auto")
        if exchange_impl not in ("auto", "native", "p2p"):
            raise TransportError(f"exchange_impl (or CCOLL_EXCHANGE) must be auto, native or p2p, got {exchange_impl!r}")
        self.group = default_group() if group is None else group
        self.is_world = self.group is c10d._get_default_group()
        self.rank = c10d.get_rank(self.group)  # -1 when this process is not a member
        self.world_size = c10d.get_world_size(self.group) if self.rank >= 0 else 0
        self.backend = str(c10d.get_backend(self.group)).lower() if self.rank >= 0 else "none"
        self.exchange_impl = "p2p" if exchange_impl == "auto" and self.backend == "gloo" else exchange_impl
        # "auto" keeps torch's collectives for exchanges below P2P_MIN_NBYTES per peer, where the wire is not what
        # decides and two point-to-point calls cost more host time than one collective
        self.p2p_min_nbytes = P2P_MIN_NBYTES if exchange_impl == "auto" else 0
        self._a2a_p2p = exchange_impl == "p2p"  # the exact all_to_all too: forced, or the backend lacks one
        self._tags = itertools.count()  # one per exchange, alike on every rank (every rank makes every exchange)
        self._native_avg = self.backend == "nccl"
        # gloo's pair checks only length <= buffer; NCCL matches sizes exactly
        self.short_receives = self.backend == "gloo"

    def subgroups(self, node: int, local: int, intra: "list[int]", inter: "list[int]") -> "tuple[Any, Any]":
        """torch orders a group's ranks by global rank, as the hierarchy orders local indices; each subgroup is
        created by its members only (``use_local_synchronization``), once per process."""
        return _subgroup(intra, self.backend), _subgroup(inter, self.backend)

    # ranks -------------------------------------------------------------------------------------
    def group_rank(self, global_rank: int) -> int:
        if self.is_world:
            if not 0 <= int(global_rank) < self.world_size:
                raise TransportError(f"rank {global_rank} is not in the world of {self.world_size} ranks")
            return int(global_rank)
        try:
            return c10d.get_group_rank(self.group, int(global_rank))
        except (ValueError, RuntimeError) as e:
            raise TransportError(f"global rank {global_rank} is not in this group: {e}") from None

    def global_rank(self, group_rank: int) -> int:
        if self.is_world:
            return int(group_rank)
        return c10d.get_global_rank(self.group, int(group_rank))

    # byte movement: the Transport defaults (checked buffers, native calls), but all_gather -------------
    def all_gather(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False) -> Handle | None:
        """The default's checks, then point to point (see the module docstring) or torch's all_gather in the
        form gloo takes: ``output`` cut along dim 0 into p pieces shaped as ``input`` (a [1, nbytes] payload row
        into [p, nbytes] rows as they are; buffers of unequal dimensions as [p, n] rows and a [1, n] row)."""
        check_all_gather(output, input, self.world_size)
        if self.exchange_impl == "p2p" and input.numel() >= self.p2p_min_nbytes:
            rows = output.view(self.world_size, -1)
            return self._p2p(rows, [input.view(-1)] * self.world_size, async_op)
        if input.dim() != output.dim():  # e.g. a 1-D payload into [p, nbytes] rows
            output, input = output.view(self.world_size, -1), input.view(1, -1)
        return self.native_all_gather(output, input, async_op)

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False) -> Handle | None:
        check_all_to_all(output, input, self.world_size)
        p = self.world_size
        if self._a2a_p2p or (self.exchange_impl == "p2p" and input.numel() >= p * self.p2p_min_nbytes):
            return self._p2p(output.view(p, -1), list(input.view(p, -1)), async_op)
        return self.native_all_to_all(output, input, None, None, async_op)

    # native calls ------------------------------------------------------------------------------
    def native_all_reduce(self, tensor: torch.Tensor, op: str, async_op: bool = False) -> Handle | None:
        reduce_op, then = self._reduce_op(op, tensor)
        work = c10d.all_reduce(tensor, op=reduce_op, group=self.group, async_op=async_op)
        return self._finish(work, async_op, then)

    def native_reduce_scatter(
        self, output: torch.Tensor, input: torch.Tensor, op: str, async_op: bool = False
    ) -> Handle | None:
        reduce_op, then = self._reduce_op(op, output)
        work = _reduce_scatter(output, input, op=reduce_op, group=self.group, async_op=async_op)
        return self._finish(work, async_op, then)

    def native_all_gather(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False) -> Handle | None:
        work = _all_gather(output, input, group=self.group, async_op=async_op)
        return self._finish(work, async_op, None)

    def native_broadcast(self, tensor: torch.Tensor, src: int, async_op: bool = False) -> Handle | None:
        work = c10d.broadcast(tensor, self.global_rank(src), group=self.group, async_op=async_op)
        return self._finish(work, async_op, None)

    def native_all_to_all(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int] | None = None,
                          input_split_sizes: list[int] | None = None, async_op: bool = False) -> Handle | None:
        return self._all_to_all(output, input, output_split_sizes, input_split_sizes, async_op)

    def native_isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Handle:
        return _wrap(_original("isend")(tensor, self.global_rank(dst), group=self.group, tag=tag))

    def native_irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Handle:
        return _wrap(_original("irecv")(tensor, self.global_rank(src), group=self.group, tag=tag))

    # helpers -----------------------------------------------------------------------------------
    def _reduce_op(self, op: str, result: torch.Tensor):
        """(ReduceOp, post-step): AVG natively on NCCL; elsewhere SUM then divide (floats)."""
        if op == "avg" and not self._native_avg and (result.is_floating_point() or result.is_complex()):
            p = self.world_size
            return c10d.ReduceOp.SUM, lambda: result.div_(p)
        return _REDUCE_OPS[op], None

    @staticmethod
    def _finish(work: Any, async_op: bool, then) -> Handle | None:
        if async_op:
            return _wrap(work, then)
        if then is not None:
            then()
        return None

    def _all_to_all(self, output, input, output_split_sizes, input_split_sizes, async_op):
        if not self._a2a_p2p:
            try:
                work = c10d.all_to_all_single(
                    output, input, output_split_sizes, input_split_sizes, group=self.group, async_op=async_op
                )
                return self._finish(work, async_op, None)
            except (RuntimeError, NotImplementedError) as e:
                if not _unsupported(e):
                    raise
                warn_once(
                    f"a2a-p2p-{self.backend}",
                    "ccoll: backend %s has no all_to_all_single (%s); using point-to-point exchanges",
                    self.backend, e,
                )
                self._a2a_p2p = True
        p = self.world_size
        return self._p2p(_split_rows(output, output_split_sizes, p), _split_rows(input, input_split_sizes, p), async_op)

    def _p2p(self, recv: "list[torch.Tensor] | torch.Tensor", send: "list[torch.Tensor]", async_op: bool) -> Handle | None:
        """One exchange point to point: ``recv[i]`` from group rank i, ``send[i]`` to it (this rank's own
        row copied), every receive posted before any send (see the module docstring), under this exchange's
        own tag."""
        me = self.rank
        tag = _TAG_BASE + next(self._tags) % _TAG_SPAN
        peers = [(i, self.global_rank(i)) for i in range(self.world_size) if i != me]
        isend, irecv = _original("isend"), _original("irecv")

        def post() -> list:
            works = [irecv(recv[i], g, group=self.group, tag=tag) for i, g in peers]
            return works + [isend(send[i], g, group=self.group, tag=tag) for i, g in peers]

        recv[me].copy_(send[me])
        if not async_op:
            Handle(post()).wait()
            return None
        return Handle([_Posted(_poster().submit(post))])


class _Posted:
    """An async exchange's receives and sends, posted on ccoll's posting thread (:func:`_poster`). Posting a
    gloo receive or send can block: a send to a ready peer writes the buffer into the socket on the posting
    thread, and either waits while gloo's own thread holds the link's lock to move an earlier message. Posted by
    the caller, an exchange of 448 KiB per peer on loopback blocked it for 0.4-1.0 ms, and the codec work of the
    next pipeline segment waited instead of overlapping the transfer (``python -m ccoll.bench.hooks``' loopback
    int4 step: 69-70 ms, against 65-66 ms with torch's collectives, which gloo posts on its own thread). One
    thread posts every exchange in program order, receives first; the requests come back through its future.
    Shaped like a Work (:class:`Handle` waits for it)."""

    __slots__ = ("_posted",)

    def __init__(self, posted: "concurrent.futures.Future") -> None:
        self._posted = posted

    def wait(self) -> bool:
        for w in self._posted.result():
            w.wait()
        return True

    def is_completed(self) -> bool:
        return self._posted.done() and all(w.is_completed() for w in self._posted.result())


#: the one thread that posts async point-to-point exchanges (:class:`_Posted`), made on first use
_poster = once(lambda: concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ccoll-p2p"), remake_after_fork=True)


#: bytes per peer from which "auto" sends gloo exchanges point to point (below: torch's collective; see the module
#: docstring's figures)
P2P_MIN_NBYTES = 256 << 10

#: tags of ccoll's point-to-point exchanges: a range above the tags users and frameworks pass (small integers),
#: one tag per exchange, wrapping after _TAG_SPAN exchanges (long after any earlier one has completed)
_TAG_BASE, _TAG_SPAN = 1 << 30, 1 << 28


def _split_rows(t: torch.Tensor, split_sizes: list[int] | None, p: int) -> list[torch.Tensor]:
    """Views of ``t`` along dim 0, as torch's all_to_all_single splits it."""
    if not split_sizes:
        if t.shape[0] % p:
            raise TransportError(f"all_to_all: dim 0 ({t.shape[0]}) is not divisible by {p}")
        split_sizes = [t.shape[0] // p] * p
    if len(split_sizes) != p or sum(split_sizes) != t.shape[0]:
        raise TransportError(f"all_to_all: split sizes {list(split_sizes)} do not match dim 0 {t.shape[0]} / {p} ranks")
    return list(torch.split(t, list(split_sizes), dim=0))

