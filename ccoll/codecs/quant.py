"""Block quantization codecs "int8" and "int4" (symmetric absmax per block, one fp32 scale per block) and
"fp8" (MX-style: one E8M0 power-of-two scale per block, E4M3 / E5M2 elements; see Fp8Codec), all with
an optional ``rotate=hadamard``.

One implementation parametrised by ``bits`` (qmax = 2^(bits-1) - 1 = 127 or 7). The algorithm, the exact
rounding rules and the payload layout are specified once, in kernels/quant.cu's header comment; the torch
backend (quant_torch.py) is a vectorised re-statement of the same fp32 operations in the same order, so
every backend produces the same bytes (tests/unit/test_quant.py checks it). Modules, one job each: this
one the codecs (parameters, layout, declared bounds, element-format hooks); quant_format.py the formats'
math (random numbers, Hadamard, fp8 tables); quant_torch.py the torch backend; quant_kernels.py the
emulated / cupy backends through ccoll.kernels.call.

Spec: ``int8:block=B`` / ``int4:block=B``, optional ``round=nearest|stochastic`` (default nearest,
ties to even) and ``seed=S`` (0 <= S < 2^32, default 0, used by stochastic rounding only).

- ``block`` must be a multiple of 8 in [8, 2^20]: every block then starts on a 32-bit word of the q
  section for both widths (vector loads/stores on the GPU, no two blocks share a byte). 2^20 bounds the
  work of one GPU team; larger blocks buy nothing (the scale costs 32/B bits per value).
- q = round(x * inv) with scale = fl(absmax / qmax) and inv = fl(1 / scale): one division per block, a
  multiply per value (on a GPU a correctly rounded division per value was a third of the encode's
  instructions; kernels/quant.cu's header).
- Round to nearest: |decode - x| <= absmax / (2 qmax) per element, up to fp32 rounding of the scale, of
  inv and x * inv (a few ulp of absmax) and, for bf16/fp16 output, the final cast. Zero stays exactly zero.
- Stochastic: q = floor(x * inv + u) with u in [0, 1) (24 random bits) from a counter-based hash of
  (seed, global element index), so E[decode] = x (up to fp32 rounding of x * inv + u, ~2^-17 of a step)
  and CPU and GPU produce the same bytes for the same seed.
  Seed design note: the same seed on every call gives the same u at the same index, so repeated calls on
  similar data round the same way (errors stop averaging out over steps) and all ranks encoding equal-sized
  chunks use the same u sequence (errors correlate across ranks instead of cancelling in the sum). The
  codec itself is stateless -- callers that encode repeatedly (collectives, error feedback) pass a per-call
  ``salt=`` (from step, call key, rank) to ``encode_rows``, which mixes it into the seed (``_salted``); the
  seed does not travel, so receivers do not need it. In ``encode_rows`` the index of element j of row i is
  i * row_numel + j, so rows never share a draw and block-aligned rows encode exactly like the whole tensor.
- Batches: ``encode_rows`` (optionally with fused error feedback), ``decode_rows`` and ``decode_sum`` are one
  kernel launch (cupy, emulated) / one vectorised pass (torch) for any number of rows; plain
  ``encode`` / ``decode`` are the one-row case of the same code.
- ``rotate=hadamard`` (``rotate_seed=S``, default 0): each whole block x (block a power of two in [8, 1024])
  is sent as y = H D x (H the unnormalised Walsh-Hadamard matrix, D random signs from S -- a codec
  parameter, identical on all ranks, never salted) and decoded as D H (y' / block); a partial last block
  of a row is sent unrotated. Why: one outlier no longer sets the step of its whole block (its energy is
  spread over the block), so heavy-tailed tensors lose less at the same bits. Bound (round to nearest,
  per whole block): ||x' - x||_2 <= ||x||_1 / (2 qmax), up to fp32 rounding. The forward transform can
  grow values by up to ``block``x: a block with absmax > FLT_MAX / block overflows and decodes to NaN
  (the non-finite rule). decode_sum rotates each payload back before adding it (the sum of the decodes, as
  the contract defines it, in the same single pass/launch), not once after summing in the rotated domain,
  which would round differently from decode-then-add and break bit-identity with the reference.
- Non-finite: a block containing NaN/+-Inf stores NaN as its scale and decodes to NaN for the whole block.
- Tiny blocks: a block with 0 < absmax < qmax 2^-126 (~1.5e-36 for int8) takes the smallest normal scale
  2^-126, so its inv is finite: q = round(x * 2^126) exactly, error <= 2^-127 (stochastic < 2^-126).
- Huge blocks: if qmax * scale would overflow (absmax within ~1 ulp of FLT_MAX) the scale is the next
  smaller float, so finite input never decodes to Inf.
"""
from __future__ import annotations

import functools

import os
import sys
from typing import ClassVar

import torch

from ..errors import CodecError, CodecSpecError
from ..kernels import host_build_ready
from ..kernels.call import cuda_kernels
from .base import CODECS, Codec, Param, _fmt
from .buffers import canonical_nan_, round16
from .quant_format import _E8M0, _FP8_FORMATS, _U32, _mix32
from .quant_kernels import QuantKernelBackend
from .quant_torch import QuantTorchBackend

MAX_BLOCK = 1 << 20

if sys.byteorder != "little":  # the payload is little-endian; the torch backend packs through int16 views
    raise ImportError("ccoll.codecs.quant needs a little-endian host")

#: every kernel of kernels/quant.cu the codecs launch (the NVRTC build check asserts each exists)
CUDA_KERNELS = cuda_kernels("quant")

#: rotate=hadamard parameters, shared by every block codec (kernels/quant.cu, CqRot)
ROTATE_PARAMS = {
    "rotate": Param(str, "none", ("none", "hadamard"),
                    "hadamard: randomized Walsh-Hadamard transform of each block before quantizing"),
    "rotate_seed": Param(int, 0, doc="sign seed of the rotation, 0 <= rotate_seed < 2^32: the same on every rank "
                                     "(part of the spec, never salted)"),
}
#: the largest block rotate=hadamard takes (a GPU team of 32 lanes holds it in registers)
MAX_ROTATE_BLOCK = 1024

class BlockQuantCodec(QuantTorchBackend, QuantKernelBackend, Codec):
    """Shared implementation of "int8", "int4" and "fp8": one algorithm (kernels/quant.cu) over an element
    format. Subclasses set ``bits`` and ``kernel_format`` (the kernels' name for the format); the int
    formats are the defaults here, fp8 overrides the format hooks (``_quantize``, ``_q_values``,
    ``_scale``, the scale section)."""

    bits: ClassVar[int]
    #: the format part of the kernel names: ccoll_<kernel_format>_<op>_<dtype>
    kernel_format: ClassVar[str]
    #: bytes per block in the scale section (fp32 scale; fp8: one E8M0 byte)
    scale_bytes: ClassVar[int] = 4
    scale_dtype: ClassVar[torch.dtype] = torch.float32
    PARAMS = {
        "block": Param(int, None, doc="values per scale: a multiple of 8 in [8, 2^20], e.g. 256"),
        "round": Param(str, "nearest", ("nearest", "stochastic"), "rounding: nearest (ties to even) or stochastic"),
        "seed": Param(int, 0, doc="stochastic rounding seed, 0 <= seed < 2^32"),
        **ROTATE_PARAMS,
    }
    dtypes = (torch.float32, torch.bfloat16, torch.float16)

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1

    @property
    def block(self) -> int:
        return self.params["block"]

    @property
    def stochastic(self) -> bool:
        return self.params.get("round") == "stochastic"

    @property
    def rotate(self) -> bool:
        return self.params["rotate"] == "hadamard"

    def _spec_text(self) -> str:
        """The rotation parameters appear only when the codec rotates."""
        params = self.params if self.rotate else {k: v for k, v in self.params.items() if k not in ROTATE_PARAMS}
        return self.name + ":" + ",".join(f"{k}={_fmt(v)}" for k, v in params.items())

    def _validate(self) -> None:
        self._check_block(8, MAX_BLOCK, "64, 256, 4096")
        block = self.params["block"]
        for key in ("seed", "rotate_seed"):
            if not 0 <= self.params.get(key, 0) <= _U32:
                raise CodecSpecError(f"codec {self.name!r}: {key}={self.params[key]} must be in [0, 2^32)")
        if self.rotate and (block & (block - 1) or block > MAX_ROTATE_BLOCK):
            raise CodecSpecError(
                f"codec {self.name!r}: rotate=hadamard needs block to be a power of two between 8 and "
                f"{MAX_ROTATE_BLOCK}, got block={block}"
            )

    @property
    def align_numel(self) -> int:
        return self.block

    #: the formats whose host build has the CPU's streaming paths (kernels/quant.cu "the CPU's streaming
    #: paths": one vectorised pass per phase, OpenMP over the caller's torch.get_num_threads() cores)
    CPU_STREAMING_FORMATS: ClassVar[tuple[str, ...]] = ("int8", "int4")

    def _cpu_backend(self) -> str:
        """"emulated" (the host build of kernels/quant.cu) on CPU tensors where it has the streaming paths --
        int8 / int4 without rotation -- and is already built (``make kernels-host``; never built here: a
        first build takes minutes); else "torch". Both write the same bytes (tests/unit/test_quant_rows.py);
        the host build is the faster: one fused pass per phase and no temporaries, where the torch backend
        makes a dozen passes over cache-sized pieces (python -m ccoll.bench.cpu_codec measures both).
        ``CCOLL_CPU_BACKEND=torch|emulated`` overrides the choice. Decided once per codec object: every batched
        call resolves its backend, and reading the environment each time cost ~2 us of a compressed call's
        host path."""
        try:
            return self._cpu_choice
        except AttributeError:
            pass
        forced = os.environ.get("CCOLL_CPU_BACKEND")
        if forced and forced not in ("torch", "emulated"):
            raise CodecSpecError(f"CCOLL_CPU_BACKEND={forced!r}: expected torch or emulated (or unset)")
        if forced:
            choice = forced
        elif self.kernel_format in self.CPU_STREAMING_FORMATS and not self.rotate and host_build_ready("quant"):
            choice = "emulated"
        else:
            choice = "torch"
        self._cpu_choice: str = choice
        return choice

    def __getstate__(self) -> dict:
        """Pickled without the CPU backend choice: the process that loads it decides for its own machine."""
        state = dict(self.__dict__)
        state.pop("_cpu_choice", None)
        return state

    # --- declared properties (base.Codec): determinism and the documented error bound ---------------
    @functools.cached_property
    def deterministic(self) -> bool:
        """Kept after the first read (a dict read, no frame): every compressed call asks it twice, and the
        rounding mode is fixed at construction."""
        return not self.stochastic

    def _step_fraction(self) -> float:
        """Error per element as a fraction of the absmax of the (rotated) block: round to nearest moves a
        value by at most half a step (scale = absmax / qmax), stochastic rounding by less than one step."""
        return 1.0 / self.qmax if self.stochastic else 0.5 / self.qmax

    #: fp32 rounding on top of the ideal quantizer: the scale fl(absmax / qmax) moves the step by 2^-24
    #: relative; inv = fl(1 / scale) and x * inv each move q by 2^-24 * qmax, q * scale the decode by
    #: 2^-24 * absmax: in units of the bound (half a step) <= (1 + 6 qmax) 2^-24 (int8: 4.55e-5 of it);
    #: (1 + 2^-14) = 1 + 6.1e-5 covers it
    _FP32_MARGIN = 1.0 + 2.0**-14
    #: absolute floor: a tiny block (absmax < qmax 2^-126) quantizes with the step 2^-126 (module docstring,
    #: "Tiny blocks"): error <= 2^-127 to nearest, < 2^-126 stochastic
    _ERROR_FLOOR = 2.0**-126

    def relative_error_bound(self, dtype: torch.dtype = torch.float32) -> float | None:
        """Unrotated: absmax / (2 qmax) per element (round to nearest), absmax / qmax (stochastic), with
        fp32 rounding margin. rotate=hadamard: the step is set by the rotated block y = H D x, whose
        absmax is at most ||x||_1 <= block * absmax, and the error of x' = D H e / block is at most
        max|e| (||H e||_2 = sqrt(block) ||e||_2), so ``block`` times that, plus the butterflies' fp32
        rounding (2 log2(block) stages, 2^-24 each, of values <= ||x||_1)."""
        rel = self._step_fraction() * self._FP32_MARGIN
        if self.rotate:
            rel = self.block * (rel + (self.block.bit_length() - 1) * 2.0**-23)
        return rel

    def error_bound(self, x: torch.Tensor) -> float:
        """As ``relative_error_bound``, but rotate=hadamard uses the largest L1 norm any block of any chunk
        of ``x`` can have (the sum of its ``block`` largest magnitudes) instead of block * absmax."""
        if x.numel() == 0:
            return 0.0
        mags = x.detach().reshape(-1).abs().to(torch.float64)
        if not self.rotate:
            return max(float(mags.max()) * self.relative_error_bound(x.dtype), self._ERROR_FLOOR)
        l1 = float(mags.topk(min(self.block, mags.numel())).values.sum())
        rel = self._step_fraction() * self._FP32_MARGIN + (self.block.bit_length() - 1) * 2.0**-23
        return max(l1 * rel, self._ERROR_FLOOR)

    def _salted(self, salt: int) -> "BlockQuantCodec":
        """Stochastic rounding draws from (spec seed mixed with the caller's per-call salt); see the
        module's seed design note. Round-to-nearest ignores the salt."""
        if not self.stochastic or salt == 0:
            return self
        return self.with_seed(_mix32(self.params["seed"] ^ _mix32(salt & _U32) ^ _mix32((salt >> 32) + 0x9E3779B9)))

    def with_seed(self, seed: int) -> "BlockQuantCodec":
        """The same codec with another stochastic-rounding seed (see the module's seed design note)."""
        return type(self)(backend=self.backend, **{**self.params, "seed": seed})

    # --- layout (kernels/quant.cu) --------------------------------------------------------------
    def _layout(self, numel: int) -> tuple[int, int, int]:
        """(nblocks, scale section bytes, q section bytes); both sections are padded to 16 bytes."""
        nblocks = -(-numel // self.block)
        return nblocks, round16(self.scale_bytes * nblocks), round16(-(-numel * self.bits // 8))

    def encoded_nbytes(self, numel: int, dtype: torch.dtype) -> int:
        self.check_dtype(dtype)
        if numel < 0:
            raise CodecError(f"codec {self.spec!r}: numel must be >= 0, got {numel}")
        _, scale_nbytes, q_nbytes = self._layout(numel)
        return scale_nbytes + q_nbytes

@CODECS.register("int8")
class Int8Codec(BlockQuantCodec):
    """int8 block quantization: 8 + 32/block bits per value (qmax 127)."""

    name = "int8"
    EXAMPLE_SPECS = ("int8:block=256", "int8:block=256,round=stochastic", "int8:block=64,rotate=hadamard")
    bits = 8
    kernel_format = "int8"


@CODECS.register("int4")
class Int4Codec(BlockQuantCodec):
    """int4 block quantization: 4 + 32/block bits per value (qmax 7)."""

    name = "int4"
    EXAMPLE_SPECS = ("int4:block=64", "int4:block=64,round=stochastic")
    bits = 4
    kernel_format = "int4"


@CODECS.register("fp8")
class Fp8Codec(BlockQuantCodec):
    """MX-style block-scaled fp8 (OCP Microscaling): ``fp8:format=e4m3|e5m2,block=32``; 8 + 8/block bits per
    value (one E8M0 scale byte per block; 8.25 at the MX block of 32).

    Per block: e = the smallest integer with absmax <= fmax * 2^e (fmax = 448 for E4M3, 57344 for E5M2),
    clamped to [-127, 127 - EMAX] (so fmax * 2^e <= 1.75 * 2^127 and finite input never decodes to Inf;
    a block with absmax above that, ~2.98e38, saturates to it); each value is x * 2^-e (exact), clamped to [-fmax, fmax] (saturating; with this
    scale only the clamp's safety net), rounded to the element format to nearest even, subnormals included;
    decode = fp8 value * 2^e. This is the "round up" scale of the hardware MX conversions (TE / cuBLAS
    MXFP8): unlike OCP's floor(log2(absmax)) - EMAX it never saturates the block's largest values (which
    costs up to 12.5% error on them), at the price of at most one binade of range at the bottom.

    Error bound (round to nearest, finite block): |decode - x| <= max(2^-(m+1) |x|, 2^(e + 1 - bias - m - 1))
    per element, m = 3 / bias = 7 (E4M3) or m = 2 / bias = 15 (E5M2): half an ulp of the element format
    (relative 1/16 or 1/8), or half its smallest subnormal step (scaled) for values below its normal range,
    plus the final rounding to bf16/fp16 output. Zero stays zero. A block holding NaN/Inf stores the NaN
    scale byte 255 and decodes to NaN for the whole block. ``rotate=hadamard`` applies as for int8/int4.
    """

    name = "fp8"
    bits = 8
    scale_bytes = 1
    scale_dtype = torch.uint8
    PARAMS = {
        "format": Param(str, "e4m3", ("e4m3", "e5m2"),
                        "element format: e4m3 (3 mantissa bits, max 448) or e5m2 (2 mantissa bits, max 57344)"),
        "block": Param(int, 32, doc="values per E8M0 scale: a multiple of 8 in [8, 2^20]; MX uses 32"),
        **ROTATE_PARAMS,
    }

    EXAMPLE_SPECS = ("fp8:format=e4m3,block=32", "fp8:format=e5m2,block=32,rotate=hadamard")
    _decodes_negative_zero = True  # the fp8 byte 0x80

    @property
    def kernel_format(self) -> str:  # type: ignore[override]
        return "fp8" + self.params["format"]

    def _step_fraction(self) -> float:
        """Half an ulp of the element format relative to the value, 2^-(m+1) (E4M3: 1/16, E5M2: 1/8), which
        bounds every element by 2^-(m+1) absmax. Values in the format's subnormal range err by at most half
        its smallest step at scale 2^e, 2^(-bias-m) 2^e; 2^e < 2 absmax / fmax (e is the smallest with
        absmax <= fmax 2^e), so that is below 2^(1-bias-m) / fmax absmax, far under 2^-(m+1) absmax. Every
        other step (x * 2^-e, the decode fp8 * 2^e) is exact."""
        return 2.0 ** -(4 if self.params["format"] == "e4m3" else 3)

    _FP32_MARGIN = 1.0
    #: e is clamped to >= -127: a block below fmax 2^-127 keeps the step of e = -127, whose half smallest
    #: subnormal step is 2^(-bias-m-127) (E4M3 2^-137, E5M2 2^-144)
    _ERROR_FLOOR = 2.0**-137

    def error_bound(self, x: torch.Tensor) -> float:
        """The block-quant bound, except that e is clamped to <= 127 - EMAX: a (rotated) block above
        fmax 2^(127-EMAX) (~2.98e38) saturates, with no bound (inf)."""
        _, emax, fmax = _FP8_FORMATS[self.params["format"]]
        if x.numel() and float(x.detach().abs().max()) * (self.block if self.rotate else 1) > fmax * 2.0 ** (127 - emax):
            return float("inf")
        return super().error_bound(x)

    def _quantize(self, x: torch.Tensor, v: torch.Tensor, scales: torch.Tensor, q: torch.Tensor, index0: int) -> bool:
        """x ([nr, L] fp32) -> E8M0 codes (scales, [nr, nblocks] uint8) and fp8 bytes (q, [nr, L] int8 view);
        v: fp32 scratch. The bit arithmetic of kernels/quant.cu CqFp8::params, vectorised. Returns False:
        no plain-piece shortcut (the caller keeps its non-finite handling)."""
        dtype8, emax, fmax = _FP8_FORMATS[self.params["format"]]
        torch.abs(x, out=v)
        amax = torch.empty(scales.shape, dtype=torch.float32)
        for rows, sl in self._blocks(v):
            amax[:, sl] = rows.amax(dim=2)  # NaN propagates, Inf stays Inf
        finite = torch.isfinite(amax)
        bits = amax.view(torch.int32)
        field = bits >> 23
        e = torch.where(field == 0, -126, field - 127) - emax
        e += ((field != 0) & ((bits & 0x7FFFFF) > 0x600000)).to(torch.int32)
        e.clamp_(-127, 127 - emax)  # fmax * 2^e stays finite: no value rounds up to Inf
        scales.copy_(torch.where(finite, e + 127, 255))
        enc = ((127 - e) << 23).view(torch.float32)  # 2^-e, a normal fp32
        for (rows_x, sl), (rows_v, _) in zip(self._blocks(x), self._blocks(v)):
            torch.mul(rows_x, enc[:, sl, None], out=rows_v)
        v.clamp_(-fmax, fmax)
        if not bool(finite.all()):
            for rows_v, sl in self._blocks(v):
                rows_v.masked_fill_(~finite[:, sl, None], 0.0)
        q.copy_(v.to(dtype8).view(torch.int8))
        return False

    def _q_values(self, v: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """The codes' values; a NaN code (never written by the encoder, but a payload may hold one) decodes
        to 0x7FC00000 as in the kernels (CqFp8::value), not to torch's float8 -> fp32 NaN bits."""
        return canonical_nan_(v.copy_(q.view(_FP8_FORMATS[self.params["format"]][0])))

    def _scale(self, v: torch.Tensor, scales: torch.Tensor) -> None:
        """v *= 2^e of each block (scales: E8M0 codes)."""
        super()._scale(v, _E8M0[scales.long()])
