"""ZFP fixed-rate codec ("zfp:rate=R[,dims=1|2]"), byte-identical with libzfp 1.0.1 on every backend.

Why ZFP: fixed-rate mode gives a payload size known from (numel, rate) alone, blocks are independent
(GPU-friendly, one thread per block), and its transform keeps more accuracy than plain quantization
on smooth data. The bitstream is specified in shared/ZFP_FIXED_RATE.md; libzfp (zfpy) is the oracle.

Layout: ``dims=1`` codes the flat tensor in blocks of 4 values. ``dims=2`` reads it as rows of 4 values
(nx = 4, ny = ceil(numel / 4)), so a 4x4 block holds 16 consecutive values and shares one exponent
between them (lower error at the same rate). For numel % 4 == 0 the payload equals zfpy on
``x.reshape(-1, 4)``; otherwise the last, partial row is first padded along x with zfp's own
partial-block rule ([a] -> aaaa, [a,b] -> abba, [a,b,c] -> abca), then zfp pads missing rows as usual.

Dtypes: float32 is coded as zfp float; bfloat16 and float16 are widened to float32 (exactly) and decoded
back to their dtype (round to nearest even); float64 is coded as zfp double.

Values libzfp does not define (shared/ZFP_FIXED_RATE.md section 5) get one definition on every backend:
- a block holding NaN or +-Inf is written as header bit 1 followed by a biased exponent of 0 (a code
  libzfp never emits) and zeros; it decodes to NaN for the whole block (the project rule, see base.py);
- a block whose largest magnitude is below 2^-98 (float) or 2^-962 (double), where libzfp's scale
  factor overflows and its output is garbage, is written as an all-zero block and decodes to +0.
Every other block is exactly libzfp's, including two libzfp behaviours worth knowing: -0.0 decodes as
+0.0 when its whole block is zero, and values within zfp's rounding error of the largest finite value
(e.g. |v| > ~3.3e38 for float32 at rate 8) can decode to +-Inf.

Rates: ``maxbits = floor(4^dims * rate + 0.5)`` bits per block. Rates with ``maxbits < 1 + EBITS``
(float32: rate < 2.125 for dims=1, < 0.53125 for dims=2; float64: < 2.875, < 0.71875) make libzfp's
coefficient budget underflow and write past its buffer; they are refused (PolicyError at construction
for float32, CodecError when a float64 tensor needs the higher minimum). Rates above 64 bits per value
(more than even float64's raw size) are refused as absurd.

Backends: "torch" runs libzfp through zfpy (single-threaded: zfpy holds the GIL) with vectorised
pre/post-processing; "emulated" runs kernels/zfp.cu built for the host (OpenMP over blocks, the GPU
kernel's own per-block code); "cupy" runs the same kernels on the caller's torch stream.
"""
from __future__ import annotations

import ctypes
import math

import numpy as np
import torch

from .. import kernels
from ..errors import CodecError, PolicyError
from .base import CODECS, Codec, Param

#: rates above this many bits per value are refused
MAX_RATE = 64.0


class _Scalar:
    """Per zfp scalar type: the constants the Python side needs (the kernel has the full traits)."""

    def __init__(self, dtype, zfpy_type_name, ebits, precision, suffix):
        self.dtype = dtype
        self.zfpy_type_name = zfpy_type_name
        self.ebits = ebits
        self.precision = precision
        self.suffix = suffix
        # blocks whose largest |v| is below this are "tiny": libzfp's scale 2^(P-2-emax) overflows for
        # them (their biased exponent is <= P - 4)
        self.tiny = 2.0 ** (precision - 3 - (2 ** (ebits - 1) - 1))

    def min_rate(self, dims: int) -> float:
        # smallest rate with maxbits = floor(4^dims * rate + 0.5) >= 1 + EBITS (the header alone)
        return (self.ebits + 0.5) / 4**dims


_FLOAT = _Scalar(torch.float32, "type_float", 8, 32, "f32")
_DOUBLE = _Scalar(torch.float64, "type_double", 11, 64, "f64")


def _scalar(dtype: torch.dtype) -> _Scalar:
    return _DOUBLE if dtype == torch.float64 else _FLOAT


@CODECS.register("zfp")
class ZfpCodec(Codec):
    """Fixed-rate ZFP; see the module docstring for layout, dtypes and the values libzfp leaves undefined."""

    name = "zfp"
    PARAMS = {
        "rate": Param(float, doc="bits per value (float32 dims=1: >= 2.125; dims=2: >= 0.53125)"),
        "dims": Param(int, 1, (1, 2), doc="1: blocks of 4 values; 2: rows of 4, blocks of 16 values"),
    }
    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.float64)

    def _validate(self) -> None:
        rate, dims = self.params["rate"], self.params["dims"]
        if not math.isfinite(rate) or rate <= 0 or rate > MAX_RATE:
            raise PolicyError(f"codec 'zfp': rate={rate} must be a number in (0, {MAX_RATE:g}] bits per value")
        if _maxbits(rate, dims) < 1 + _FLOAT.ebits:
            raise PolicyError(
                f"codec 'zfp': rate={rate} with dims={dims} is below the minimum {_FLOAT.min_rate(dims)} "
                f"(a block needs at least {1 + _FLOAT.ebits} bits; lower rates make libzfp overrun its buffer)"
            )

    @property
    def rate(self) -> float:
        return self.params["rate"]

    @property
    def dims(self) -> int:
        return self.params["dims"]

    @property
    def block_size(self) -> int:
        return 4**self.dims

    @property
    def align_numel(self) -> int:
        return self.block_size

    def maxbits(self, dtype: torch.dtype) -> int:
        """Bits per block for tensors of ``dtype``; CodecError where the rate is unsafe for its zfp type."""
        self.check_dtype(dtype)
        sc = _scalar(dtype)
        maxbits = _maxbits(self.rate, self.dims)
        if maxbits < 1 + sc.ebits:
            raise CodecError(
                f"codec {self.spec!r}: rate {self.rate} is below the minimum {sc.min_rate(self.dims)} for "
                f"{dtype} with dims={self.dims} (zfp {sc.zfpy_type_name[5:]} needs {1 + sc.ebits} bits per block)"
            )
        return maxbits

    def num_blocks(self, numel: int) -> int:
        return -(-numel // self.block_size)

    def encoded_nbytes(self, numel: int, dtype: torch.dtype) -> int:
        if numel < 0:
            raise CodecError(f"codec {self.spec!r}: numel must be >= 0, got {numel}")
        return 8 * (-(-self.num_blocks(numel) * self.maxbits(dtype) // 64))

    # --- torch backend: libzfp through zfpy ---------------------------------------------------------
    def _block_abs_max(self, x: torch.Tensor) -> torch.Tensor:
        """Per block, the largest |value| (NaN if the block holds a NaN: torch's amax propagates it)."""
        S = self.block_size
        full = (x.numel() // S) * S
        maxima = x[:full].view(-1, S).abs().amax(dim=1)
        if full < x.numel():
            maxima = torch.cat([maxima, x[full:].abs().amax().reshape(1)])
        return maxima

    def _encode_torch(self, flat: torch.Tensor) -> torch.Tensor:
        import zfpy

        sc = _scalar(flat.dtype)
        maxbits = self.maxbits(flat.dtype)
        x = flat.to(sc.dtype)
        n, S = x.numel(), self.block_size
        bmax = self._block_abs_max(x)
        nonfinite = ~torch.isfinite(bmax)
        clear = nonfinite | ((bmax < sc.tiny) & (bmax != 0))
        if bool(clear.any()):
            # never modify the caller's tensor; libzfp then codes these blocks as all-zero blocks
            x = x.clone() if x.data_ptr() == flat.data_ptr() else x
            full = (n // S) * S
            x[:full].view(-1, S)[clear[: full // S]] = 0
            if full < n and bool(clear[-1]):
                x[full:] = 0
        arr = x.numpy()
        if self.dims == 2:
            arr = _rows_of_four(arr)
        encoded = zfpy.compress_numpy(arr, rate=self.rate, write_header=False)
        out = np.frombuffer(bytearray(encoded), dtype=np.uint8)
        if out.size != self.encoded_nbytes(n, flat.dtype):
            raise CodecError(f"codec {self.spec!r}: libzfp wrote {out.size} bytes, expected {self.encoded_nbytes(n, flat.dtype)}")
        if bool(nonfinite.any()):
            # the block is all zero bits; its header flag alone turns it into the marker (exponent 0)
            start = np.nonzero(nonfinite.numpy())[0].astype(np.int64) * maxbits
            out[start >> 3] |= (1 << (start & 7)).astype(np.uint8)
        return torch.from_numpy(out)

    def _decode_torch(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        import zfpy

        sc = _scalar(dtype)
        maxbits = self.maxbits(dtype)
        buf = payload.numpy()
        if self.dims == 2:
            rows = -(-numel // 4)
            values = zfpy._decompress(buf, getattr(zfpy, sc.zfpy_type_name), [rows, 4], rate=self.rate)
            values = values.reshape(-1)[:numel]
        else:
            values = zfpy._decompress(buf, getattr(zfpy, sc.zfpy_type_name), [numel], rate=self.rate)
        out = torch.from_numpy(values)
        marked = _marker_blocks(buf, self.num_blocks(numel), maxbits, sc.ebits)
        if marked.any():
            S = self.block_size
            full = (numel // S) * S
            mark = torch.from_numpy(marked)
            out[:full].view(-1, S)[mark[: full // S]] = float("nan")
            if full < numel and bool(mark[-1]):
                out[full:] = float("nan")
        return out.to(dtype)

    # --- emulated backend: kernels/zfp.cu built for the host -----------------------------------------
    def _encode_emulated(self, flat: torch.Tensor) -> torch.Tensor:
        sc = _scalar(flat.dtype)
        maxbits = self.maxbits(flat.dtype)
        x = flat.to(sc.dtype)
        out = torch.zeros(self.encoded_nbytes(x.numel(), flat.dtype) // 8, dtype=torch.int64)
        fn = _host_fn(f"ccoll_host_zfp_encode_{sc.suffix}")
        fn(x.data_ptr(), x.numel(), self.dims, maxbits, out.data_ptr())
        return out.view(torch.uint8)

    def _decode_emulated(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        sc = _scalar(dtype)
        maxbits = self.maxbits(dtype)
        words = _aligned(payload)
        out = torch.empty(numel, dtype=sc.dtype)
        fn = _host_fn(f"ccoll_host_zfp_decode_{sc.suffix}")
        fn(words.data_ptr(), numel, self.dims, maxbits, out.data_ptr())
        return out.to(dtype)

    def _decode_sum_emulated(self, payloads: torch.Tensor, numel: int, dtype: torch.dtype, out: torch.Tensor) -> None:
        if dtype not in (torch.float32, torch.bfloat16):
            return self._decode_sum_rows(payloads, numel, dtype, out)
        rows = _aligned(payloads)
        fn = _host_fn("ccoll_host_zfp_decode_sum_f32")
        fn(rows.data_ptr(), rows.shape[1] // 8, rows.shape[0], numel, self.dims, self.maxbits(dtype),
           int(dtype == torch.bfloat16), out.data_ptr())

    # --- cupy backend: the same kernels on the caller's torch stream ---------------------------------
    def _encode_cupy(self, flat: torch.Tensor) -> torch.Tensor:
        sc = _scalar(flat.dtype)
        maxbits = self.maxbits(flat.dtype)
        x = flat.to(sc.dtype)
        out = torch.zeros(self.encoded_nbytes(x.numel(), flat.dtype), dtype=torch.uint8, device=x.device)
        _launch(f"ccoll_zfp_encode_{sc.suffix}", x.device, self.num_blocks(x.numel()),
                _ptr(x), np.uint64(x.numel()), np.int32(self.dims), np.int32(maxbits), _ptr(out))
        return out

    def _decode_cupy(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        sc = _scalar(dtype)
        maxbits = self.maxbits(dtype)
        words = _aligned(payload)
        out = torch.empty(numel, dtype=sc.dtype, device=payload.device)
        _launch(f"ccoll_zfp_decode_{sc.suffix}", payload.device, self.num_blocks(numel),
                _ptr(words), np.uint64(numel), np.int32(self.dims), np.int32(maxbits), _ptr(out))
        return out.to(dtype)

    def _decode_sum_cupy(self, payloads: torch.Tensor, numel: int, dtype: torch.dtype, out: torch.Tensor) -> None:
        if dtype not in (torch.float32, torch.bfloat16):
            return self._decode_sum_rows(payloads, numel, dtype, out)
        rows = _aligned(payloads)
        _launch("ccoll_zfp_decode_sum_f32", payloads.device, self.num_blocks(numel),
                _ptr(rows), np.uint64(rows.shape[1] // 8), np.int32(rows.shape[0]), np.uint64(numel),
                np.int32(self.dims), np.int32(self.maxbits(dtype)), np.int32(dtype == torch.bfloat16), _ptr(out))

    def _decode_sum_rows(self, payloads: torch.Tensor, numel: int, dtype: torch.dtype, out: torch.Tensor) -> None:
        """Unfused reduce step (float16, float64): decode each row to ``dtype``, add in fp32 in row order."""
        out.zero_()
        for row in payloads:
            out += self.decode(row, numel, dtype).to(torch.float32)


def _maxbits(rate: float, dims: int) -> int:
    # libzfp's zfp_stream_set_rate: floor(4^dims * rate + 0.5) in double arithmetic
    return math.floor(4**dims * rate + 0.5)


def _rows_of_four(arr: np.ndarray) -> np.ndarray:
    """The flat array as shape (ceil(n/4), 4), the last partial row padded with zfp's partial-run rule."""
    n = arr.size
    if n % 4 == 0:
        return arr.reshape(-1, 4)
    padded = np.empty(n + (-n % 4), dtype=arr.dtype)
    padded[:n] = arr
    tail = padded[n - n % 4 :]
    m = n % 4  # 1..3 values present; zfp's pad_block: n<=1: p1=p0; n<=2: p2=p1; p3=p0
    if m <= 1:
        tail[1] = tail[0]
    if m <= 2:
        tail[2] = tail[1]
    tail[3] = tail[0]
    return padded.reshape(-1, 4)


def _marker_blocks(buf: np.ndarray, nblocks: int, maxbits: int, ebits: int) -> np.ndarray:
    """Blocks whose header is flag 1 + biased exponent 0 (our non-finite marker), vectorised.

    Block b starts at bit b * maxbits; blocks b and b + 8 start exactly maxbits bytes apart at the same
    bit offset, so each of the 8 phases is a strided byte view (no index arrays)."""
    mask = (1 << (1 + ebits)) - 1
    padded = np.zeros(buf.size + 3, dtype=np.uint8)  # a header (<= 12 bits at offset <= 7) spans <= 3 bytes
    padded[: buf.size] = buf
    marked = np.zeros(nblocks, dtype=bool)
    for phase in range(min(8, nblocks)):
        count = len(range(phase, nblocks, 8))
        first, shift = (phase * maxbits) >> 3, (phase * maxbits) & 7
        window = np.zeros(count, dtype=np.uint32)
        for byte in range(3):
            start = first + byte
            window |= padded[start : start + (count - 1) * maxbits + 1 : maxbits].astype(np.uint32) << (8 * byte)
        marked[phase::8] = ((window >> shift) & mask) == 1
    return marked


def _aligned(payload: torch.Tensor) -> torch.Tensor:
    """Kernels read 64-bit words: copy the (small) payload if it does not start on an 8-byte boundary."""
    payload = payload.contiguous()
    return payload if payload.data_ptr() % 8 == 0 else payload.clone()


_HOST_SIGNATURES = {
    "encode": [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_int, ctypes.c_void_p],
    "decode": [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_int, ctypes.c_void_p],
    "decode_sum": [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_uint64, ctypes.c_int, ctypes.c_int,
                   ctypes.c_int, ctypes.c_void_p],
}


def _host_fn(name: str):
    fn = getattr(kernels.host_library("zfp"), name)
    if fn.argtypes is None:
        op = name[len("ccoll_host_zfp_"):].rsplit("_", 1)[0]
        fn.argtypes = _HOST_SIGNATURES[op]
        fn.restype = None
    return fn


def _ptr(t: torch.Tensor):
    return np.uint64(t.data_ptr())


#: threads per CUDA block; one thread codes one ZFP block
_THREADS = 128


def _launch(name: str, device: torch.device, nblocks: int, *args) -> None:
    """Launch a zfp.cu kernel, one thread per ZFP block, on torch's current stream of ``device``."""
    kernels.launch("zfp", name, max(1, min(-(-nblocks // _THREADS), 2**31 - 1)), _THREADS, args, device)
