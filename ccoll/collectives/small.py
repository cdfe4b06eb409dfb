"""all_reduce of small tensors in one exchange: every rank encodes its whole tensor once (with its error
feedback), the p payloads are all-gathered, and every rank decodes-and-sums them in rank order.

Why: a small compressed all_reduce is latency-bound, and :func:`ccoll.collectives.flat.all_reduce` pays
two exchanges (an all-to-all of the chunks, then an all-gather of the reduced chunks), each a collective
launch and a network round trip, plus two quantizations and the Python around them. Here there is one
exchange and one quantization. Every rank runs the same ``decode_sum`` on the same bytes in the same row
order (its own payload decoded like the others, never its exact input), so replicas are bit-identical.

The price is bytes: each rank receives p-1 whole encoded tensors instead of 2(p-1)/p of one. At p = 2
that is the same (one encoded tensor's worth each way), so with two ranks every tensor of one pipeline
segment goes this way (a tensor of several segments keeps flat's pipeline, which overlaps codec work
with the wire). At p > 2 the extra (p-1)(p-2)/p encoded tensors per rank must cost less than the
exchange they save, on the fastest link considered: :func:`one_exchange`. Codec work grows too: every
rank decodes p whole payloads (flat: two tensors' worth), which at p = 2 is half a tensor more; with no
wire at all (``python -m ccoll.bench.overhead``'s in-process table) a 1 MiB call on the CPU is then
slower than flat's, while over two gloo ranks, where the exchange saved is hundreds of microseconds, it
is faster at 1 MiB too.
"""
from __future__ import annotations

from typing import Any, Hashable

import torch

from ..codecs import Codec
from ..feedback import residual_key
from ..transports import Transport
from .call import Run, contig, copy_back, feedback_buffer, output_flat, rows
from .salts import OWN, salts
from .segments import segments

#: what one exchange costs at the least: a collective launch plus a network round trip on a fast
#: fabric (NCCL on InfiniBand / NVLink: ~10-30 us; gloo over TCP measured 300-800 us per exchange by
#: ``python -m ccoll.bench.overhead``), so the lower end, which makes the rule below conservative
SAVED_EXCHANGE_S = 20e-6
#: the fastest link considered: 400 Gbit/s per rank
FASTEST_LINK_BYTES_PER_S = 400e9 / 8
#: extra bytes a rank may receive to save one exchange: what the fastest link moves in that time (1 MB)
EXTRA_BYTES = int(SAVED_EXCHANGE_S * FASTEST_LINK_BYTES_PER_S)


def one_exchange(c: Codec, p: int, numel: int, dtype: torch.dtype) -> bool:
    """Whether an all_reduce of ``numel`` elements of ``dtype`` over ``p`` ranks runs in one exchange:
    a single pipeline segment, and the bytes it receives beyond flat's two-exchange algorithm,
    (p-1)(p-2)/p encoded tensors, within :data:`EXTRA_BYTES` (always at p = 2, where there are none).
    Depends on (codec, p, numel, dtype) only, so every rank chooses alike.

    Per world size this admits encoded tensors up to: p = 3 -> 1.5 MB, 4 -> 667 KB, 8 -> 190 KB,
    64 -> 16 KB, 256 -> 3.9 KB (int8: about 4x that in fp32 input bytes)."""
    if p < 2 or len(segments(numel, p, dtype.itemsize, c.align_numel)) != 1:
        return False
    extra = (p - 1) * (p - 2) * c.encoded_nbytes(numel, dtype) // p
    return extra <= EXTRA_BYTES


def all_reduce(run: Run, c: Codec, tr: Transport, tensor: torch.Tensor, opn: str, async_op: bool,
               ef: Any, key: Hashable, salt: int | None):
    """One encode (residual key phase "whole"), one all-gather, one fused decode-and-sum of the p rows
    in fp32, rounded once into the caller's dtype."""
    t = tensor.detach()
    p, n, dtype = tr.world_size, t.numel(), t.dtype
    side = run.stream
    with side.on_side():
        side.keep(t)
        payload = rows(1, c.encoded_nbytes(n, dtype), t.device)
        fb = feedback_buffer(ef, residual_key(key, "whole"), n, dtype, t.device, c, side)
        c.encode_rows(contig(t.reshape(-1)), payload, n, feedback=fb, salt=salts(salt, tr)(OWN, 0))
        gathered = rows(p, payload.shape[1], t.device)
        inner = side.wrap(tr.all_gather(gathered.view(-1), payload.view(-1), True))
    sending = [payload]  # the send buffer lives until the exchange completes

    def body() -> None:
        out = output_flat(t)
        acc = out if dtype == torch.float32 else torch.empty(n, dtype=torch.float32, device=t.device)
        c.decode_sum(gathered, n, dtype, out=acc)
        if opn == "avg":
            acc.div_(p)
        if acc is not out:
            out.copy_(acc)
        copy_back(t, out)
        del sending[:]

    return run.compressed(async_op, [inner], body, c, n * t.element_size(), payload.numel(),
                          [tensor])


__all__ = ["EXTRA_BYTES", "FASTEST_LINK_BYTES_PER_S", "SAVED_EXCHANGE_S", "all_reduce", "one_exchange"]
