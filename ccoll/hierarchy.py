"""Hierarchy-aware collectives: exact (native) inside a node, compressed only between nodes.

Inside a node the links (NVLink, shared memory, loopback) are an order of magnitude faster than the
network, so compressing there costs codec time and error and saves nothing; between nodes it pays
(ZeRO++, SDP4Bit). With ``hierarchy="node"`` (policy key ``hierarchy: node``) the three collectives
that carry the bulk of training traffic run in two levels over a group of N nodes x L ranks:

- ``all_reduce``: native intra-node reduce-scatter (each rank holds its node's exact partial sum of
  1/L of the tensor); between the N ranks of the same local index, the compressed exchange of that
  1/L; native intra-node all-gather. With N = 2 the exchange is ONE lossy phase: every rank encodes its
  node's partial chunk once (error feedback key ``(key, "node")``), the N payloads are all-gathered and
  every peer decodes-and-sums the same payloads in the same order (bit-identical, and for N = 2 the
  same inter-node bytes as the two-phase exchange); it is pipelined over the flat collectives'
  segments (:data:`ccoll.collectives.SEGMENT_BYTES`), so one segment's intra-node phases overlap
  another's exchange. With N > 2 the all-gather would send N/2 times the bytes, so the exchange is
  ccoll's flat compressed all_reduce of the chunk among the N peers (two lossy phases, as flat, but
  over N partial sums instead of p inputs; that call pipelines itself). Bytes on each node's link:
  N/(2L) of flat's for N = 2 (the flat all_reduce sends each rank's chunks and its reduced chunk to
  every remote rank; here each node's partial crosses once).
- ``reduce_scatter_tensor``: native intra-node reduce-scatter of the input rearranged so local rank l
  receives its node's exact partial sums of the N chunks owned by the ranks of local index l; then the
  compressed flat reduce_scatter among those N peers (one lossy phase, N encodes instead of p).
- ``all_gather_into_tensor``: compressed flat all_gather among the N peers of the same local index
  (every input encoded once, as flat), then native intra-node all-gather; each input crosses the
  network to N - 1 peers instead of (N - 1) x L ranks.

Every rank ends with the same bytes (the invariant of :mod:`ccoll.collectives`): every lossy payload is
decoded by every rank that uses it, from the same bytes, in the same order, and the native phases
move those exact bytes. Error feedback and salts follow the flat collectives (the inner flat calls get
the caller's ``error_feedback``/``key``/``salt``; residuals made for another layout reset by
signature, so switching between flat and hierarchical is safe).

The node map (which node each global rank is on), first match wins:

1. :func:`set_node_map` (a list of node ids per global rank, or an int: L consecutive ranks per node);
2. env ``CCOLL_NODE_MAP``: ``"0,0,1,1"`` (node id per global rank) or ``"2"`` (L per node);
3. env ``LOCAL_WORLD_SIZE`` (torchrun: L consecutive ranks per node);
4. hostnames, gathered once per group over the group itself.

Falls back to the flat path (exactly today's call) when the group spans one node or one rank per
node (nothing to split), and for everything the flat path passes through natively (``codec=None``,
MAX/MIN, integers, small tensors, ...). A group whose nodes hold different numbers of its ranks cannot
be split into equal subgroups: :func:`layout` raises :class:`UnevenNodesError` (a PolicyError); the
collectives log it once and run flat (documented fallback, the same decision on every rank since
every rank has the same node map).

Subgroups (intra: the L ranks of this node in this group; inter: the N ranks of this local index) are
created once per group, on the first hierarchical call, by the members only (``torch.distributed.
new_group(..., use_local_synchronization=True)``, intra before inter on every rank, so there is no
cycle of waits; MPI: ``comm.Split``), and cached by their member ranks.

``async_op=True``: as the flat collectives, every communication step is issued at call time, in
program order (so ranks never issue them in different orders, even when handles are waited on other
threads); the handle's ``wait()`` finishes the last step (reduce_scatter: the compressed exchange;
all_reduce / all_gather: the native intra-node all-gathers).

CUDA: the native phases and the N = 2 exchange run on the caller's current stream (the inner flat
calls use ccoll's side stream as usual); untested on a GPU so far (no device in CI).

Stats: the compressed inter-node phase records as its collective (the N = 2 all_reduce exchange as
``all_reduce``; otherwise the inner flat call's op) with the bytes that entered it as raw; the native
intra-node phases are not recorded (they are the same traffic as without ccoll).
"""
from __future__ import annotations

import os
import socket
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import torch

from .errors import PolicyError, TransportError
from .log import warn_once
from .stats import record as record_stats
from .transports import Handle, Transport, for_group, op_name

#: what the hierarchical entry points return when the call should take the flat path instead
FLAT = object()


class UnevenNodesError(PolicyError):
    """The group's ranks are spread over its nodes in unequal numbers, so it has no equal intra/inter
    split; the collectives log it once and run flat."""


HIERARCHIES = ("node",)

_lock = threading.RLock()
_explicit: list | None = None
_version = 0  # bumped by set_node_map: cached layouts made under another map are rebuilt
_layouts: "weakref.WeakKeyDictionary[Transport, tuple[int, Any]]" = weakref.WeakKeyDictionary()
_subgroups: dict[tuple, Any] = {}  # (kind, member global ranks) -> torch group (created once per process)
_hostnames: "weakref.WeakKeyDictionary[Transport, list[str]]" = weakref.WeakKeyDictionary()


def set_node_map(node_map: Any) -> None:
    """Declare which node each global rank is on: a sequence of node ids (any hashable, index = global
    rank), an int L (ranks ``[a*L, (a+1)*L)`` on node a), or None (back to the environment). Every rank
    must declare the same map. Takes effect for calls made after it (cached splits are rebuilt)."""
    global _explicit, _version
    with _lock:
        _explicit = None if node_map is None else _validated(node_map, "set_node_map")
        _version += 1


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
    names = _hostnames.get(tr)
    if names is None:
        mine = socket.gethostname().encode()[:256].ljust(256, b"\0")
        row = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
        out = torch.empty(tr.world_size * 256, dtype=torch.uint8)
        tr.all_gather(out, row)
        names = [bytes(out[i * 256:(i + 1) * 256].tolist()).rstrip(b"\0").decode(errors="replace")
                 for i in range(tr.world_size)]
        _hostnames[tr] = names
    return names


def nodes_of_group(tr: Transport) -> list[Hashable]:
    """The node id of every member of ``tr``'s group, in group rank order (collective only when the
    map comes from hostnames, the first time)."""
    with _lock:
        node_map, source = _explicit, "set_node_map"
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
    with _lock:
        version = _version
        cached = _layouts.get(tr)
    if cached is not None and cached[0] == version:
        return cached[1]
    lay = split(nodes_of_group(tr), tr.rank)
    if lay is not None:
        lay = _with_subgroups(tr, lay)
    with _lock:
        _layouts[tr] = (version, lay)
    return lay


def _with_subgroups(tr: Transport, lay: Layout) -> Layout:
    intra_members = [tr.global_rank(i) for i in lay.ranks[lay.node]]
    inter_members = [tr.global_rank(lay.ranks[a][lay.local]) for a in range(lay.nodes)]
    if tr.kind == "torch":
        intra, inter = _torch_group(tr, intra_members), _torch_group(tr, inter_members)
    elif tr.kind == "mpi":
        comm = tr.comm
        intra = comm.Split(lay.node, lay.local)
        inter = comm.Split(lay.local, lay.node)
    elif tr.kind == "memory":
        intra, inter = _memory_group(tr, intra_members), _memory_group(tr, inter_members)
    else:
        raise TransportError(f"hierarchy: cannot create subgroups of a {tr.kind or type(tr).__name__} group "
                             f"(torch.distributed, MPI and simulated groups only)")
    ti, tx = for_group(intra), for_group(inter)
    if ti.world_size != lay.local_size or ti.rank != lay.local or tx.world_size != lay.nodes:
        raise TransportError(f"hierarchy: subgroup creation gave ranks {ti.rank}/{ti.world_size} and "
                             f"{tx.rank}/{tx.world_size}, expected {lay.local}/{lay.local_size} and -/{lay.nodes}")
    inter_pos = tuple(tx.group_rank(g) for g in inter_members)
    return Layout(lay.nodes, lay.local_size, lay.node, lay.local, lay.ranks, intra, inter, inter_pos)


def _torch_group(tr: Transport, members: list[int]) -> Any:
    """A torch subgroup of ``members`` (global ranks, increasing), created once per process by its
    members only; torch orders a group's ranks by global rank, as :func:`split` orders local indices."""
    import torch.distributed as dist

    key = ("torch", tuple(members))
    with _lock:
        g = _subgroups.get(key)
    if g is None:
        g = dist.new_group(ranks=list(members), backend=tr.backend, use_local_synchronization=True)
        with _lock:
            _subgroups[key] = g
    return g


def _memory_group(tr: Transport, members: list[int]) -> Any:
    """A simulated world's subgroup of ``members`` (its ranks, in this order): one shared
    :class:`~ccoll.transports.memory.MemoryWorld` per member list, created by the first member to get
    here; its transport names the parent world's ranks (salts and rank arguments stay global). A
    failing rank aborts the parent world only: waits in a subgroup end at the world's timeout."""
    from .transports.memory import MemoryTransport, MemoryWorld

    class _Sub(MemoryTransport):
        def group_rank(self, global_rank: int) -> int:
            if int(global_rank) not in members:
                raise TransportError(f"rank {global_rank} is not in the simulated subgroup {members}")
            return members.index(int(global_rank))

        def global_rank(self, group_rank: int) -> int:
            return members[int(group_rank)]

    world = tr.world
    with world.cond:
        sub = world.objects.get(("ccoll.hierarchy", tuple(members)))
        if sub is None:
            sub = world.objects[("ccoll.hierarchy", tuple(members))] = MemoryWorld(len(members), world.timeout_s)
    group = sub.groups[members.index(tr.global_rank(tr.rank))]
    group.ccoll_transport = _Sub(group)
    return group


def _resolve(group: Any) -> Layout | None:
    """The layout to use, or None for flat (uneven nodes log once and go flat)."""
    try:
        return layout(group)
    except UnevenNodesError as e:
        warn_once(f"hier-uneven-{e}", "ccoll: %s; running the flat collective instead", e)
        return None


def _plan(tensor: torch.Tensor, group: Any, codec: Any, min_bytes: int | None, opn: str | None,
          hierarchy: Any) -> tuple[Any, Layout] | None:
    """(codec, layout) for a hierarchical call, or None when the flat path applies (its passthrough
    rules decide first, so a native call stays exactly native)."""
    from .collectives import _plan as flat_plan

    tr = for_group(group)
    if tr.rank < 0 or not isinstance(tensor, torch.Tensor):
        return None
    if hierarchy not in HIERARCHIES:
        raise PolicyError(f"hierarchy must be None or one of {', '.join(HIERARCHIES)}, got {hierarchy!r}")
    c = flat_plan(codec, tensor, min_bytes, tr, opn)
    if c is None:
        return None
    lay = _resolve(group)
    return None if lay is None else (c, lay)


# --- all_reduce ---------------------------------------------------------------------------------

def all_reduce(tensor: torch.Tensor, op: Any = "sum", group: Any = None, codec: Any = None,
               async_op: bool = False, *, hierarchy: Any = "node", error_feedback: Any = None,
               key: Hashable = None, min_bytes: int | None = None, salt: int | None = None) -> Any:
    """Hierarchical in-place all-reduce (see the module docstring), or :data:`FLAT`."""
    from . import collectives as flat

    opn = op_name(op)
    plan = _plan(tensor, group, codec, min_bytes, opn, hierarchy)
    if plan is None:
        return FLAT
    c, lay = plan
    if error_feedback is not None and key is None:
        raise PolicyError("all_reduce: error_feedback needs key= naming the logical tensor")
    t0 = flat._start()
    t = tensor.detach()
    n, dtype, L, N, dev = t.numel(), t.dtype, lay.local_size, lay.nodes, t.device
    intra, inter = for_group(lay.intra), for_group(lay.inter)
    flat_in = flat._contig(t.reshape(-1))
    # N = 2: pipelined over the flat collectives' segments (a segment's L blocks aligned to the codec),
    # so the intra-node phases of one segment overlap the inter-node exchange of another. N > 2: one
    # segment; the inner flat all_reduce pipelines itself (and keeps its error-feedback keys).
    segments = flat._segments(n, L, t.element_size(), c.align_numel) if N == 2 else [(0, n, -(-n // L))]
    parts, scatters = [], []
    for lo, seg_numel, k in segments:  # every intra-node reduce-scatter is issued first, in order
        if seg_numel == L * k:
            src = flat_in[lo:lo + seg_numel]
        else:
            src = torch.zeros(L * k, dtype=dtype, device=dev)
            src[:seg_numel].copy_(flat_in[lo:lo + seg_numel])
        parts.append(torch.empty(k, dtype=dtype, device=dev))
        scatters.append((src, intra.native_reduce_scatter(parts[-1], src, "sum", True)))
    salt_of = flat._salts(salt, inter) if N == 2 else None
    wire = [0, 0]  # raw and payload bytes of the node exchange (N = 2)
    exchanges: list = []  # (segment, payload, rows, handle), issued, not yet summed
    gathers: list = []  # (segment, gathered, handle)

    def exchanged(s: int, k: int, reduced: torch.Tensor) -> None:
        """The node exchange of segment s is done: divide for avg, issue its intra-node all-gather."""
        if opn == "avg":
            reduced.div_(N * L)
        mine = reduced if reduced.dtype == dtype else reduced.to(dtype)
        whole = torch.empty(L * k, dtype=dtype, device=dev)
        gathers.append((s, whole, intra.native_all_gather(whole, mine, True)))

    def sum_payloads(x) -> None:
        s, payload, rows, work = x
        work.wait()
        k = segments[s][2]
        exchanged(s, k, c.decode_sum(rows, k, dtype, out=torch.empty(k, dtype=torch.float32, device=dev)))

    for s, ((lo, seg_numel, k), (src, work)) in enumerate(zip(segments, scatters)):
        work.wait()  # this node's exact partial sum of block `local` of segment s
        part = parts[s]
        if N == 2:
            # one lossy phase: each peer encodes its node's partial block once; both decode the same rows
            payload = flat._rows(1, c.encoded_nbytes(k, dtype), dev)
            fb = flat._feedback(error_feedback, (key, "node") + flat._ef_segment(s), k, dtype, dev, c)
            c.encode_rows(part, payload, k, feedback=fb, salt=salt_of(2, s))
            rows = flat._rows(N, payload.shape[1], dev)
            wire[0] += k * t.element_size()
            wire[1] += payload.numel()
            exchanges.append((s, payload, rows, inter.all_gather(rows.view(-1), payload.view(-1), True)))
            if len(exchanges) > 1:
                sum_payloads(exchanges.pop(0))
        else:
            flat.all_reduce(part, "sum", lay.inter, c, False, error_feedback=error_feedback, key=key,
                            min_bytes=0, salt=salt)
            exchanged(s, k, part)
    for x in exchanges:
        sum_payloads(x)
    if N == 2:
        record_stats("all_reduce", c.spec, wire[0], wire[1], time.perf_counter() - t0[0], dim=t0[1])

    def then() -> None:
        out = flat._output_flat(t)
        for s, whole, work in gathers:
            work.wait()
            lo, seg_numel, _ = segments[s]
            out[lo:lo + seg_numel].copy_(whole[:seg_numel])
        flat._copy_back(t, out)

    if async_op:
        return Handle([g[2] for g in gathers], then, [tensor])
    then()
    return None


# --- reduce_scatter_tensor ------------------------------------------------------------------------

def _node_major(lay: Layout, blocks: torch.Tensor) -> torch.Tensor:
    """``blocks`` ([p, m], row = group rank) rearranged to [L, N, m]: [l, b] = the block of the rank of
    local index l on the node whose peer is at inter position b."""
    node_at = [0] * lay.nodes
    for a, b in enumerate(lay.inter_pos):
        node_at[b] = a
    index = [lay.ranks[node_at[b]][l] for l in range(lay.local_size) for b in range(lay.nodes)]
    return blocks.index_select(0, torch.tensor(index, device=blocks.device))


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op: Any = "sum", group: Any = None,
                          codec: Any = None, async_op: bool = False, *, hierarchy: Any = "node",
                          error_feedback: Any = None, key: Hashable = None, min_bytes: int | None = None,
                          salt: int | None = None) -> Any:
    """Hierarchical reduce-scatter (see the module docstring), or :data:`FLAT`."""
    from . import collectives as flat

    opn = op_name(op)
    if not isinstance(output, torch.Tensor):
        return FLAT
    plan = _plan(input, group, codec, min_bytes, opn, hierarchy)
    if plan is None:
        return FLAT
    c, lay = plan
    p = lay.nodes * lay.local_size
    out, inp = output.detach(), input.detach()
    if inp.numel() != p * out.numel() or inp.dtype != out.dtype:
        return FLAT  # the flat call raises its typed error
    if error_feedback is not None and key is None:
        raise PolicyError("reduce_scatter_tensor: error_feedback needs key= naming the logical tensor")
    m = out.numel()
    arranged = _node_major(lay, flat._contig(inp.reshape(-1)).view(p, m)).view(-1)
    part = torch.empty(lay.nodes * m, dtype=out.dtype, device=out.device)
    for_group(lay.intra).native_reduce_scatter(part, arranged, "sum")
    mine = torch.empty(m, dtype=out.dtype, device=out.device)
    h = flat.reduce_scatter_tensor(mine, part, "sum", lay.inter, c, async_op, error_feedback=error_feedback,
                                   key=key, min_bytes=0, salt=salt)

    def then() -> None:
        if opn == "avg":
            mine.div_(p)
        flat._copy_back(out, mine)

    return flat._finish(async_op, h, then, [output])


# --- all_gather_into_tensor -----------------------------------------------------------------------

def all_gather_into_tensor(output: torch.Tensor, input: torch.Tensor, group: Any = None, codec: Any = None,
                           async_op: bool = False, *, hierarchy: Any = "node", min_bytes: int | None = None,
                           salt: int | None = None) -> Any:
    """Hierarchical all-gather (see the module docstring), or :data:`FLAT`."""
    from . import collectives as flat

    if not isinstance(output, torch.Tensor):
        return FLAT
    plan = _plan(input, group, codec, min_bytes, None, hierarchy)
    if plan is None:
        return FLAT
    c, lay = plan
    N, L = lay.nodes, lay.local_size
    out, inp = output.detach(), input.detach()
    if out.numel() != N * L * inp.numel() or inp.dtype != out.dtype:
        return FLAT  # the flat call raises its typed error
    m = inp.numel()
    peers = torch.empty(N * m, dtype=inp.dtype, device=inp.device)  # [inter position, m], decoded
    flat.all_gather_into_tensor(peers, inp, lay.inter, c, False, min_bytes=0, salt=salt)
    whole = torch.empty(L * N * m, dtype=inp.dtype, device=inp.device)  # [local, inter position, m]
    work = for_group(lay.intra).native_all_gather(whole, peers, async_op)

    def then() -> None:
        # group rank ranks[a][l] is whole[l, inter_pos[a]]
        index = [0] * (N * L)
        for a in range(N):
            for l in range(L):
                index[lay.ranks[a][l]] = l * N + lay.inter_pos[a]
        ordered = whole.view(N * L, m).index_select(0, torch.tensor(index, device=whole.device))
        flat._copy_back(out, ordered.view(-1))

    return flat._finish(async_op, work, then, [output])


__all__ = ["FLAT", "HIERARCHIES", "Layout", "UnevenNodesError", "all_gather_into_tensor", "all_reduce", "layout",
           "nodes_of_group", "reduce_scatter_tensor", "set_node_map", "split"]
