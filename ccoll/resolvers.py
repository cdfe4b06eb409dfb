"""Resolvers: process group -> parallel dimension ("dp", "tp", "pp", "ep") or None (not ours).

A resolver is any callable ``resolver(group, op) -> str | None``; ``group`` is what the caller passed to
torch.distributed (None = WORLD) and ``op`` is the policy op name ("all_reduce", ..., "send_recv").

Groups are matched by their rank set, not by object identity: frameworks create several group objects
for the same ranks (DeepSpeed's grid and GPT-NeoX's mpu each call new_group), and a rank set is what the
topology describes. The answer is cached per group object, so the per-call cost is one dict lookup.

Point-to-point on WORLD: DeepSpeed's pipeline engine (runtime/pipe/p2p.py, torch >= 1.8) calls
``dist.send/recv(tensor, peer)`` without a group, so WORLD send/recv is pipeline traffic when the
topology has more than one stage.

Nothing here imports deepspeed: resolvers take the topology or mpu object the caller already has.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Iterable, Mapping

from .errors import PolicyError

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
