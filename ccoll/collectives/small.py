"""all_reduce of small tensors in one exchange: every rank encodes its whole tensor once (with its error
feedback), the p payloads are all-gathered, and every rank decodes-and-sums them in rank order.

Why: a small compressed all_reduce is latency-bound, and :func:`ccoll.collectives.flat.all_reduce` pays
two exchanges (an all-to-all of the chunks, then an all-gather of the reduced chunks), each a collective
launch and a network round trip, plus two quantizations and the Python around them. Here there is one
exchange and one quantization. Every rank runs the same ``decode_sum`` on the same bytes in the same row
order (its own payload decoded like the others, never its exact input), so replicas are bit-identical.

Only at p = 2: there each rank receives one encoded tensor either way (flat: two halves), so the
one-exchange path saves an exchange and a quantization for free, and every tensor of one pipeline
segment takes it (a tensor of several segments keeps flat's pipeline, which overlaps codec work with
the wire). At p > 2 each rank would receive p-1 whole encoded tensors instead of 2(p-1)/p of one:
bytes traded for latency, which pays on a fast link and loses on a slow one, and the rule cannot know
the link (every rank must choose alike from what the call says), so p > 2 keeps flat's algorithm.
Codec work grows a little: every rank decodes both whole payloads (flat: one and a half tensors'
worth); with no wire at all (``python -m ccoll.bench.overhead``'s in-process table) a 1 MiB call on
the CPU is then slower than flat's, while over two gloo ranks, where the exchange saved is hundreds of
microseconds, it is faster at 1 MiB too.
"""
from __future__ import annotations

from typing import Any, Hashable

import torch

from ..codecs import Codec
from ..feedback import residual_key
from ..transports import Transport
from .call import Run, contig, copy_back, feedback_buffer, flat_view, output_flat, plain, rows
from .phases import is_labelled
from .salts import OWN, salts
from . import segments
from .segments import single_segment


def one_exchange(c: Codec, p: int, numel: int, dtype: torch.dtype) -> bool:
    """Whether an all_reduce of ``numel`` elements of ``dtype`` over ``p`` ranks runs in one exchange:
    two ranks and a single pipeline segment. Depends on (codec, p, numel, dtype) only, so every rank
    chooses alike. Answers are kept per (codec, numel, dtype, segment size): the rule is four frames deep
    (the codec's alignment, the segment arithmetic) and the router asks it on every two-rank call."""
    if p != 2:
        return False
    k = (id(c), numel, dtype, segments.SEGMENT_BYTES)
    known = _answers.get(k)
    if known is not None and known[0] is c:
        return known[1]
    one = single_segment(numel, p, dtype.itemsize, c.align_numel)
    if len(_answers) < 4096:
        _answers[k] = (c, one)  # the codec kept with its answer: its id cannot be reused while the entry lives
    return one


_answers: dict[tuple, tuple] = {}


def residual_slots(c: Codec, p: int, rank: int, numel: int, element_size: int) -> list[tuple[str, int, int, int]]:
    """The residuals :func:`all_reduce` asks error feedback for, as (phase, segment, first element, numel)
    of the flat tensor: one, the whole tensor (phase "whole")."""
    return [("whole", 0, 0, numel)]


def all_reduce(run: Run, c: Codec, tr: Transport, tensor: torch.Tensor, opn: str, async_op: bool,
               ef: Any, key: Hashable, salt: int | None):
    """One encode (residual key phase "whole"), one all-gather, one fused decode-and-sum of the p rows
    in fp32, rounded once into the caller's dtype."""
    t = plain(tensor)
    p, n, dtype, device = tr.world_size, t.numel(), t.dtype, t.device  # each read builds a Python object: once
    side = run.stream
    with side.on_side():
        side.keep(t)
        nbytes = c.payload_nbytes(n, dtype)
        payload = rows(1, nbytes, device)
        fb = feedback_buffer(ef, residual_key(key, "whole"), n, dtype, device, c, side)
        flat = t if t.dim() == 1 and t.is_contiguous() else contig(flat_view(t))
        c.encode_rows(flat, payload, n, feedback=fb, salt=salts(salt, tr, c)(OWN, 0))
        gathered = rows(p, nbytes, device)
        # one exchange and nothing to overlap it with: a sync call's is issued sync (done when it returns, the
        # side stream ordered after it, as torch's sync calls order the current stream), no request to wait for;
        # while phases are labelled, async and waited for, as the trace has always shown it
        inner = side.wrap(tr.all_gather(gathered, payload, async_op or is_labelled(tr)))
    sending = [payload]  # the send buffer lives until the exchange completes

    def body() -> None:
        out = flat if flat is t else output_flat(t)  # a 1-D contiguous tensor decodes into itself
        acc = out if dtype == torch.float32 else torch.empty(n, dtype=torch.float32, device=device)
        c.decode_sum(gathered, n, dtype, out=acc)
        if opn == "avg":
            acc.div_(p)
        if acc is not out:
            out.copy_(acc)
        if out is not t:
            copy_back(t, out)
        del sending[:]

    return run.compressed(async_op, [inner], body, c, n * dtype.itemsize, nbytes, [tensor])


__all__ = ["all_reduce", "one_exchange"]
