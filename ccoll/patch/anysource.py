"""``recv(t, src=None)`` / ``irecv(t, src=None)`` under a compressing policy: receive from any source.

The receiver decides exactly as the sender did (the decision depends on dim, op, shape, dtype, step and
policy, never on the peer), so when the sender compresses, the receiver takes the payload (its size is
fixed by the codec, shape and dtype) from whichever rank sends first, then decodes it. Receiving the
payload as if it were data would hand the user encoded bytes: gloo accepts a shorter message silently.

Variable-size codecs send a size first and then the payload, two messages an any-source receive cannot
pair up: refused with a :class:`~ccoll.errors.TransportError` rather than received wrong.

No stream ordering here, unlike every other compressed call (:mod:`ccoll.streams`): a receive from any
source exists only on CPU tensors in practice (NCCL has no any-source receive; gloo has no send/recv of
CUDA tensors), so there is no device stream for it to order. The happens-before model therefore does
not run it (tests/dist/test_streams_hb.py).
"""
from __future__ import annotations

import functools
import time
from typing import Any

import torch
import torch.distributed as dist

from ..errors import TransportError
from ..stats import record


def _torch(name: str):
    fn = getattr(dist, name)
    return getattr(fn, "__ccoll_original__", fn)  # the patch's wrappers carry torch's function


def _sent_compressed(codec: Any, t: torch.Tensor) -> bool:
    """Whether the sender's ``ccoll.collectives.isend`` (``min_bytes=0``) encodes ``t``: the same
    pass-through rules it applies, from what both sides know alike."""
    return t.is_floating_point() and t.numel() > 0 and t.dtype in codec.dtypes


def irecv(tensor: torch.Tensor, group: Any, codec: Any, dim: str, tag: int = 0):
    """Receive into ``tensor`` from any rank of ``group``; returns (handle, sender) where ``sender()``
    (after the handle's wait) is the sender's global rank. The handle answers ``_source_rank()`` as
    torch's any-source ``Work`` does: the sender's rank in ``group``."""
    if codec.variable_size:
        raise TransportError(f"ccoll: recv(src=None) with the variable-size codec {codec.spec}: the sender "
                             "must be known; pass src=")
    t0 = time.perf_counter()
    t = tensor.detach()
    raw = t.numel() * t.element_size()
    pg = group if group is not None else dist.group.WORLD
    if not _sent_compressed(codec, t):
        work = _issue(tensor, group, tag)

        def then_native() -> None:
            record("recv", "native", raw, raw, time.perf_counter() - t0, dim=dim)
    else:
        nbytes = codec.encoded_nbytes(t.numel(), t.dtype)
        payload = torch.empty(nbytes, dtype=torch.uint8, device=t.device)
        work = _issue(payload, group, tag)  # while profiling: the caller's event only (ccoll.patch.events)

        def then_native() -> None:
            codec.decode(payload, t.numel(), t.dtype, out=t)
            record("recv", codec.spec, raw, nbytes, time.perf_counter() - t0, dim=dim)

    def sender() -> int:
        return dist.get_global_rank(pg, work._source_rank())

    return _handle_class()(work, then_native, tensor), sender


def _issue(buf: torch.Tensor, group: Any, tag: int) -> Any:
    if torch.autograd._profiler_enabled():
        from ..collectives.phases import torch_events_off

        with torch_events_off():
            return _torch("irecv")(buf, None, group, tag)
    return _torch("irecv")(buf, None, group, tag)


@functools.lru_cache(maxsize=None)
def _handle_class() -> type:
    from ..transports import Handle

    class AnySourceHandle(Handle):
        """A receive from any source: torch's ``Work._source_rank()`` (the sender's rank in the group,
        after the wait) on top of the transports' handle."""

        __slots__ = ("_work",)

        def __init__(self, work: Any, then: Any, tensor: torch.Tensor) -> None:
            super().__init__([work], then, [tensor])
            self._work = work

        def _source_rank(self) -> int:
            self.wait()
            return self._work._source_rank()

        def source_rank(self) -> int:
            return self._source_rank()

    return AnySourceHandle

