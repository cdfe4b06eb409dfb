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
coefficient budget underflow and write past its buffer; they are refused (CodecSpecError at construction
for float32, CodecError when a float64 tensor needs the higher minimum). Rates above 64 bits per value
(more than even float64's raw size) are refused as absurd.

Batched API (base.py): ``encode_rows`` (optionally with fused error feedback), ``decode_rows`` and
``decode_sum`` code all rows at once; a plain ``encode``/``decode`` is the one-row case of the same code.
Row i is coded exactly as a standalone encode of the zero-padded ``row_numel``-value row i.

Backends: "torch" runs libzfp through zfpy (single-threaded: zfpy holds the GIL) with vectorised
pre/post-processing: one libzfp call for all rows when rows lie back to back in one zfp stream (no
partial block in a row and whole 64-bit words per row, see ``_one_stream``), one call per row otherwise.
"emulated" runs kernels/zfp.cu built for the host (OpenMP over tiles / blocks, the GPU kernel's own
per-block code); "cupy" runs the same kernels on the caller's torch stream, one launch per batched call
(``CUDA_KERNELS`` lists them). Encoding launches ``encode_tiles`` (``ENCODE_OP``: a warp per 32 blocks, a
run of up to 8 such tiles per warp for large inputs (``tiles_per_warp``), every output word stored once, so the output is not zeroed first); ``encode_rows`` (a thread per block,
atomic boundary words into a zeroed output) gives the same bytes and stays for comparison. bf16/f16 tensors are read and written by the kernels directly, and no
result depends on the GPU's flush-to-zero mode (kernels/zfp.cu, "exact float arithmetic").

NaN bits, so that every backend writes the same bytes: decoded NaNs are the canonical quiet NaN
narrowed as torch narrows it on the CPU (bf16 0xffff, f16 0x7e00); a NaN decode_sum is fp32 0x7fc00000.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..kernels import call as kernel_call
from ..errors import CodecError, CodecSpecError
from .base import CODECS, Codec, Param, per_backend
from .buffers import narrow_

#: rates above this many bits per value are refused
MAX_RATE = 64.0

#: the tile encoder's launch: a warp codes a run of up to this many consecutive tiles (kernels/zfp.cu,
#: encode_tiles_run, derives the run from the grid), so its set-up -- the launch geometry and the tile ->
#: (row, tile in row) division -- is paid once per run instead of once per tile
TILES_PER_WARP_MAX = 8
#: ... but runs grow only while the launch keeps this many warps: four waves of an H200 at the kernel's
#: occupancy (132 SMs x 8 CTAs x 4 warps). Occupancy (warps resident per SM) is set by registers and shared
#: memory, not by the run length, so with four waves or more every SM stays full until the last wave, which is
#: at most a quarter of the run; smaller inputs keep one tile per warp and all the latency hiding they can get.
TILE_RUN_MIN_WARPS = 4 * 132 * 8 * 4


def tiles_per_warp(tiles: int) -> int:
    """The run of tiles per warp the tile encoder's launch gives for ``tiles`` tiles (all rows): the largest
    power of two up to ``TILES_PER_WARP_MAX`` that leaves at least ``TILE_RUN_MIN_WARPS`` warps, else 1."""
    k = 1
    while 2 * k <= TILES_PER_WARP_MAX and tiles // (2 * k) >= TILE_RUN_MIN_WARPS:
        k *= 2
    return k


class _Scalar:
    """Per zfp scalar type: the constants the Python side needs (the kernel has the full traits)."""

    def __init__(self, dtype, zfpy_type_name, ebits, precision):
        self.dtype = dtype
        self.zfpy_type_name = zfpy_type_name
        self.ebits = ebits
        self.precision = precision
        # blocks whose largest |v| is below this are "tiny": libzfp's scale 2^(P-2-emax) overflows for
        # them (their biased exponent is <= P - 4)
        self.tiny = 2.0 ** (precision - 3 - (2 ** (ebits - 1) - 1))

    def min_rate(self, dims: int) -> float:
        # smallest rate with maxbits = floor(4^dims * rate + 0.5) >= 1 + EBITS (the header alone)
        return (self.ebits + 0.5) / 4**dims


_FLOAT = _Scalar(torch.float32, "type_float", 8, 32)
_DOUBLE = _Scalar(torch.float64, "type_double", 11, 64)


def _scalar(dtype: torch.dtype) -> _Scalar:
    return _DOUBLE if dtype == torch.float64 else _FLOAT


@CODECS.register("zfp")
@per_backend("kernel", ("encode_rows", "decode_rows", "decode_sum"))
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
            raise CodecSpecError(f"codec 'zfp': rate={rate} must be a number in (0, {MAX_RATE:g}] bits per value")
        if _maxbits(rate, dims) < 1 + _FLOAT.ebits:
            raise CodecSpecError(
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

    EXAMPLE_SPECS = ("zfp:rate=8", "zfp:rate=8,dims=2")

    def relative_error_bound(self, dtype: torch.dtype = torch.float32) -> float | None:
        """Fixed-rate ZFP has no closed-form error bound: each block gets exactly maxbits bits, and how many
        bit planes those reach depends on how its values spread (the block-floating-point header, the
        decorrelating transform, group tests). This is the empirical envelope the benchmark checks:
        measured against libzfp on normal, uniform and log-normal data, the worst error is ~2^(6-R) of the
        block's absmax for dims=1; allowed 2^(7-R) (2^(8-R) for dims=2)."""
        return 2.0 ** ((7 if self.dims == 1 else 8) - self.rate)

    def error_bound(self, x: torch.Tensor) -> float:
        """Data-dependent (no closed form, see ``relative_error_bound``): 4x the measured round-trip error
        of the whole of ``x`` (a chunk's blocks are the same kind of data), plus 2^-20 absmax."""
        if x.numel() == 0:
            return 0.0
        err = float((self.decode(self.encode(x), x.numel(), x.dtype).double() - x.reshape(-1).double()).abs().max())
        return 4 * err + float(x.detach().abs().max()) * 2.0**-20

    def encoded_nbytes(self, numel: int, dtype: torch.dtype) -> int:
        if numel < 0:
            raise CodecError(f"codec {self.spec!r}: numel must be >= 0, got {numel}")
        return 8 * (-(-self.num_blocks(numel) * self.maxbits(dtype) // 64))

    def _one_stream(self, row_numel: int, row_nbytes: int) -> bool:
        """True when rows of ``row_numel`` values lie back to back in one zfp stream: no partial block
        inside a row and every row's blocks fill whole 64-bit words (so one libzfp call codes all rows)."""
        maxbits = _maxbits(self.rate, self.dims)  # the same for every dtype
        return row_numel % self.block_size == 0 and self.num_blocks(row_numel) * maxbits == 8 * row_nbytes

    # --- torch backend: libzfp through zfpy, vectorised pre/post-processing ------------------------------
    def _encode_rows_torch(self, src, out, row_numel, feedback, salt) -> None:
        zfpy = _zfpy()

        sc = _scalar(src.dtype)
        maxbits = self.maxbits(src.dtype)
        rows, n, S = out.shape[0], src.numel(), self.block_size
        # the zero-padded rows in the zfp scalar type, in a fresh buffer (the caller's tensor is never modified)
        x = torch.zeros(rows * row_numel, dtype=sc.dtype)
        x[:n] = src
        comp = None
        if feedback is not None:  # feedback's dtype is sc.dtype: fp32 (fp64 for fp64 input)
            comp = x + feedback
            x = comp.to(src.dtype).to(sc.dtype) if src.dtype != sc.dtype else comp.clone()
        # per block of each row: clear non-finite and tiny blocks (libzfp then codes all-zero blocks)
        xr = x.view(rows, row_numel)
        full = (row_numel // S) * S
        bmax = xr[:, :full].view(rows, -1, S).abs().amax(dim=2)  # NaN where a block holds NaN
        if full < row_numel:
            bmax = torch.cat([bmax, xr[:, full:].abs().amax(dim=1, keepdim=True)], dim=1)
        nonfinite = ~torch.isfinite(bmax)
        clear = nonfinite | ((bmax < sc.tiny) & (bmax != 0))
        if bool(clear.any()):
            xr[:, :full].view(rows, -1, S)[clear[:, : full // S]] = 0
            if full < row_numel:
                xr[:, full:][clear[:, -1]] = 0
        row_nbytes = out.shape[1]
        dest = out.numpy()
        if self._one_stream(row_numel, row_nbytes):
            dest.reshape(-1)[:] = np.frombuffer(
                zfpy.compress_numpy(self._zfp_shape(x.numpy()), rate=self.rate, write_header=False), dtype=np.uint8)
        else:
            for i in range(rows):
                dest[i] = np.frombuffer(zfpy.compress_numpy(
                    self._zfp_shape(xr[i].numpy()), rate=self.rate, write_header=False), dtype=np.uint8)
        if bool(nonfinite.any()):
            # the block is all zero bits; its header flag alone turns it into the marker (exponent 0)
            r, b = np.nonzero(nonfinite.numpy())
            start = r.astype(np.int64) * (8 * row_nbytes) + b.astype(np.int64) * maxbits
            flat = dest.reshape(-1)
            flat[start >> 3] |= (1 << (start & 7)).astype(np.uint8)
        if comp is not None:
            decoded = torch.empty(rows * row_numel, dtype=src.dtype)
            self._decode_rows_torch(out, decoded, row_numel)
            comp.sub_(decoded.to(comp.dtype)).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
            comp[n:] = 0
            feedback.copy_(comp)

    def _zfp_shape(self, arr: np.ndarray) -> np.ndarray:
        """The array libzfp codes for a flat row: itself (dims=1) or rows of four (dims=2)."""
        return _rows_of_four(arr) if self.dims == 2 else arr

    def _decode_rows_torch(self, payloads, out, row_numel) -> None:
        zfpy = _zfpy()

        sc = _scalar(out.dtype)
        maxbits = self.maxbits(out.dtype)
        ztype = getattr(zfpy, sc.zfpy_type_name)
        n, S = out.numel(), self.block_size
        need = -(-n // row_numel)  # rows wholly past the end are not decoded
        row_nbytes = payloads.shape[1]
        if self._one_stream(row_numel, row_nbytes):
            # one stream: one libzfp call, straight into out when it has the zfp type and no clipping
            total = need * row_numel
            shape = [total] if self.dims == 1 else [total // 4, 4]
            buf = payloads[:need].numpy().reshape(-1)
            direct = out.dtype == sc.dtype and n == total
            values = out if direct else torch.empty(total, dtype=sc.dtype)
            zfpy._decompress(buf, ztype, shape, out=values.numpy().reshape(shape), rate=self.rate)
            _fill_marked(values, buf, need * self.num_blocks(row_numel), maxbits, sc, S)
            if not direct:
                narrow_(out, values[:n])  # bf16 NaN bits by the kernels' rule (ccoll.codecs.buffers)
            return
        rows4 = -(-row_numel // 4)
        shape = [row_numel] if self.dims == 1 else [rows4, 4]
        values = torch.empty(row_numel if self.dims == 1 else 4 * rows4, dtype=sc.dtype)
        for i in range(need):
            buf = payloads[i].numpy()
            lo, hi = i * row_numel, min(n, (i + 1) * row_numel)
            # straight into out where the row is whole, of the zfp type and has no padded 2-D row
            direct = out.dtype == sc.dtype and hi - lo == values.numel()
            row = out[lo:hi] if direct else values
            zfpy._decompress(buf, ztype, shape, out=row.numpy().reshape(shape), rate=self.rate)
            _fill_marked(row[:row_numel], buf, self.num_blocks(row_numel), maxbits, sc, S)
            if not direct:
                narrow_(out[lo:hi], values[: hi - lo])

    def _decode_sum_torch(self, payloads, numel, dtype, out) -> None:
        decoded = torch.empty(payloads.shape[0] * numel, dtype=dtype)
        self._decode_rows_torch(payloads, decoded, numel)
        decoded = decoded.view(-1, numel)
        out.zero_()
        for row in decoded:  # in row order, each decode rounded to dtype then to fp32 (as the contract)
            out.add_(row if dtype in (torch.float32, torch.bfloat16, torch.float16) else row.to(torch.float32))
        # which NaN an addition returns differs between x86 and the GPU: every NaN sum is the canonical one
        out.masked_fill_(out.isnan(), float("nan"))

    # --- emulated (kernels/zfp.cu built for the host) and cupy (the same kernels on the GPU) ---------------
    #: the encode kernel the emulated and cupy backends launch: "encode_tiles" (one warp per 32 blocks, each
    #: output word stored once) or "encode_rows" (one thread per block, boundary words OR-ed into a zeroed
    #: output); both give the same bytes (tests/unit/test_simt.py, tests/unit/test_zfp*.py)
    ENCODE_OP = "encode_tiles"

    def _encode_rows_kernel(self, backend, src, out, row_numel, feedback, salt=None, *, op: str | None = None) -> None:
        op = op or self.ENCODE_OP  # salt: zfp is deterministic, nothing to seed
        words = out if out.data_ptr() % 8 == 0 else torch.empty_like(out)
        rows, nblk = out.shape[0], self.num_blocks(row_numel)
        if op == "encode_rows":
            words.zero_()  # blocks OR their boundary words in
            nthreads = rows * nblk
        else:  # a warp per run of tiles of 32 blocks; every output word is written
            tiles = rows * -(-nblk // 32)
            nthreads = 32 * -(-tiles // tiles_per_warp(tiles))
        kernel_call.call(backend, "zfp", "zfp", op, src.dtype, src.device, nthreads,
             src, src.numel(), row_numel, rows, self.dims, self.maxbits(src.dtype), out.shape[1] // 8,
             feedback, words)
        if words is not out:
            out.copy_(words)

    def _decode_rows_kernel(self, backend, payloads, out, row_numel) -> None:
        rows = -(-out.numel() // row_numel)
        words = _aligned(payloads)
        kernel_call.call(backend, "zfp", "zfp", "decode_rows", out.dtype, out.device, rows * self.num_blocks(row_numel),
             words, words.shape[1] // 8, rows, out.numel(), row_numel, self.dims, self.maxbits(out.dtype), out)

    def _decode_sum_kernel(self, backend, payloads, numel, dtype, out) -> None:
        words = _aligned(payloads)
        kernel_call.call(backend, "zfp", "zfp", "decode_sum", dtype, out.device, self.num_blocks(numel),
             words, words.shape[1] // 8, words.shape[0], numel, self.dims, self.maxbits(dtype), out)


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


def _zfpy():
    """libzfp's Python binding, which the torch backend runs; a CodecError that says what to do without it."""
    try:
        import zfpy
    except ImportError:
        raise CodecError(
            "the zfp codec's torch backend runs libzfp through zfpy, which is not installed: "
            "pip install zfpy, or use backend='emulated' (the same bytes from kernels/zfp.cu built for the host)"
        ) from None
    return zfpy


def _fill_marked(values: torch.Tensor, buf: np.ndarray, nblocks: int, maxbits: int, sc: _Scalar, S: int) -> None:
    """Set every value of the marker blocks (non-finite on input) among the ``nblocks`` blocks of ``buf``
    to NaN; ``values`` holds their decode, the last block possibly partial."""
    marked = _marker_blocks(buf, nblocks, maxbits, sc.ebits)
    if not marked.any():
        return
    full = (values.numel() // S) * S
    mark = torch.from_numpy(marked)
    values[:full].view(-1, S)[mark[: full // S]] = float("nan")
    if full < values.numel() and bool(mark[-1]):
        values[full:] = float("nan")


def _aligned(payload: torch.Tensor) -> torch.Tensor:
    """Kernels read 64-bit words: copy the (small) payload if it does not start on an 8-byte boundary."""
    payload = payload.contiguous()
    return payload if payload.data_ptr() % 8 == 0 else payload.clone()


#: every CUDA kernel this module launches (the NVRTC build check asserts each exists in kernels/zfp.cu)
CUDA_KERNELS = kernel_call.cuda_kernels("zfp")
