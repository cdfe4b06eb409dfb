"""Async handles of compressed calls, shaped like torch's ``Work``."""
from __future__ import annotations

from typing import Any

import torch

from ..stats import dimension


class DimHandle:
    """Async handle whose ``wait()`` (where ccoll decodes and records stats) runs under the call's
    dimension, so async traffic is attributed like sync traffic."""

    __slots__ = ("_handle", "_dim", "_outputs")

    def __init__(self, handle: Any, dim: str, outputs: list | None = None):
        self._handle = handle
        self._dim = dim
        self._outputs = outputs

    def wait(self, timeout: Any = None) -> bool:
        with dimension(self._dim):
            return self._handle.wait(timeout)

    def result(self) -> list:
        """Wait, then return the output tensors, as torch's ``Work.result()`` does (ccoll's own handles
        return what their completion returned instead)."""
        self.wait()
        return self._handle.value() if self._outputs is None else self._outputs

    def is_completed(self) -> bool:
        return self._handle.is_completed()

    def get_future(self) -> "torch.futures.Future":
        return self._handle.get_future()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


def async_result(h: Any, dim: str, outputs: list | None = None) -> Any:
    return None if h is None else DimHandle(h, dim, outputs)
