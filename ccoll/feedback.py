"""Error feedback: what a lossy encode dropped this step is added to the next step's input.

For a tensor that is reduced again and again (data-parallel gradients), the compression error of one
step is no longer lost but delayed: over many steps the time-averaged result converges to the
time-averaged exact result (EF-SGD, 1-bit Adam). The state lives here, not in the codec, so codecs
stay pure functions and one codec object can serve many tensors.

Keys: the caller names the logical tensor (``key=``); the collectives derive one residual per lossy
encode they do for it, named by :func:`residual_key` (key, phase, segment) so that code that lays
residuals out itself (``ccoll.ddp``'s packed buckets) reads them with :func:`parse_residual_key`
instead of knowing the tuple shape. A residual
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


#: phases of a collective that encode lossily: the p chunks a rank sends in a reduce-scatter, the
#: reduced chunk it owns in the all-gather, the node's partial sum in a hierarchical exchange, a whole
#: segment of a one-exchange all_reduce (:mod:`ccoll.collectives.small`)
PHASES = ("rs", "ag", "node", "whole")


def residual_key(key: Hashable, phase: str, segment: int = 0) -> tuple:
    """The residual key of one lossy encode of logical tensor ``key``: ``(key, phase)`` for the first
    segment (an unsegmented tensor keeps that short key), ``(key, phase, segment)`` after it. The
    logical key stays first, so :meth:`ErrorFeedback.reset` (key) drops every segment's residuals."""
    return (key, phase) if segment == 0 else (key, phase, segment)


def parse_residual_key(rk: Any) -> tuple[Hashable, str, int]:
    """``(key, phase, segment)`` of a key made by :func:`residual_key`; ValueError for anything else."""
    if isinstance(rk, tuple) and len(rk) in (2, 3) and rk[1] in PHASES:
        segment = rk[2] if len(rk) == 3 else 0
        if isinstance(segment, int) and segment >= 0:
            return rk[0], rk[1], segment
    raise ValueError(f"not an error-feedback residual key: {rk!r}")


#: (numel, dtype, device, codec spec) -> :meth:`ErrorFeedback._signature` (process-wide: pure values)
_signatures: dict[tuple, tuple] = {}


class ErrorFeedback:
    """Per-key residual buffers for repeated lossy encodes of the same logical tensors.

    Collectives ask for a key's buffer (:meth:`buffer`) and hand it to ``Codec.encode_rows(...,
    feedback=buf)``, which compensates, encodes and stores the new residual in one pass. State is
    checkpointable (:meth:`state_dict` / :meth:`load_state_dict`): a resumed run continues with the
    residuals an uninterrupted run would have had, so it stays bit-identical.
    """

    def __init__(self) -> None:
        # key -> (signature the residual was made for, residual)
        self._residuals: dict[Hashable, tuple[tuple, torch.Tensor]] = {}
        self._lock = threading.Lock()
        #: bumped whenever residuals are dropped or replaced wholesale (:meth:`reset`, :meth:`load_state_dict`):
        #: a caller that keeps views placed by :meth:`place` re-places them when it changes
        self.generation = 0

    @staticmethod
    def _signature(numel: int, dtype: torch.dtype, device: torch.device, codec: Codec) -> tuple:
        """What a residual was made for, in the plain values :meth:`state_dict` saves. Memoised: the
        string forms of dtype and device cost ~1.5 us of every error-feedback encode, for a handful of
        distinct layouts per run."""
        spec = codec.spec
        made = _signatures.get((numel, dtype, device, spec))
        if made is None:
            made = (int(numel), str(dtype), str(torch.device(device)), spec)
            if len(_signatures) < 4096:
                _signatures[(numel, dtype, device, spec)] = made
        return made

    def buffer(self, key: Hashable, numel: int, dtype: torch.dtype, device: Any, codec: Codec) -> torch.Tensor:
        """The residual buffer of ``key`` for ``numel`` inputs of ``dtype`` encoded by ``codec``
        (``codec.feedback_dtype(dtype)``, contiguous, on ``device``): the stored one, or zeros when
        there is none or it was made for another layout (numel, dtype, device or codec)."""
        spec = codec.spec
        signature = _signatures.get((numel, dtype, device, spec)) or self._signature(numel, dtype, device, codec)
        with self._lock:
            entry = self._residuals.get(key)
            if entry is not None and entry[0] == signature:
                return entry[1]
            buf = torch.zeros(int(numel), dtype=codec.feedback_dtype(dtype), device=device)
            self._residuals[key] = (signature, buf)
            return buf

    def place(self, key: Hashable, out: torch.Tensor, dtype: torch.dtype, codec: Codec) -> None:
        """Keep ``key``'s residual in ``out`` from now on: ``out`` (``codec.feedback_dtype(dtype)``, 1-D,
        the caller's, typically one piece of a larger buffer) receives the stored residual, or zeros when
        none was made for its numel, dtype, device and codec. Why: a caller that lays many residuals out
        in one buffer (``ccoll.ddp``: one per parameter of a packed bucket) hands that buffer to one
        encode, with no assembly before the call and no scatter after it, while each residual keeps its
        own key for checkpoints."""
        signature = self._signature(out.numel(), dtype, out.device, codec)
        with self._lock:
            entry = self._residuals.get(key)
            if entry is not None and entry[0] == signature:
                out.copy_(entry[1])
            else:
                out.zero_()
            self._residuals[key] = (signature, out)

    def residual(self, key: Hashable) -> torch.Tensor | None:
        """The current residual for ``key`` (1-D), or None."""
        with self._lock:
            entry = self._residuals.get(key)
        return None if entry is None else entry[1]

    def reset(self, key: Any = None) -> None:
        """Forget one logical tensor's residuals (every derived key whose first element is ``key``),
        or all of them."""
        with self._lock:
            self.generation += 1
            if key is None:
                self._residuals.clear()
                return
            for k in [k for k in self._residuals if k == key or (isinstance(k, tuple) and k and k[0] == key)]:
                del self._residuals[k]

    def state_dict(self) -> dict:
        """``{"residuals": [(key, signature, tensor on CPU), ...]}``: plain data torch.save can write
        (keys are whatever the caller used: strings, ints, tuples of them)."""
        with self._lock:
            return {"residuals": [(k, sig, t.detach().cpu().clone()) for k, (sig, t) in self._residuals.items()]}

    def load_state_dict(self, state: dict) -> None:
        """Replace every residual by ``state``'s (made by :meth:`state_dict`), on their recorded devices."""
        residuals = {}
        for k, sig, t in state["residuals"]:
            residuals[tuplify(k)] = (tuple(sig), t.to(torch.device(sig[2])).contiguous())
        with self._lock:
            self._residuals = residuals
            self.generation += 1

    def keys(self) -> list:
        with self._lock:
            return list(self._residuals)

    def __len__(self) -> int:
        with self._lock:
            return len(self._residuals)

    def __repr__(self) -> str:
        return f"<ErrorFeedback {len(self)} residuals>"


def tuplify(k: Any) -> Any:
    """Keys come back from serialisers (JSON, some checkpoint formats) with tuples turned into lists."""
    return tuple(tuplify(x) for x in k) if isinstance(k, list) else k


_tuplify = tuplify  # the name ccoll/patch.py imports until the patch package is merged (then remove)
