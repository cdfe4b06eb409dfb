"""Error feedback: what a lossy encode dropped this step is added to the next step's input.

For a tensor that is reduced again and again (data-parallel gradients), the compression error of one
step is no longer lost but delayed: over many steps the time-averaged result converges to the
time-averaged exact result (EF-SGD, 1-bit Adam). The state lives here, not in the codec, so codecs
stay pure functions and one codec object can serve many tensors.

Keys: the caller names the logical tensor (``key=``); the collectives derive one residual per encode
they do for it (one per reduce-scatter chunk, one for the all-gather of the reduced chunk). A residual
is dropped and restarted from zero when the tensor it belongs to changes numel, dtype, device or codec
(a different world size changes the chunk sizes, so it resets too): a residual computed for another
layout would add noise, not correct an error. Non-finite residual entries (an overflowing step, which
training loops skip) are zeroed so one bad step cannot poison every later one.
"""
from __future__ import annotations

import threading
from typing import Any, Hashable

import torch

from .codecs import Codec


class ErrorFeedback:
    """Per-key residuals (fp32, on the tensor's device) for repeated lossy encodes of the same tensors."""

    def __init__(self) -> None:
        # key -> (signature the residual was made for, residual)
        self._residuals: dict[Hashable, tuple[tuple, torch.Tensor]] = {}
        self._lock = threading.Lock()

    def encode(self, key: Hashable, x: torch.Tensor, codec: Codec, *, sender: Codec | None = None) -> torch.Tensor:
        """``payload = codec.encode(x + residual[key])``; ``residual[key] = (x + residual) - decode(payload)``.

        The payload has the size and dtype layout of a plain ``codec.encode(x)``, so receivers need
        not know whether the sender compensates. ``sender``: the instance that actually encodes when it
        differs from ``codec`` only in ways decoding ignores (the collectives pass ``codec`` with a
        per-call stochastic-rounding seed); the residual stays keyed to ``codec``."""
        signature = (x.numel(), x.dtype, x.device, codec.spec)
        enc = codec if sender is None else sender
        with self._lock:
            entry = self._residuals.get(key)
        compensated = x.reshape(-1).to(torch.float32, copy=True)
        if entry is not None and entry[0] == signature:
            compensated += entry[1]
        sent = compensated if x.dtype == torch.float32 else compensated.to(x.dtype)
        payload = enc.encode(sent)
        # not in place: for exact codecs the payload may alias ``compensated``
        residual = compensated - codec.decode(payload, x.numel(), x.dtype).to(torch.float32)
        residual = torch.where(torch.isfinite(residual), residual, torch.zeros((), device=residual.device))
        with self._lock:
            self._residuals[key] = (signature, residual)
        return payload

    def residual(self, key: Hashable) -> torch.Tensor | None:
        """The current residual for ``key`` (fp32, 1-D), or None."""
        with self._lock:
            entry = self._residuals.get(key)
        return None if entry is None else entry[1]

    def reset(self, key: Any = None) -> None:
        """Forget one logical tensor's residuals (every derived key whose first element is ``key``),
        or all of them."""
        with self._lock:
            if key is None:
                self._residuals.clear()
                return
            for k in [k for k in self._residuals if k == key or (isinstance(k, tuple) and k and k[0] == key)]:
                del self._residuals[k]

    def keys(self) -> list:
        with self._lock:
            return list(self._residuals)

    def __len__(self) -> int:
        with self._lock:
            return len(self._residuals)

    def __repr__(self) -> str:
        return f"<ErrorFeedback {len(self)} residuals>"
