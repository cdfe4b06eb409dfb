"""The one skeleton every collective call runs: validate -> decide passthrough -> plan -> run with
(stream, stats, handle). The router (:mod:`ccoll.collectives`) and the algorithms share it through
these public names, so the rules below exist once.

Why one :func:`decide`: "compress this call or send it exactly?" used to be answered separately by
the patch, the policy and every entry point, and the answers drifted. The policy (``Policy.resolve``)
only *chooses* a codec for (dimension, op, size, step); whether that codec may touch this tensor on
this group is always :func:`decide`'s answer.

Why one :class:`Run`: stats ``seconds`` must mean the same on every path, and CUDA ordering must be
the same for flat, hierarchical and variable-size algorithms. Seconds = from the call to the moment
its results are ready for the caller: host clock on CPU; on CUDA the elapsed time between an event on
the caller's stream at the call and the done event (compressed paths: after the last decode, on the
side stream; native paths: on the stream that waited for the native work), read lazily by
:mod:`ccoll.stats` so nothing synchronises on the hot path. Async calls record when ``wait()``
completes, under the stats dimension in effect at the call.
"""
from __future__ import annotations

import threading
from time import perf_counter
from typing import Any, Callable

import torch

from .. import streams
from ..codecs import Codec, get_codec
from ..defaults import DEFAULT_MIN_BYTES
from ..errors import PolicyError, TransportError
from ..log import warn_once
from ..stats import current_dimension, record as record_stats
from ..transports import Handle, Transport

#: reduce ops a codec may serve (MAX/MIN/PRODUCT of decoded values would not be the op of the inputs)
REDUCING_OPS = ("sum", "avg")


class _CodecCache:
    """Spec string -> Codec, built once per process: codecs are immutable and building one may load
    kernels, so every call with the same spec shares one object."""

    def __init__(self) -> None:
        self.by_spec: dict[str, Codec] = {}
        self.lock = threading.Lock()

    def get(self, spec: str) -> Codec:
        c = self.by_spec.get(spec)  # one dict read is atomic; the lock orders only the building of a codec
        if c is None:
            c = get_codec(spec)
            with self.lock:
                c = self.by_spec.setdefault(spec, c)
        return c


_codecs = _CodecCache()


def as_codec(codec: Any) -> Codec | None:
    """``codec=`` as the collectives take it (a spec string, a Codec, or None) -> a Codec or None; the
    only place specs become codec objects."""
    if codec is None or isinstance(codec, Codec):
        return codec
    if not isinstance(codec, str):
        raise PolicyError(f"codec must be a spec string, a Codec or None, got {type(codec).__name__}")
    return _codecs.get(codec)


def decide(codec: Any, tensor: "torch.Tensor | tuple", *, op: str | None = None, min_bytes: int | None = None,
           transport: Transport | None = None) -> Codec | None:
    """The codec this call compresses with, or None for the exact native call: the passthrough rules,
    in one place. ``tensor`` is the tensor this rank contributes or a ``(numel or shape, dtype)`` pair
    (a policy deciding before there is a group); ``transport`` None skips the group rules.

    Exact (None) for: no codec; world size 1 (nothing travels, so nothing is lossy); a caller outside
    the group; sparse and other non-strided layouts, quantized and complex tensors (codecs take dense
    real floats; a lossy encode of their storage would be wrong, not approximate); integer and bool
    tensors; empty tensors; reduce ops other than sum/avg; fewer bytes than ``min_bytes`` (None:
    :data:`~ccoll.defaults.DEFAULT_MIN_BYTES`; 0 compresses everything); dtypes the codec does not take
    (logged once). Depends on (codec, shape, dtype, layout, op, min_bytes, world size) only, so both
    sides of a send/recv and every rank of a collective reach the same answer."""
    if codec is None:
        return None
    c = codec if isinstance(codec, Codec) else as_codec(codec)
    if transport is not None and (transport.world_size <= 1 or transport.rank < 0):
        return None
    if isinstance(tensor, torch.Tensor):
        if tensor.layout is not torch.strided or tensor.is_quantized:
            return None
        numel, dtype = tensor.numel(), tensor.dtype
    else:
        shape, dtype = tensor
        numel = shape if isinstance(shape, int) else _prod(shape)
    if not dtype.is_floating_point or dtype.is_complex or numel == 0:
        return None
    if op is not None and op not in REDUCING_OPS:
        return None
    threshold = DEFAULT_MIN_BYTES if min_bytes is None else int(min_bytes)
    if numel * dtype.itemsize < threshold:
        return None
    if dtype not in c.dtypes:
        warn_once(f"dtype-{c.spec}-{dtype}", "ccoll: codec %s does not take %s; sending those tensors uncompressed", c.spec, dtype)
        return None
    return c


def _prod(shape: Any) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


# --- validation and buffers ------------------------------------------------------------------------

def check_tensor(t: Any, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TransportError(f"{what} expects a torch.Tensor, got {type(t).__name__}")


def nbytes(t: torch.Tensor) -> int:
    """Bytes this tensor stands for in the stats (a sparse tensor: its stored values and indices)."""
    if t.layout is torch.sparse_coo:
        return t._values().numel() * t.element_size() + t._indices().numel() * 8
    return t.numel() * t.element_size()


def contig(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the layout transports move (non-strided layouts go to the native call as they are)."""
    return t if t.layout is not torch.strided or t.is_contiguous() else t.contiguous()


def copy_back(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy ``src`` (a contiguous buffer of ``dst``'s numel) into ``dst``, unless it is ``dst``'s own
    memory (a view of a contiguous ``dst``), where the copy would move bytes onto themselves."""
    if src is dst or (dst.is_contiguous() and src.data_ptr() == dst.data_ptr() and src.numel() == dst.numel()):
        return
    dst.copy_(src.view(dst.shape) if src.is_contiguous() else src.reshape(dst.shape))


def plain(t: torch.Tensor) -> torch.Tensor:
    """``t`` without autograd history: ``t`` itself when it has none (gradients, buffers, activations under
    no_grad: what collectives see), else ``t.detach()``. Either way the same memory, written in place
    without autograd seeing it; a detach is a torch op (~0.4 us) and the router and each algorithm took one."""
    return t.detach() if t.requires_grad else t


def flat_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a 1-D tensor: ``t`` itself when it is 1-D already (a gradient bucket, a flat shard), else
    ``t.reshape(-1)``. Why not always reshape: each view is a new tensor object (~1 us of host time), and a
    small compressed call made three of them of the same 1-D memory."""
    return t if t.dim() == 1 else t.reshape(-1)


def output_flat(t: torch.Tensor) -> torch.Tensor:
    """Where to decode into: ``t``'s own memory when contiguous, else a scratch buffer copied back."""
    return flat_view(t) if t.is_contiguous() else torch.empty(t.numel(), dtype=t.dtype, device=t.device)


def rows(p: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A [p, nbytes] payload buffer (what the batched codec calls and the transports share)."""
    return torch.empty(p, nbytes, dtype=torch.uint8, device=device)


def reduce_into(c: Codec, payloads: torch.Tensor, dst: torch.Tensor, p: int, opn: str) -> None:
    """Decode-and-sum the rows of ``payloads`` into ``dst`` (a contiguous 1-D tensor or slice): straight into it
    when it is fp32, else through an fp32 accumulator rounded once into it; divided by ``p`` for avg. The reduce
    step of the all_reduce / reduce_scatter algorithms."""
    acc = dst if dst.dtype == torch.float32 else torch.empty(dst.numel(), dtype=torch.float32, device=dst.device)
    c.decode_sum(payloads, dst.numel(), dst.dtype, out=acc)
    if opn == "avg":
        acc.div_(p)
    if acc is not dst:
        dst.copy_(acc)


def feedback_buffer(ef: Any, rkey: Any, numel: int, dtype: torch.dtype, device: Any, c: Codec,
                    stream: Any = None) -> torch.Tensor | None:
    """The residual buffer for one lossy encode (``rkey`` from :func:`ccoll.feedback.residual_key`),
    or None without error feedback. ``stream`` (the call's :class:`ccoll.streams.Call`) keeps it alive
    for the side stream that writes it: a residual may have been allocated on another stream (restored
    from a checkpoint, or a packed view made by ``ccoll.ddp``) and may be dropped (reset, a new layout)
    before that stream is ordered after the write."""
    buf = None if ef is None else ef.buffer(rkey, numel, dtype, device, c)
    if buf is not None and stream is not None:
        stream.keep(buf)
    return buf


def finish(async_op: bool, works: list, then: Callable[[], Any], outputs: list,
           join: Callable[[], None] | None = None) -> Handle | None:
    """Sync: wait for ``works``, run ``then`` now. Async: a handle that does both in ``wait()`` and
    whose future's value is ``outputs`` (torch's convention: the result tensors); ``join`` orders the
    stream of every later ``wait()`` after the results (:meth:`ccoll.streams.Call.join`)."""
    if async_op:
        return Handle(works, then, outputs, join=join)  # it drops the None entries itself
    for w in works:
        if w is not None:
            w.wait()
    then()
    return None


# --- one call's stream, stats and handle ----------------------------------------------------------

class Run:
    """One collective call after validation: its stats op and dimension, its start time and its
    stream ordering (:mod:`ccoll.streams`; no-ops on CPU). Every path ends through :meth:`native` or
    :meth:`compressed`, so seconds, streams and handles behave alike on all of them."""

    __slots__ = ("op", "t0", "dim", "stream", "phases", "quiet")

    def __init__(self, op: str, device: torch.device, phases: list | None = None, quiet: bool = False) -> None:
        self.op = op
        self.t0 = perf_counter()
        self.dim = current_dimension()  # an async wait() may run under another dimension
        self.stream = streams.begin(device)
        self.phases = phases if phases is not None else []  # wire bytes of inner runs
        self.quiet = quiet

    def inner(self, device: torch.device) -> "Run":
        """A run for one phase of this call (a hierarchical call's inter-node exchange): it orders its
        own codec work like any call but records no stats row; its wire bytes add to :meth:`wire`."""
        return Run(self.op, device, self.phases, quiet=True)

    def wire(self) -> int:
        """Wire bytes the inner runs have recorded so far."""
        return sum(self.phases)

    def record(self, codec: str, raw: int, wire: int) -> None:
        if self.quiet:
            self.phases.append(wire)
            return
        seconds = perf_counter() - self.t0 if self.stream is streams.NULL else self.stream.seconds(self.t0)
        record_stats(self.op, codec, raw, wire, seconds, dim=self.dim)

    def native(self, async_op: bool, work: Any, done: Callable[[], None] | None, raw: int,
               outputs: list) -> Handle | None:
        """End of an exact call: ``work`` is the native request, ``done`` copies results back."""
        def then() -> None:
            if done is not None:
                done()
            self.stream.mark_done()
            self.record("native", raw, raw)

        return finish(async_op, [work], then, outputs, self.stream.join)

    def compressed(self, async_op: bool, works: list, body: Callable[[], None], codec: Codec, raw: int,
                   wire: "int | Callable[[], int]", outputs: list, *, name: str | None = None) -> Handle | None:
        """End of a compressed call: ``body`` (decoding, copying back) runs with the side stream
        current, then the done event, then the stream current at completion (the caller's) waits for
        it, then stats. ``works``: what a handle waits for before ``body`` (sync calls wait for them
        first too); ``wire`` may be a callable when the bytes are only known at completion."""
        if not async_op:  # finish()'s sync branch, inline: no closure and two frames less per sync call
            for w in works:
                if w is not None:
                    w.wait()
            self._complete(body, codec, raw, wire, name)
            return None
        return finish(True, works, lambda: self._complete(body, codec, raw, wire, name), outputs, self.stream.join)

    def _complete(self, body: Callable[[], None], codec: Codec, raw: int, wire: "int | Callable[[], int]",
                  name: str | None) -> None:
        """:meth:`compressed`'s completion, once its exchanges are done."""
        side = self.stream
        if side is streams.NULL:  # no device streams (CPU): nothing to order
            body()
        else:
            with side.on_side():
                body()
                side.finish()
            side.join()
        self.record(name or codec.spec, raw, wire() if callable(wire) else wire)


__all__ = ["REDUCING_OPS", "Run", "as_codec", "check_tensor", "contig", "copy_back", "decide", "feedback_buffer",
           "finish", "flat_view", "nbytes", "output_flat", "plain", "reduce_into", "rows"]
