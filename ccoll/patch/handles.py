"""Async handles of compressed calls: a ``torch.distributed.Work`` (a Python subclass, as torch allows
for ``Work`` through its pybind trampoline), so ``isinstance(h, dist.Work)`` holds and code that checks
for it keeps working; every method torch's ``Work`` has answers from ccoll's handle, none falls through
to the empty C++ base."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..stats import dimension


class DimHandle(dist.Work):
    """Async handle whose ``wait()`` (where ccoll decodes and records stats) runs under the call's
    dimension, so async traffic is attributed like sync traffic."""

    __slots__ = ("_handle", "_dim", "_outputs", "_event")

    def __init__(self, handle: Any, dim: str, outputs: list | None = None, event: Any = None):
        super().__init__()  # the C++ Work under the subclass (pybind requires it)
        self._handle = handle
        self._dim = dim
        self._outputs = outputs
        self._event = event  # the backend's profiler event of the call (ccoll.patch.events), ended when done

    def wait(self, timeout: Any = None) -> bool:
        with dimension(self._dim):
            done = self._handle.wait(timeout)
        if self._event is not None:
            self._event.end()
        return done

    def result(self) -> list:
        """Wait, then return the output tensors, as torch's ``Work.result()`` does (ccoll's own handles
        return what their completion returned instead)."""
        self.wait()
        return self._handle.value() if self._outputs is None else self._outputs

    def is_completed(self) -> bool:
        return self._handle.is_completed()

    def get_future(self) -> "torch.futures.Future":
        """A future of :meth:`result`'s tensors, as torch's ``Work.get_future()`` (an all_gather_into_tensor's:
        the output, one view per rank)."""
        fut = self._handle.get_future()
        if self._outputs is None:
            return fut
        outputs = self._outputs
        return fut.then(lambda _: outputs)

    def is_success(self) -> bool:
        """torch's (deprecated) name: completed without an error."""
        return self.is_completed()

    def exception(self) -> Any:
        return None  # a failed wait() raises; there is no stored exception to hand out

    def synchronize(self) -> None:
        self.wait()

    def block_current_stream(self) -> None:
        self.wait()  # ccoll's wait orders the current stream after the results (never blocks the host longer)

    def get_future_result(self) -> "torch.futures.Future":
        """torch's: a future of the ``WorkResult`` code (an int), SUCCESS once the call completed."""
        success = int(torch._C._distributed_c10d.WorkResult.SUCCESS.value)
        return self.get_future().then(lambda _: success)

    def source_rank(self) -> int:
        return self._handle.source_rank()

    def _source_rank(self) -> int:
        return self._handle._source_rank()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


def async_result(h: Any, dim: str, outputs: list | None = None, event: Any = None) -> Any:
    return None if h is None else DimHandle(h, dim, outputs, event)
