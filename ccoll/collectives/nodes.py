"""Which node each rank is on, and how a group splits into intra-node and inter-node subgroups.

Separate from the hierarchical algorithms (:mod:`.hierarchy`) because users configure it
(:func:`set_node_map`, documented in README as ``ccoll.hierarchy.set_node_map``) and the router asks
it whether a call has a hierarchy to use at all (:func:`layout_or_flat`).

The node map, first match wins:

1. :func:`set_node_map` (a list of node ids per global rank, or an int: L consecutive ranks per node);
2. env ``CCOLL_NODE_MAP``: ``"0,0,1,1"`` (node id per global rank) or ``"2"`` (L per node);
3. env ``LOCAL_WORLD_SIZE`` (torchrun: L consecutive ranks per node);
4. hostnames, gathered once per group over the group itself.

A group whose nodes hold different numbers of its ranks cannot be split into equal subgroups:
:func:`layout` raises :class:`UnevenNodesError` (a PolicyError); :func:`layout_or_flat` logs it once
and answers None (flat), the same decision on every rank since every rank has the same node map.

Subgroups (intra: the L ranks of this node in this group; inter: the N ranks of this local index) are
created once per group, on the first hierarchical call, by the members only (``torch.distributed.
new_group(..., use_local_synchronization=True)``, intra before inter on every rank, so there is no
cycle of waits; MPI: ``comm.Split``), and cached by their member ranks.
"""
from __future__ import annotations

import os
import socket
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import torch

from ..errors import PolicyError, TransportError
from ..log import warn_once
from ..transports import Transport, for_group


class UnevenNodesError(PolicyError):
    """The group's ranks are spread over its nodes in unequal numbers, so it has no equal intra/inter
    split; the collectives log it once and run flat."""


HIERARCHIES = ("node",)


class _NodeState:
    """What this process knows about nodes: the declared map and what was derived from it. One
    object (not module globals) so the lock visibly guards every field."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.explicit: list | int | None = None  # set_node_map's map
        self.version = 0  # bumped by set_node_map: cached layouts made under another map are rebuilt
        self.layouts: "weakref.WeakKeyDictionary[Transport, tuple[int, Any]]" = weakref.WeakKeyDictionary()
        self.hostnames: "weakref.WeakKeyDictionary[Transport, list[str]]" = weakref.WeakKeyDictionary()


_state = _NodeState()


def set_node_map(node_map: Any) -> None:
    """Declare which node each global rank is on: a sequence of node ids (any hashable, index = global
    rank), an int L (ranks ``[a*L, (a+1)*L)`` on node a), or None (back to the environment). Every rank
    must declare the same map. Takes effect for calls made after it (cached splits are rebuilt)."""
    with _state.lock:
        _state.explicit = None if node_map is None else _validated(node_map, "set_node_map")
        _state.version += 1


def _validated(node_map: Any, what: str) -> list | int:
    if isinstance(node_map, bool):
        raise PolicyError(f"{what}: a node map is a list of node ids per rank or an int, got {node_map!r}")
    if isinstance(node_map, int):
        if node_map < 1:
            raise PolicyError(f"{what}: ranks per node must be >= 1, got {node_map}")
        return node_map
    if isinstance(node_map, (str, bytes)) or not isinstance(node_map, Sequence) or not node_map:
        raise PolicyError(f"{what}: a node map is a non-empty list of node ids per rank or an int, got {node_map!r}")
    try:
        [hash(x) for x in node_map]
    except TypeError:
        raise PolicyError(f"{what}: node ids must be hashable, got {node_map!r}") from None
    return list(node_map)


def _env_map() -> list | int | None:
    text = os.environ.get("CCOLL_NODE_MAP", "").strip()
    if text:
        parts = [s.strip() for s in text.split(",")]
        if not all(parts):
            raise PolicyError(f"CCOLL_NODE_MAP={text!r}: use '2' (ranks per node) or '0,0,1,1' (node per rank)")
        if len(parts) == 1:
            try:
                return _validated(int(parts[0]), "CCOLL_NODE_MAP")
            except ValueError:
                raise PolicyError(f"CCOLL_NODE_MAP={text!r}: use '2' (ranks per node) or '0,0,1,1' (node per rank)") from None
        return parts
    lws = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    if lws:
        try:
            return _validated(int(lws), "LOCAL_WORLD_SIZE")
        except ValueError:
            raise PolicyError(f"LOCAL_WORLD_SIZE={lws!r} is not an integer") from None
    return None


def _node_of(node_map: list | int, global_rank: int, source: str) -> Hashable:
    if isinstance(node_map, int):
        return global_rank // node_map
    if global_rank >= len(node_map):
        raise PolicyError(f"{source} names {len(node_map)} ranks; global rank {global_rank} is not in it")
    return node_map[global_rank]


def _gather_hostnames(tr: Transport) -> list[str]:
    """Every group member's hostname, gathered once per group over the group (fixed 256-byte rows)."""
    names = _state.hostnames.get(tr)
    if names is None:
        mine = socket.gethostname().encode()[:256].ljust(256, b"\0")
        row = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
        out = torch.empty(tr.world_size * 256, dtype=torch.uint8)
        tr.all_gather(out, row)
        names = [bytes(out[i * 256:(i + 1) * 256].tolist()).rstrip(b"\0").decode(errors="replace")
                 for i in range(tr.world_size)]
        _state.hostnames[tr] = names
    return names


def nodes_of_group(tr: Transport) -> list[Hashable]:
    """The node id of every member of ``tr``'s group, in group rank order (collective only when the
    map comes from hostnames, the first time)."""
    with _state.lock:
        node_map, source = _state.explicit, "set_node_map"
    if node_map is None:
        node_map, source = _env_map(), "CCOLL_NODE_MAP/LOCAL_WORLD_SIZE"
    if node_map is None:
        return list(_gather_hostnames(tr))
    return [_node_of(node_map, tr.global_rank(i), source) for i in range(tr.world_size)]


@dataclass(frozen=True)
class Layout:
    """How one group splits: ``ranks[a][l]`` = group rank of local index l on node a (nodes ordered by
    their first group rank, local indices by group rank); this rank is ``(node, local)``. ``intra`` /
    ``inter``: the subgroups (this node's L ranks; the N ranks of this local index), as group objects
    the collectives take; ``inter_pos[a]``: node a's peer's rank in ``inter``."""

    nodes: int
    local_size: int
    node: int
    local: int
    ranks: tuple
    intra: Any = None
    inter: Any = None
    inter_pos: tuple = ()


def split(nodes: list[Hashable], rank: int) -> Layout | None:
    """The layout of a group whose member i is on ``nodes[i]``, seen by member ``rank`` (no subgroups
    yet); None when there is nothing to split (one node, or one rank per node); UnevenNodesError when the
    nodes hold different numbers of the group's ranks."""
    order: dict[Hashable, list[int]] = {}
    for i, n in enumerate(nodes):
        order.setdefault(n, []).append(i)
    members = list(order.values())
    sizes = sorted({len(m) for m in members})
    if len(sizes) > 1:
        raise UnevenNodesError(
            f"hierarchy: the group's {len(nodes)} ranks are spread unevenly over {len(members)} nodes "
            f"({', '.join(f'{n!r}: {len(m)}' for n, m in order.items())}); hierarchical collectives need "
            f"the same number of the group's ranks on every node"
        )
    if len(members) == 1 or sizes[0] == 1:
        return None
    node = next(a for a, m in enumerate(members) if rank in m)
    return Layout(nodes=len(members), local_size=sizes[0], node=node, local=members[node].index(rank),
                  ranks=tuple(tuple(m) for m in members))


def layout(group: Any = None) -> Layout | None:
    """The split of ``group`` (created on first use, then cached), or None when it spans one node or
    one rank per node. Collective the first time (every member must call it: the collectives do)."""
    tr = for_group(group)
    if tr.rank < 0:
        return None
    with _state.lock:
        version = _state.version
        cached = _state.layouts.get(tr)
    if cached is not None and cached[0] == version:
        return cached[1]
    lay = split(nodes_of_group(tr), tr.rank)
    if lay is not None:
        lay = _with_subgroups(tr, lay)
    with _state.lock:
        _state.layouts[tr] = (version, lay)
    return lay


def _with_subgroups(tr: Transport, lay: Layout) -> Layout:
    intra_members = [tr.global_rank(i) for i in lay.ranks[lay.node]]
    inter_members = [tr.global_rank(lay.ranks[a][lay.local]) for a in range(lay.nodes)]
    intra, inter = tr.subgroups(lay.node, lay.local, intra_members, inter_members)
    ti, tx = for_group(intra), for_group(inter)
    if ti.world_size != lay.local_size or ti.rank != lay.local or tx.world_size != lay.nodes:
        raise TransportError(f"hierarchy: subgroup creation gave ranks {ti.rank}/{ti.world_size} and "
                             f"{tx.rank}/{tx.world_size}, expected {lay.local}/{lay.local_size} and -/{lay.nodes}")
    inter_pos = tuple(tx.group_rank(g) for g in inter_members)
    return Layout(lay.nodes, lay.local_size, lay.node, lay.local, lay.ranks, intra, inter, inter_pos)


def layout_or_flat(group: Any) -> Layout | None:
    """The layout a hierarchical call uses, or None when the router should run the flat algorithm
    (one node, one rank per node, or uneven nodes: logged once, the same answer on every rank)."""
    try:
        return layout(group)
    except UnevenNodesError as e:
        warn_once(f"hier-uneven-{e}", "ccoll: %s; running the flat collective instead", e)
        return None


__all__ = ["HIERARCHIES", "Layout", "UnevenNodesError", "layout", "layout_or_flat", "nodes_of_group", "set_node_map",
           "split"]
