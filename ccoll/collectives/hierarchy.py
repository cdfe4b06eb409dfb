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
  segments (:data:`ccoll.collectives.segments.SEGMENT_BYTES`), so one segment's intra-node phases overlap
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

The node map and the intra/inter split live in :mod:`.nodes`; the router (:mod:`ccoll.collectives`)
asks it for a layout and calls these functions only when there is one and the call compresses (it
keeps every passthrough rule of the flat path, so a native call stays exactly native).

``async_op=True``: as the flat collectives, every communication step is issued at call time, in
program order (so ranks never issue them in different orders, even when handles are waited on other
threads); the handle's ``wait()`` finishes the last step (reduce_scatter: the compressed exchange;
all_reduce / all_gather: the native intra-node all-gathers).

CUDA: every phase, native ones included, runs on ccoll's side stream through the call's
:class:`~ccoll.collectives.call.Run`, ordered like the flat paths (the caller's stream waits for the
done event at the end of the call or in ``wait()``); untested on a GPU so far (no device in CI).

Stats: one row per call under its collective, with the bytes that entered the compressed inter-node
phase as raw and that phase's payload bytes as wire (the native intra-node phases are the same
traffic as without ccoll); seconds as every call's (:mod:`ccoll.collectives.call`).
"""
from __future__ import annotations

from typing import Any, Hashable

import torch

from ..codecs import Codec
from ..feedback import residual_key
from ..transports import for_group
from . import flat
from .call import Run, contig, copy_back, feedback_buffer, flat_view, output_flat, rows
from .nodes import Layout
from .salts import NODE, salts
from .segments import segments


# --- all_reduce ---------------------------------------------------------------------------------

def all_reduce(run: Run, c: Codec, lay: Layout, tensor: torch.Tensor, opn: str, async_op: bool, ef: Any,
               key: Hashable, salt: int | None):
    """Hierarchical in-place all-reduce (see the module docstring)."""
    t = tensor.detach()
    n, dtype, L, N, dev = t.numel(), t.dtype, lay.local_size, lay.nodes, t.device
    intra, inter = for_group(lay.intra), for_group(lay.inter)
    side = run.stream
    # N = 2: pipelined over the flat collectives' segments (a segment's L blocks aligned to the codec),
    # so the intra-node phases of one segment overlap the inter-node exchange of another. N > 2: one
    # segment; the inner flat all_reduce pipelines itself (and keeps its error-feedback keys).
    pieces = segments(n, L, t.element_size(), c.align_numel) if N == 2 else [(0, n, -(-n // L))]
    parts, scatters = [], []
    raw = [0, 0]  # bytes that entered the node exchange, its payload bytes (N = 2)
    exchanges: list = []  # (segment, payload, rows, handle), issued, not yet summed
    gathers: list = []  # (segment, gathered, handle)

    def exchanged(s: int, k: int, reduced: torch.Tensor) -> None:
        """The node exchange of segment s is done: divide for avg, issue its intra-node all-gather."""
        if opn == "avg":
            reduced.div_(N * L)
        mine = reduced if reduced.dtype == dtype else reduced.to(dtype)
        whole = torch.empty(L * k, dtype=dtype, device=dev)
        gathers.append((s, whole, side.wrap(intra.native_all_gather(whole, mine, True))))

    def sum_payloads(x) -> None:
        s, payload, received, work = x
        work.wait()
        k = pieces[s][2]
        exchanged(s, k, c.decode_sum(received, k, dtype, out=torch.empty(k, dtype=torch.float32, device=dev)))

    with side.on_side():
        side.keep(t)
        flat_in = contig(flat_view(t))
        for lo, seg_numel, k in pieces:  # every intra-node reduce-scatter is issued first, in order
            if seg_numel == L * k:
                src = flat_in[lo:lo + seg_numel]
            else:
                src = torch.zeros(L * k, dtype=dtype, device=dev)
                src[:seg_numel].copy_(flat_in[lo:lo + seg_numel])
            parts.append(torch.empty(k, dtype=dtype, device=dev))
            scatters.append((src, side.wrap(intra.native_reduce_scatter(parts[-1], src, "sum", True))))
        salt_of = salts(salt, inter, c) if N == 2 else None
        for s, ((lo, seg_numel, k), (src, work)) in enumerate(zip(pieces, scatters)):
            work.wait()  # this node's exact partial sum of block `local` of segment s
            part = parts[s]
            raw[0] += k * t.element_size()
            if N == 2:
                # one lossy phase: each peer encodes its node's partial block once; both decode the same rows
                payload = rows(1, c.payload_nbytes(k, dtype), dev)
                fb = feedback_buffer(ef, residual_key(key, "node", s), k, dtype, dev, c, side)
                c.encode_rows(part, payload, k, feedback=fb, salt=salt_of(NODE, s))
                received = rows(N, payload.shape[1], dev)
                raw[1] += payload.numel()
                exchanges.append((s, payload, received, side.wrap(inter.all_gather(received, payload, True))))
                if len(exchanges) > 1:
                    sum_payloads(exchanges.pop(0))
            else:
                flat.all_reduce(run.inner(dev), c, inter, part, "sum", False, ef, key, salt)
                exchanged(s, k, part)
        for x in exchanges:
            sum_payloads(x)

    def body() -> None:
        out = output_flat(t)
        for s, whole, work in gathers:
            work.wait()
            lo, seg_numel, _ = pieces[s]
            out[lo:lo + seg_numel].copy_(whole[:seg_numel])
        copy_back(t, out)

    works = [g[2] for g in gathers] if async_op else []
    return run.compressed(async_op, works, body, c, raw[0], lambda: raw[1] + run.wire(), [tensor])


# --- reduce_scatter_tensor ------------------------------------------------------------------------

def _node_major(lay: Layout, blocks: torch.Tensor) -> torch.Tensor:
    """``blocks`` ([p, m], row = group rank) rearranged to [L, N, m]: [l, b] = the block of the rank of
    local index l on the node whose peer is at inter position b."""
    node_at = [0] * lay.nodes
    for a, b in enumerate(lay.inter_pos):
        node_at[b] = a
    index = [lay.ranks[node_at[b]][l] for l in range(lay.local_size) for b in range(lay.nodes)]
    return blocks.index_select(0, torch.tensor(index, device=blocks.device))


def reduce_scatter_tensor(run: Run, c: Codec, lay: Layout, output: torch.Tensor, input: torch.Tensor, opn: str,
                          async_op: bool, ef: Any, key: Hashable, salt: int | None):
    """Hierarchical reduce-scatter (see the module docstring)."""
    p = lay.nodes * lay.local_size
    out, inp = output.detach(), input.detach()
    m, side = out.numel(), run.stream
    with side.on_side():
        side.keep(inp, out)
        arranged = _node_major(lay, contig(flat_view(inp)).view(p, m)).view(-1)
        part = torch.empty(lay.nodes * m, dtype=out.dtype, device=out.device)
        side.wrap(for_group(lay.intra).native_reduce_scatter(part, arranged, "sum", True)).wait()
        mine = torch.empty(m, dtype=out.dtype, device=out.device)
        h = flat.reduce_scatter_tensor(run.inner(out.device), c, for_group(lay.inter), mine, part, "sum", async_op,
                                       ef, key, salt)

    def body() -> None:
        if opn == "avg":
            mine.div_(p)
        copy_back(out, mine)

    return run.compressed(async_op, [h], body, c, part.numel() * part.element_size(), run.wire, [output])


# --- all_gather_into_tensor -----------------------------------------------------------------------

def all_gather_into_tensor(run: Run, c: Codec, lay: Layout, output: torch.Tensor, input: torch.Tensor,
                           async_op: bool, salt: int | None):
    """Hierarchical all-gather (see the module docstring)."""
    N, L = lay.nodes, lay.local_size
    out, inp = output.detach(), input.detach()
    m, side = inp.numel(), run.stream
    with side.on_side():
        side.keep(inp, out)
        peers = torch.empty(N * m, dtype=inp.dtype, device=inp.device)  # [inter position, m], decoded
        flat.all_gather_into_tensor(run.inner(inp.device), c, for_group(lay.inter), peers, inp, False, salt)
        whole = torch.empty(L * N * m, dtype=inp.dtype, device=inp.device)  # [local, inter position, m]
        work = side.wrap(for_group(lay.intra).native_all_gather(whole, peers, True))

    def body() -> None:
        # group rank ranks[a][l] is whole[l, inter_pos[a]]
        index = [0] * (N * L)
        for a in range(N):
            for l in range(L):
                index[lay.ranks[a][l]] = l * N + lay.inter_pos[a]
        ordered = whole.view(N * L, m).index_select(0, torch.tensor(index, device=whole.device))
        copy_back(out, ordered.view(-1))

    return run.compressed(async_op, [work], body, c, m * inp.element_size(), run.wire, [output])


__all__ = ["all_gather_into_tensor", "all_reduce", "reduce_scatter_tensor"]
