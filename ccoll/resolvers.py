"""Resolvers: process group -> parallel dimension ("dp", "tp", "pp", "ep") or None (not ours).

A resolver is any callable ``resolver(group, op) -> str | None``; ``group`` is what the caller passed to
torch.distributed (None = WORLD) and ``op`` is the policy op name ("all_reduce", ..., "send_recv").

Groups are matched by their rank set, not by object identity: frameworks create several group objects
for the same ranks (DeepSpeed's grid and GPT-NeoX's mpu each call new_group), and a rank set is what the
topology describes. The answer is cached per group object, so the per-call cost is one dict lookup.

Point-to-point on WORLD: DeepSpeed's pipeline engine (runtime/pipe/p2p.py, torch >= 1.8) calls
``dist.send/recv(tensor, peer)`` without a group, so WORLD send/recv is pipeline traffic when the
topology has more than one stage.

Nothing here imports deepspeed or megatron: the explicit resolvers take the topology or mpu object the
caller already has; :class:`AutoResolver` (what ``ccoll.patch.install(policy)`` uses by default) looks
only at modules already in ``sys.modules``.
"""
from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, Callable, Iterable, Mapping

from . import frameworks as _frameworks
from .errors import PolicyError
from .frameworks.devicemesh import MESH_DIMS  # noqa: F401  (re-exported: torch DeviceMesh dim names)
from .frameworks.fsdp2 import place_group  # noqa: F401  (re-exported: groups of what ccoll attached to)
from .frameworks.megatron import DESCS as MEGATRON_CORE_GROUPS  # noqa: F401  (re-exported)

Resolver = Callable[[Any, str], "str | None"]

#: DeepSpeed / Megatron topology axis -> policy dimension
AXES = {"data": "dp", "model": "tp", "pipe": "pp"}
_DIMS = ("dp", "tp", "pp", "ep")


class RankSetResolver:
    """Maps groups to dimensions by rank set: ``{"dp": [[0, 2], [1, 3]], "tp": [[0, 1], [2, 3]]}``.

    ``p2p_on_world``: dimension of send/recv calls on WORLD (None: not handled). Groups of one rank are
    never handled (nothing to communicate). If two dimensions claim the same rank set (possible when an
    axis has size 1 and another spans the same ranks), the first in dp, tp, pp, ep order wins, because a
    collective on those ranks means the same thing whichever name it was created under.
    """

    def __init__(self, rank_sets: Mapping[str, Iterable[Iterable[int]]], p2p_on_world: str | None = None):
        self._by_ranks: dict[frozenset[int], str] = {}
        for dim in sorted(rank_sets, key=lambda d: _DIMS.index(d) if d in _DIMS else len(_DIMS)):
            if dim not in _DIMS:
                raise PolicyError(f"resolver: unknown dimension {dim!r}; valid: {', '.join(_DIMS)}")
            for ranks in rank_sets[dim]:
                key = frozenset(int(r) for r in ranks)
                if len(key) > 1:
                    self._by_ranks.setdefault(key, dim)
        if p2p_on_world is not None and p2p_on_world not in _DIMS:
            raise PolicyError(f"resolver: unknown dimension {p2p_on_world!r}; valid: {', '.join(_DIMS)}")
        self.p2p_on_world = p2p_on_world
        self._cache: dict[Any, str | None] = {}
        self._lock = threading.Lock()

    def __call__(self, group: Any, op: str) -> str | None:
        if op == "send_recv" and (group is None or group is _world()):
            return self.p2p_on_world
        try:
            return self._cache[group]
        except (KeyError, TypeError):
            return self._lookup(group)

    def _lookup(self, group: Any) -> str | None:
        import torch.distributed as dist

        if not dist.is_initialized():
            return None  # not cached: the answer changes once the process group exists
        g = dist.group.WORLD if group is None else group
        try:
            ranks = frozenset(dist.get_process_group_ranks(g))
        except (ValueError, RuntimeError):
            ranks = frozenset()  # this rank is not in the group: nothing to decide
        dim = self._by_ranks.get(ranks)
        with self._lock:
            try:
                self._cache[group] = dim
            except TypeError:
                pass  # unhashable group object: look it up every time
        return dim

    def rank_sets(self) -> dict[str, list[list[int]]]:
        out: dict[str, list[list[int]]] = {}
        for ranks, dim in self._by_ranks.items():
            out.setdefault(dim, []).append(sorted(ranks))
        return {d: sorted(v) for d, v in out.items()}


def _world() -> Any:
    """The WORLD group object (None before init). Looked up per call: it changes when the default
    group is destroyed and re-created."""
    return _dist().group.WORLD


@functools.lru_cache(maxsize=None)
def _dist():
    import torch.distributed as dist

    return dist


class TopologyResolver(RankSetResolver):
    """DeepSpeed ``PipeModelDataParallelTopology`` (or any ProcessTopology with data/model/pipe axes):
    data -> dp, model -> tp, pipe -> pp; WORLD send/recv -> pp when there is more than one stage.
    ``extra``: more rank sets, e.g. ``{"ep": [[0, 1], [2, 3]]}`` for expert parallel groups."""

    def __init__(self, topology: Any, extra: Mapping[str, Iterable[Iterable[int]]] | None = None):
        axes = set(topology.get_axis_names())
        rank_sets: dict[str, list] = {dim: topology.get_axis_comm_lists(axis) for axis, dim in AXES.items() if axis in axes}
        for dim, sets in (extra or {}).items():
            rank_sets.setdefault(dim, []).extend(sets)
        pipe = topology.get_dim("pipe") if "pipe" in axes else 1
        super().__init__(rank_sets, p2p_on_world="pp" if pipe > 1 else None)
        self.topology = topology


class MpuResolver:
    """GPT-NeoX's ``megatron.mpu`` (Megatron-style module): its data / model / pipe groups.

    Resolves lazily: it can be attached before ``mpu.initialize_model_parallel`` has run (the patch is
    installed before ``deepspeed.init_distributed``); until the mpu groups exist every call is passed
    through, and the rank sets are read once they do. Uses the mpu's topology when it has one (all
    groups of each axis, so calls on groups this rank is not in are classified too), otherwise the
    groups of this rank.
    """

    def __init__(self, mpu: Any):
        self.mpu = mpu
        self._inner: RankSetResolver | None = None
        self._lock = threading.Lock()

    def __call__(self, group: Any, op: str) -> str | None:
        inner = self._inner
        if inner is None:
            inner = self._build()
            if inner is None:
                return None
        return inner(group, op)

    def _build(self) -> RankSetResolver | None:
        mpu = self.mpu
        if not mpu.model_parallel_is_initialized():
            return None
        with self._lock:
            if self._inner is not None:
                return self._inner
            topo = mpu.get_topology() if hasattr(mpu, "get_topology") else None
            if topo is not None:
                self._inner = TopologyResolver(topo)
                return self._inner
            import torch.distributed as dist

            rank_sets: dict[str, list] = {
                "dp": [dist.get_process_group_ranks(mpu.get_data_parallel_group())],
                "tp": [dist.get_process_group_ranks(mpu.get_model_parallel_group())],
            }
            pipe = None
            if hasattr(mpu, "get_pipe_parallel_group"):
                try:
                    pipe = mpu.get_pipe_parallel_group()
                except AssertionError:  # mpu asserts when no pipe group was built
                    pipe = None
            if pipe is not None:
                rank_sets["pp"] = [dist.get_process_group_ranks(pipe)]
            pipe_stages = len(rank_sets["pp"][0]) if "pp" in rank_sets else 1
            self._inner = RankSetResolver(rank_sets, p2p_on_world="pp" if pipe_stages > 1 else None)
            return self._inner


# --- automatic resolution ---------------------------------------------------------------------------------
# What each framework places, and how, is its adapter's (ccoll/frameworks/*.py); the resolver loops over them.

#: what AutoResolver looks for, in the order it trusts them (named in the "nothing resolved" warning)
AUTO_SOURCES = _frameworks.SOURCES

UNPLACED = "default"
_signature = _frameworks.signature
_DESCS = _frameworks.DESCS


def track_device_meshes(on: bool) -> None:
    """Record every torch DeviceMesh built from now on (``ccoll.patch.install`` turns this on)."""
    from .frameworks import devicemesh

    devicemesh.track(on)


def _c10d_state() -> tuple[Any, int]:
    """(default group or None, groups created so far): read per call, so from c10d's own variables
    (the public properties cost several times more); looked up through the properties if a torch
    version renames them."""
    from torch.distributed import distributed_c10d as c10d

    world = c10d._world
    if hasattr(world, "_default_pg") and hasattr(c10d, "_group_count"):
        def read() -> tuple[Any, int]:
            return world._default_pg, c10d._group_count
    else:  # pragma: no cover - other torch versions
        def read() -> tuple[Any, int]:
            return (world.default_pg if c10d.is_initialized() else None), world.group_count
    globals()["_c10d_state"] = read
    return read()


def _ranks(group: Any) -> frozenset[int]:
    try:
        return frozenset(_dist().get_process_group_ranks(group))
    except (ValueError, RuntimeError, AttributeError, TypeError):
        return frozenset()


class AutoResolver:
    """Finds the parallel dimension of a group from what the training framework already built.

    Looked up lazily at call time, from modules already imported (nothing is imported here):
    group_desc names (Megatron-core ``parallel_state``, torch DeviceMesh ``mesh_<dim>`` with torchtitan's
    dim names, see :data:`MESH_DIMS` / :data:`MEGATRON_CORE_GROUPS`), DeviceMesh dims that span all ranks
    (those reuse the default group), GPT-NeoX / Megatron ``megatron.mpu`` (its topology, or its own
    groups), and DeepSpeed's ``deepspeed.utils.groups`` (its mpu -- a PipelineParallelGrid in pipeline
    runs -- with its topology, expert-parallel groups -> ep, expert-data-parallel -> dp, and, with no mpu,
    the cloned world group -> dp). Groups nothing places belong to the policy's ``default`` dimension.

    WORLD is placed like any group, by rank set: when data parallelism spans all ranks, a WORLD
    collective *is* a DP collective (same ranks, same meaning), so it follows the ``dp`` rules. WORLD
    send/recv is ``pp`` when a pipeline topology (or a DeviceMesh ``pp`` dim over all ranks) exists,
    otherwise ``default``: DeepSpeed's pipeline engine sends on WORLD.

    Per call: a signature of the frameworks' state (group count, default group, DeepSpeed's mpu and world
    group, meshes built) is compared, then one dict lookup keyed by the group object, held weakly (a
    destroyed group cannot answer for a new one that reuses its address). The cache is rebuilt only when
    the signature changes, which happens at the same program point on every rank (group creation is
    collective), so all ranks -- both sides of a send/recv -- always decide alike.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._signature: tuple | None = None
        # id(group) -> (weak reference, dim): one dict lookup per call; the reference proves the entry is
        # still about this group object and not a dead one whose address was reused
        self._cache: dict[int, tuple[weakref.ref, str]] = {}
        self._by_group: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
        self._by_ranks: dict[frozenset[int], str] = {}
        self._p2p_on_world = UNPLACED
        #: sources that placed at least one group (empty: nothing resolved so far)
        self.found: set[str] = set()

    # --- per call -------------------------------------------------------------------------------------
    def __call__(self, group: Any, op: str) -> str:
        default_pg, group_count = _c10d_state()
        if default_pg is None:
            return UNPLACED  # before init_process_group: nothing can be placed yet (not cached)
        sig = (group_count, id(default_pg), _signature())
        if sig != self._signature:
            self._refresh(sig, default_pg)
        if group is None:
            if op == "send_recv":
                return self._p2p_on_world
            group = default_pg
        elif op == "send_recv" and group is default_pg:
            return self._p2p_on_world
        entry = self._cache.get(id(group))
        if entry is not None and entry[0]() is group:
            return entry[1]
        return self._lookup(group)

    def _lookup(self, g: Any) -> str:
        dim = None
        named = _DESCS.get(getattr(g, "group_desc", "") or "")
        if named is not None:
            dim = named[0]
            self.found.add(named[1])
        if dim is None:
            try:
                dim = self._by_group.get(g)
            except TypeError:
                dim = None
        if dim is None:
            dim = self._by_ranks.get(_ranks(g))
        dim = dim or UNPLACED
        try:
            ref = weakref.ref(g)
        except TypeError:
            return dim  # not weak-referenceable: looked up every time
        with self._lock:
            self._cache[id(g)] = (ref, dim)
        return dim

    # --- when the frameworks' state changed -----------------------------------------------------------
    def _refresh(self, sig: tuple, default_pg: Any) -> None:
        placer = _Placer()
        pipe_stages = 1
        for adapter in _frameworks.ADAPTERS:  # in the order they are trusted: the first placement stands
            pipe_stages = max(pipe_stages, adapter.place(placer, default_pg))
        with self._lock:
            self._by_group = placer.by_group
            self._by_ranks = placer.by_ranks
            self._p2p_on_world = "pp" if pipe_stages > 1 else UNPLACED
            self._cache = {}
            self.found |= placer.found
            self._signature = sig

    def tried(self) -> str:
        """What this resolver looks for (for the warning when nothing was placed)."""
        return "; ".join(AUTO_SOURCES)


class _Placer:
    """What the adapters' ``place`` fills: group -> dim and rank set -> dim (the first placement stands),
    and the sources that placed a group."""

    def __init__(self) -> None:
        self.by_group: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
        self.by_ranks: dict[frozenset[int], str] = {}
        self.found: set[str] = set()
        self.ranks = _ranks

    def add(self, dim: str, source: str, groups=(), rank_sets=()) -> None:
        for grp in groups:
            if grp is not None:
                try:
                    self.by_group.setdefault(grp, dim)
                except TypeError:
                    pass
                rank_sets = list(rank_sets) + [_ranks(grp)]
        for ranks in rank_sets:
            key = frozenset(int(r) for r in ranks)
            if len(key) > 1:
                self.by_ranks.setdefault(key, dim)
                self.found.add(source)

    def topology(self, topo: Any, source: str) -> int:
        """Every axis of a DeepSpeed / Megatron ProcessTopology (data -> dp, model -> tp, pipe -> pp), in
        dp, tp, pp order; returns its pipeline stages."""
        axes = set(topo.get_axis_names())
        for dim in _DIMS:
            for axis, d in AXES.items():
                if d == dim and axis in axes:
                    self.add(dim, source, rank_sets=topo.get_axis_comm_lists(axis))
        return topo.get_dim("pipe") if "pipe" in axes else 1
