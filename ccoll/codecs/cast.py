"""Exact and cast codecs: "none" (raw bytes), "bf16" and "fp16" (round-to-nearest-even casts).

They go through the same collective path as the lossy codecs, so the baseline measures the same code.
Their batched methods are single vectorised torch ops on the caller's buffers: a cast (or, for "none",
a copy) straight into the send rows, a cast straight out of the received rows into the output, and a
decode-and-sum that adds the rows in row order (the reference semantics) in one op.
"""
from __future__ import annotations

import torch

from .base import CODECS, Codec, _absmax
from .rowsum import add_rows_


class _CastCodec(Codec):
    """Payload = the input cast to ``wire_dtype``, as raw bytes (little-endian, as the device stores it)."""

    wire_dtype: torch.dtype
    float_bits_on_wire = True

    def encoded_nbytes(self, numel: int, dtype: torch.dtype) -> int:
        self.check_dtype(dtype)
        return numel * self._wire(dtype).itemsize

    def _wire(self, dtype: torch.dtype) -> torch.dtype:
        return self.wire_dtype

    def exact_for(self, dtype: torch.dtype) -> bool:
        return self._wire(dtype) == dtype

    def relative_error_bound(self, dtype: torch.dtype = torch.float32) -> float | None:
        """Round to nearest into a format with ``t`` significant bits: |error| <= 2^-t |x| for values in
        its normal range (half an ulp; bf16 t = 8, fp16 t = 11). The subnormal floor and overflow are in
        ``error_bound``."""
        if self.exact_for(dtype):
            return 0.0
        return torch.finfo(self._wire(dtype)).eps / 2

    def error_bound(self, x: torch.Tensor) -> float:
        """``relative_error_bound`` times absmax, at least half the wire format's smallest subnormal step
        (values below its normal range); inf when absmax reaches the wire format's overflow threshold
        (fp16: |x| >= 65520 rounds to Inf; bf16 only from fp64 input above FLT_MAX)."""
        rel = self.relative_error_bound(x.dtype)
        if not rel:
            return 0.0
        info, a = torch.finfo(self._wire(x.dtype)), _absmax(x)
        if a >= info.max * (1 + info.eps / 4):  # at or past (a hair below) the round-to-Inf threshold
            return float("inf")
        return max(rel * a, info.smallest_normal * info.eps / 2)

    def _encode(self, flat: torch.Tensor) -> torch.Tensor:
        return flat.to(self._wire(flat.dtype)).view(torch.uint8)

    def _decode(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return payload.view(self._wire(dtype)).to(dtype)

    # --- batched: one op each, straight into the caller's buffers ------------------------------------
    def _wire_view(self, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        """``rows`` ([rows, nbytes] uint8, contiguous) as a 1-D tensor of wire values, or None when its
        storage offset is not a multiple of the wire item size (then the generic path copies)."""
        wire = self._wire(dtype)
        if rows.storage_offset() % wire.itemsize:
            return None
        return rows.view(-1).view(wire)

    def _encode_rows_cast(self, src, out, row_numel, feedback, salt) -> None:
        wire = self._wire_view(out, src.dtype)
        if wire is None:
            self._encode_rows_generic(src, out, row_numel, feedback, salt)
            return
        n = src.numel()
        if n < wire.numel():
            wire[n:].zero_()
        if feedback is None:
            wire[:n].copy_(src)  # the cast (or, for "none", the copy) is the encode
            return
        fb = feedback[:n]
        comp = src.to(fb.dtype) + fb  # what this call must send: input plus what earlier calls dropped
        wire[:n].copy_(comp if src.dtype == fb.dtype else comp.to(src.dtype))
        # residual = comp - decode(payload); the wire values are exact in src.dtype and in the feedback
        # dtype (never narrower), so decoding straight to the feedback dtype is the receivers' decode
        comp.sub_(wire[:n].to(fb.dtype))
        fb.copy_(comp.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0))
        if n < feedback.numel():
            feedback[n:].zero_()

    def _decode_rows_cast(self, payloads, out, row_numel) -> None:
        wire = self._wire_view(payloads, out.dtype)
        if wire is None:
            self._decode_rows_generic(payloads, out, row_numel)
            return
        out.copy_(wire[:out.numel()])

    def _decode_sum_cast(self, payloads, numel, dtype, out) -> None:
        """Row-order fp32 sum (the reference semantics: every decode is exact in fp32 after rounding to
        ``dtype``, since the wire type is never wider than ``dtype``'s values need). CPU: ``rowsum.add_rows_``
        adds the rows into one row in row order. CUDA: an outer-dimension ``cumsum`` scans
        each column sequentially in fp32; its last row is the row-order sum (one op, p x numel scratch)."""
        wire = self._wire_view(payloads, dtype)
        if wire is None:
            out.zero_()
            for row in payloads:
                out += self.decode(row, numel, dtype).to(torch.float32)
            return
        rows = wire.view(payloads.shape[0], numel).to(torch.float32)  # == decode(row).to(fp32), see above
        if rows.device.type == "cuda":
            out.copy_(torch.cumsum(rows, 0)[-1])
            return
        out.zero_()
        add_rows_(out.view(1, numel), rows)

    # a cast is the same torch op on every device: one implementation serves all backends
    _encode_torch = _encode_cupy = _encode_emulated = _encode
    _decode_torch = _decode_cupy = _decode_emulated = _decode
    _encode_rows_torch = _encode_rows_cupy = _encode_rows_emulated = _encode_rows_cast
    _decode_rows_torch = _decode_rows_cupy = _decode_rows_emulated = _decode_rows_cast
    _decode_sum_torch = _decode_sum_cupy = _decode_sum_emulated = _decode_sum_cast


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
    EXAMPLE_SPECS = ("bf16",)
    wire_dtype = torch.bfloat16
    dtypes = (torch.float32, torch.bfloat16, torch.float64)


@CODECS.register("fp16")
class FP16Codec(_CastCodec):
    """float16 cast: 11 significant bits, but |x| > 65504 becomes +-Inf (as torch's fp16 comm hook does);
    use bf16 for data with a large dynamic range. Exact for fp16 input."""

    name = "fp16"
    EXAMPLE_SPECS = ("fp16",)
    wire_dtype = torch.float16
    dtypes = (torch.float32, torch.float16, torch.float64)
