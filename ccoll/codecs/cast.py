"""Exact and cast codecs: "none" (raw bytes), "bf16" and "fp16" (round-to-nearest-even casts).

They go through the same collective path as the lossy codecs, so the baseline measures the same code.
"""
from __future__ import annotations

import torch

from .base import CODECS, Codec


class _CastCodec(Codec):
    """Payload = the input cast to ``wire_dtype``, as raw bytes (little-endian, as the device stores it)."""

    wire_dtype: torch.dtype

    def encoded_nbytes(self, numel: int, dtype: torch.dtype) -> int:
        self.check_dtype(dtype)
        return numel * self._wire(dtype).itemsize

    def _wire(self, dtype: torch.dtype) -> torch.dtype:
        return self.wire_dtype

    def exact_for(self, dtype: torch.dtype) -> bool:
        return self._wire(dtype) == dtype

    def _encode(self, flat: torch.Tensor) -> torch.Tensor:
        return flat.to(self._wire(flat.dtype)).view(torch.uint8)

    def _decode(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return payload.view(self._wire(dtype)).to(dtype)

    # a cast is the same torch op on every device: one implementation serves all backends
    _encode_torch = _encode_cupy = _encode_emulated = _encode
    _decode_torch = _decode_cupy = _decode_emulated = _decode


@CODECS.register("none")
class NoneCodec(_CastCodec):
    """Uncompressed passthrough: the baseline through the compressed code path."""

    name = "none"
    lossy = False
    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.float64)

    def _wire(self, dtype: torch.dtype) -> torch.dtype:
        return dtype


@CODECS.register("bf16")
class BF16Codec(_CastCodec):
    """bfloat16 cast: fp32's exponent range (no overflow), 8 mantissa bits; exact for bf16 input."""

    name = "bf16"
    wire_dtype = torch.bfloat16
    dtypes = (torch.float32, torch.bfloat16, torch.float64)


@CODECS.register("fp16")
class FP16Codec(_CastCodec):
    """float16 cast: 11 significant bits, but |x| > 65504 becomes +-Inf (as torch's fp16 comm hook does);
    use bf16 for data with a large dynamic range. Exact for fp16 input."""

    name = "fp16"
    wire_dtype = torch.float16
    dtypes = (torch.float32, torch.float16, torch.float64)
