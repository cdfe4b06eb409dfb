"""How a compressed collective cuts a tensor into pipelined pieces.

Segments are derived from (numel, dtype size, world size, codec alignment) only, so every rank issues
the same collectives in the same order without agreeing on anything at run time. Shared by the flat
and hierarchical algorithms, by :mod:`ccoll.model` (bytes on the wire) and by ``ccoll.ddp`` (which
maps the per-segment residuals of a packed bucket), which is why it is public and stands alone.
"""
from __future__ import annotations

#: all_reduce pipelines tensors larger than this (input bytes per segment) so that codec work overlaps
#: communication; each segment costs a few collective launches, so segments must stay large enough for
#: the link time to dominate that fixed cost. Tests shrink it to exercise many segments.
SEGMENT_BYTES = 8 << 20


def chunk_numel(p: int, element_size: int, align_numel: int) -> int:
    """Per-rank chunk of a full segment: a multiple of the codec's ``align_numel`` (no block straddles
    two chunks or needs padding inside a segment), about SEGMENT_BYTES / p bytes."""
    return max(SEGMENT_BYTES // (element_size * p) // align_numel, 1) * align_numel


def segments(n: int, p: int, element_size: int, align_numel: int) -> list[tuple[int, int, int]]:
    """``(first element, numel, per-rank chunk numel)`` of each segment of an ``n``-element all_reduce.
    A tensor of at most one segment is a single segment with chunk ``ceil(n / p)``, exactly the
    unsegmented layout; larger ones get full segments of ``p`` aligned chunks and a shorter last one."""
    chunk = chunk_numel(p, element_size, align_numel)
    seg_numel = p * chunk
    if n <= seg_numel:
        return [(0, n, -(-n // p))]
    full = [(lo, seg_numel, chunk) for lo in range(0, n - seg_numel + 1, seg_numel)]
    rest = n - len(full) * seg_numel
    return full + ([(n - rest, rest, -(-rest // p))] if rest else [])


def spans(m: int, p: int, element_size: int, align_numel: int) -> list[tuple[int, int]]:
    """``(start, numel)`` spans of a per-rank chunk of ``m`` elements for reduce_scatter / all_gather:
    the per-rank chunks of :func:`segments`, so each span's collective moves what one all_reduce
    segment's does; ``m`` up to one span is one span (the unsegmented layout)."""
    span = chunk_numel(p, element_size, align_numel)
    return [(a, min(span, m - a)) for a in range(0, m, span)]


__all__ = ["SEGMENT_BYTES", "chunk_numel", "segments", "spans"]
