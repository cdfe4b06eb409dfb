"""all_reduce in one exchange: every rank encodes its tensor once (with its error feedback), the p payloads
are all-gathered, and every rank decodes-and-sums them in rank order.

Why: :func:`ccoll.collectives.flat.all_reduce` pays two exchanges (an all-to-all of the chunks, then an
all-gather of the reduced chunks), each a collective launch and a network round trip, plus two quantizations
and the Python around them. Here there is one exchange and one quantization. Every rank runs the same
``decode_sum`` on the same bytes in the same row order (its own payload decoded like the others, never its
exact input), so replicas are bit-identical.

Only at p = 2: there each rank receives one encoded tensor either way (flat: two halves), so one exchange
saves an exchange, a quantization and codec passes for free (flat at p = 2 encodes half the tensor, decodes
and sums it, adds the exact half, divides, encodes it again and decodes the whole; here one encode of the
whole and one decode-and-sum). At p > 2 each rank would receive p-1 whole encoded tensors instead of
2(p-1)/p of one: bytes traded for latency, which pays on a fast link and loses on a slow one, and the rule
cannot know the link (every rank must choose alike from what the call says), so p > 2 keeps flat's
algorithm. A tensor of several segments (:mod:`.segments`) is pipelined: each segment is encoded and its
all-gather issued in turn, so the wire carries segment s while s+1 is encoded, and (sync calls) s-1 is
decoded; an async call issues every segment without waiting for the network, so it never holds up its
caller (a DDP hook's bucket above one segment held up DDP's backward while flat's reduce waited for each
segment's all-to-all). Measured on the 20 MiB loopback hooks bench, int4:block=256, one bucket: see issue 41's
note.
"""
from __future__ import annotations

from typing import Any, Hashable

import torch

from ..codecs import Codec
from ..feedback import residual_key
from ..transports import Transport
from .call import Run, contig, copy_back, feedback_buffer, flat_view, output_flat, plain, reduce_into, rows
from .phases import is_labelled
from .salts import OWN, salts
from . import segments as segmenting
from .segments import segments


def one_exchange(c: Codec, p: int, numel: int, dtype: torch.dtype) -> bool:
    """Whether an all_reduce of ``numel`` elements of ``dtype`` over ``p`` ranks runs in one exchange: on two
    ranks, every tensor (the module docstring says why). Depends on (codec, p, numel, dtype) only, so every
    rank chooses alike."""
    return p == 2


#: (codec id, numel, p, dtype, SEGMENT_BYTES) -> (codec, its segments): the cuts are two frames deep (the codec's
#: alignment, the segment arithmetic) and every two-rank call needs them
_cuts: dict[tuple, tuple] = {}


def residual_slots(c: Codec, p: int, rank: int, numel: int, element_size: int) -> list[tuple[str, int, int, int]]:
    """The residuals :func:`all_reduce` asks error feedback for, as (phase, segment, first element, numel)
    of the flat tensor: one per segment, its whole span (phase "whole")."""
    return [("whole", s, lo, seg_numel)
            for s, (lo, seg_numel, _) in enumerate(segments(numel, p, element_size, c.align_numel))]


def all_reduce(run: Run, c: Codec, tr: Transport, tensor: torch.Tensor, opn: str, async_op: bool,
               ef: Any, key: Hashable, salt: int | None):
    """Per segment: one encode (residual key phase "whole"), one all-gather, one fused decode-and-sum of the
    p rows in fp32, rounded once into the caller's dtype."""
    t = plain(tensor)
    p, n, dtype, device = tr.world_size, t.numel(), t.dtype, t.device  # each read builds a Python object: once
    side = run.stream
    k = (id(c), n, p, dtype, segmenting.SEGMENT_BYTES)
    known = _cuts.get(k)
    if known is not None and known[0] is c:
        cuts = known[1]
    else:
        cuts = segments(n, p, dtype.itemsize, c.align_numel)
        if len(_cuts) < 4096:
            _cuts[k] = (c, cuts)  # the codec kept with its cuts: its id cannot be reused while the entry lives
    # one exchange and nothing to overlap it with: a sync call's is issued sync (done when it returns, the side
    # stream ordered after it, as torch's sync calls order the current stream), no request to wait for; while
    # phases are labelled, async and waited for, as the trace has always shown it
    issue_async = async_op or len(cuts) > 1 or is_labelled(tr)
    salt_of = salts(salt, tr, c)
    gathers: list = []  # issued, not yet decoded
    wire = 0
    with side.on_side():
        side.keep(t)
        flat = t if t.dim() == 1 and t.is_contiguous() else contig(flat_view(t))
        out = flat if flat is t else output_flat(t)  # a 1-D contiguous tensor decodes into itself
        for s, (lo, seg_numel, _) in enumerate(cuts):
            nbytes = c.payload_nbytes(seg_numel, dtype)
            payload = rows(1, nbytes, device)
            fb = feedback_buffer(ef, residual_key(key, "whole", s), seg_numel, dtype, device, c, side)
            src = flat if seg_numel == n else flat[lo:lo + seg_numel]
            c.encode_rows(src, payload, seg_numel, feedback=fb, salt=salt_of(OWN, s))
            gathered = rows(p, nbytes, device)
            gathers.append((lo, seg_numel, gathered, payload, side.wrap(tr.all_gather(gathered, payload, issue_async))))
            wire += nbytes
            if not async_op and len(gathers) > 1:  # sync: the previous segment decoded while this one travels
                lo, seg_numel, gathered, _, handle = gathers.pop(0)
                handle.wait()
                reduce_into(c, gathered, out[lo:lo + seg_numel], p, opn)

    def body() -> None:
        for lo, seg_numel, gathered, _, handle in gathers:
            if handle is not None:  # None: a sync single segment's exchange, done when issued
                handle.wait()
            reduce_into(c, gathered, out if seg_numel == n else out[lo:lo + seg_numel], p, opn)
        del gathers[:]  # the send buffers live until the exchanges complete
        if out is not t:
            copy_back(t, out)

    works = [g[-1] for g in gathers] if async_op else []
    return run.compressed(async_op, works, body, c, n * dtype.itemsize, wire, [tensor])


__all__ = ["all_reduce", "one_exchange"]
