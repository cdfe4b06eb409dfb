"""Block quantization codecs "int8" and "int4" (symmetric absmax per block, one fp32 scale per block) and
"fp8" (MX-style: one E8M0 power-of-two scale per block, E4M3 / E5M2 elements; see Fp8Codec), all with
an optional ``rotate=hadamard``.

One implementation parametrised by ``bits`` (qmax = 2^(bits-1) - 1 = 127 or 7). The algorithm, the exact
rounding rules and the payload layout are specified once, in kernels/quant.cu's header comment; this
module's torch backend is a vectorised re-statement of the same fp32 operations in the same order, so
every backend produces the same bytes (tests/unit/test_quant.py checks it).

Spec: ``int8:block=B`` / ``int4:block=B``, optional ``round=nearest|stochastic`` (default nearest,
ties to even) and ``seed=S`` (0 <= S < 2^32, default 0, used by stochastic rounding only).

- ``block`` must be a multiple of 8 in [8, 2^20]: every block then starts on a 32-bit word of the q
  section for both widths (vector loads/stores on the GPU, no two blocks share a byte). 2^20 bounds the
  work of one GPU team; larger blocks buy nothing (the scale costs 32/B bits per value).
- Round to nearest: |decode - x| <= absmax / (2 qmax) per element, up to fp32 rounding of the scale and
  of x/scale (a few ulp of absmax) and, for bf16/fp16 output, the final cast. Zero stays exactly zero.
- Stochastic: q = floor(x/scale + u) with u in [0, 1) (24 random bits) from a counter-based hash of
  (seed, global element index), so E[decode] = x (up to fp32 rounding of x/scale + u, ~2^-17 of a step)
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
- Tiny blocks: if absmax/qmax underflows to 0 the block decodes to exact zeros (error <= absmax < 1e-43).
- Huge blocks: if qmax * scale would overflow (absmax within ~1 ulp of FLT_MAX) the scale is the next
  smaller float, so finite input never decodes to Inf.
"""
from __future__ import annotations

import ctypes
import functools
import math
import sys
from typing import ClassVar

import torch

from .. import kernels
from ..errors import CodecError, PolicyError
from .base import CODECS, Codec, Param, _fmt
from .buffers import aligned, aligned_like, empty_cpu, round16

MAX_BLOCK = 1 << 20
_FLT_MIN_NORMAL = 2.0**-126
_U32 = 0xFFFFFFFF
#: elements per torch-backend piece: temporaries stay cache-resident and no large scratch is allocated
_CHUNK_NUMEL = 1 << 20
#: least elements per row of one decode_sum span (fewer, longer adds when there are many rows)
_SUM_SPAN_NUMEL = 1 << 14

if sys.byteorder != "little":  # the payload is little-endian; the torch backend packs through int16 views
    raise ImportError("ccoll.codecs.quant needs a little-endian host")


def _mix32(x: int) -> int:
    """The 32-bit integer hash of kernels/quant.cu (cq_mix32), on Python ints."""
    x &= _U32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _U32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _U32
    x ^= x >> 16
    return x


def _stream_key(seed: int, index_hi: int) -> int:
    return _mix32(seed ^ _mix32(index_hi + 0x9E3779B9))


def _i32(u: int) -> int:
    """The int32 with the bit pattern of uint32 u."""
    return u - (1 << 32) if u >= 1 << 31 else u


def _mix32_(x: torch.Tensor, tmp: torch.Tensor) -> None:
    """cq_mix32 in place on an int32 tensor holding uint32 bit patterns: int32 multiplication wraps
    mod 2^32 like uint32, and the masks turn torch's arithmetic right shifts into logical ones."""
    for shift, mask, mult in ((16, 0xFFFF, 0x7FEB352D), (15, 0x1FFFF, 0x846CA68B)):
        torch.bitwise_right_shift(x, shift, out=tmp).bitwise_and_(mask)
        x.bitwise_xor_(tmp).mul_(_i32(mult))
    torch.bitwise_right_shift(x, 16, out=tmp).bitwise_and_(0xFFFF)
    x.bitwise_xor_(tmp)


def _uniform(seed: int, index0: int, numel: int) -> torch.Tensor:
    """u in [0, 1) for global element indices index0 .. index0+numel-1 (cq_uniform, vectorised)."""
    segment_end = (index0 >> 32) + 1 << 32
    if index0 + numel > segment_end:  # one key per 2^32-element segment: split at the boundary
        head = segment_end - index0
        return torch.cat([_uniform(seed, index0, head), _uniform(seed, segment_end, numel - head)])
    key = _stream_key(seed, index0 >> 32)
    low = index0 & _U32
    if low + numel <= 1 << 31:
        x = torch.arange(low, low + numel, dtype=torch.int32)
    else:  # indices past 2^31 as int32 bit patterns
        x = torch.arange(low, low + numel, dtype=torch.int64)
        x = torch.where(x >= 1 << 31, x - (1 << 32), x).to(torch.int32)
    tmp = torch.empty_like(x)
    x.bitwise_xor_(_i32(key))
    _mix32_(x, tmp)
    x.add_(_i32(key))
    _mix32_(x, tmp)
    x.bitwise_right_shift_(8).bitwise_and_(0xFFFFFF)
    return x.to(torch.float32).mul_(2.0**-24)


#: rotate=hadamard parameters, shared by every block codec (kernels/quant.cu, CqRot)
ROTATE_PARAMS = {
    "rotate": Param(str, "none", ("none", "hadamard"),
                    "hadamard: randomized Walsh-Hadamard transform of each block before quantizing"),
    "rotate_seed": Param(int, 0, doc="sign seed of the rotation, 0 <= rotate_seed < 2^32: the same on every rank "
                                     "(part of the spec, never salted)"),
}
#: the largest block rotate=hadamard takes (a GPU team of 32 lanes holds it in registers)
MAX_ROTATE_BLOCK = 1024


class BlockQuantCodec(Codec):
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

    @property
    def spec(self) -> str:
        """Canonical spec; the rotation parameters appear only when the codec rotates."""
        params = self.params if self.rotate else {k: v for k, v in self.params.items() if k not in ROTATE_PARAMS}
        return self.name + ":" + ",".join(f"{k}={_fmt(v)}" for k, v in params.items())

    def _validate(self) -> None:
        self._check_block(8, MAX_BLOCK, "64, 256, 4096")
        block = self.params["block"]
        for key in ("seed", "rotate_seed"):
            if not 0 <= self.params.get(key, 0) <= _U32:
                raise PolicyError(f"codec {self.name!r}: {key}={self.params[key]} must be in [0, 2^32)")
        if self.rotate and (block & (block - 1) or block > MAX_ROTATE_BLOCK):
            raise PolicyError(
                f"codec {self.name!r}: rotate=hadamard needs block to be a power of two between 8 and "
                f"{MAX_ROTATE_BLOCK}, got block={block}"
            )

    @property
    def align_numel(self) -> int:
        return self.block

    # --- declared properties (base.Codec): determinism and the documented error bound ---------------
    @property
    def deterministic(self) -> bool:
        return not self.stochastic

    def _step_fraction(self) -> float:
        """Error per element as a fraction of the absmax of the (rotated) block: round to nearest moves a
        value by at most half a step (scale = absmax / qmax), stochastic rounding by less than one step."""
        return 1.0 / self.qmax if self.stochastic else 0.5 / self.qmax

    #: fp32 rounding on top of the ideal quantizer: the scale fl(absmax / qmax), x / scale and q * scale
    #: each round by 2^-24 relative, i.e. <= 3 * 2^-24 * absmax = 3 * 2^-24 * 2 qmax steps of the bound
    #: (int8: 4.5e-5 of it); (1 + 2^-14) covers it
    _FP32_MARGIN = 1.0 + 2.0**-14
    #: absolute floor: a block whose scale is subnormal (absmax < qmax 2^-126) rounds its scale and clamps
    #: (module docstring, "Tiny blocks"); its error stays below qmax * 2^-149 * 2 < 2^-130
    _ERROR_FLOOR = 2.0**-130

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

    # --- batches of rows, torch backend ----------------------------------------------------------
    # One implementation: plain encode/decode are one row of numel values. The work is cut into pieces
    # of ~_CHUNK_NUMEL values (whole rows, or whole blocks of one long row), each contiguous in the padded
    # flat array, so temporaries stay cache-resident and the number of torch ops grows with the data, not
    # with the number of rows.
    def _chunk_numel(self) -> int:
        return max(self.block, _CHUNK_NUMEL // self.block * self.block)

    def _pieces(self, row_numel: int, limit: int):
        """(r0, r1, j0, j1): rows r0..r1-1, row elements j0..j1-1 (j0 a multiple of ``block``) of a
        [rows, row_numel] array, covering its flat indices below ``limit``."""
        chunk = self._chunk_numel()
        if row_numel <= chunk:
            per, full = chunk // row_numel, limit // row_numel
            for r0 in range(0, full, per):
                yield r0, min(r0 + per, full), 0, row_numel
            if limit % row_numel:
                yield full, full + 1, 0, limit % row_numel
        else:
            for r in range(-(-limit // row_numel)):
                end = min(row_numel, limit - r * row_numel)
                for j0 in range(0, end, chunk):
                    yield r, r + 1, j0, min(j0 + chunk, end)

    def _blocks(self, t: torch.Tensor) -> list[tuple[torch.Tensor, slice]]:
        """A [nr, L] view whose rows start on a block, as [(full blocks [nr, nfull, block], their block
        slice), (the partial last block [nr, 1, tail], its slice)]."""
        nr, length = t.shape
        block = self.block
        nfull = length // block
        parts = []
        if nfull:
            parts.append((t[:, : nfull * block].view(nr, nfull, block), slice(0, nfull)))
        if length % block:
            parts.append((t[:, nfull * block :].view(nr, 1, length % block), slice(nfull, nfull + 1)))
        return parts

    def _quantize(self, x: torch.Tensor, v: torch.Tensor, scales: torch.Tensor, q: torch.Tensor, index0: int) -> None:
        """Quantize x ([nr, L] fp32, rows starting on a block) into q ([nr, L] int8) and scales ([nr,
        ceil(L/block)] fp32, contiguous). v: contiguous fp32 scratch [nr, L]; index0: stochastic index of
        x[0, 0] (the rows are consecutive in the flat array)."""
        qmax = float(self.qmax)
        torch.abs(x, out=v)
        for rows, sl in self._blocks(v):
            scales[:, sl] = rows.amax(dim=2)  # NaN propagates, Inf stays Inf
        finite = torch.isfinite(scales)
        scales.div_(qmax)
        # absmax within ~1 ulp of FLT_MAX: qmax * scale would decode to Inf; use the next smaller scale
        overflow = torch.isinf(scales * qmax) & finite
        must_clamp = bool(overflow.any())
        if must_clamp:
            scales[overflow] = torch.nextafter(scales[overflow], torch.zeros(()))
        divisor = torch.where(scales > 0, scales, math.inf)  # 0 and NaN -> inf: q becomes exactly 0
        all_finite = bool(finite.all())
        if not all_finite:
            scales.masked_fill_(~finite, math.nan)
        for (rows_x, sl), (rows_v, _) in zip(self._blocks(x), self._blocks(v)):
            torch.div(rows_x, divisor[:, sl, None], out=rows_v)
        if not all_finite:  # Inf/Inf and NaN/Inf are NaN: those blocks quantize to 0
            for rows_v, sl in self._blocks(v):
                rows_v.masked_fill_(~finite[:, sl, None], 0.0)
        if self.stochastic:
            v.add_(_uniform(self.params["seed"], index0, v.numel()).view_as(v))
            v.floor_().clamp_(-qmax, qmax)
        else:
            v.round_()  # half to even, as rintf
            # |x| / fl(absmax/qmax) <= qmax (1 + 2^-23) when the scale is normal, so rounding cannot leave
            # [-qmax, qmax]; only a subnormal scale (absmax < 2^-119) can overshoot
            if must_clamp or bool(((scales > 0) & (scales < _FLT_MIN_NORMAL)).any()):
                v.clamp_(-qmax, qmax)
        q.copy_(v)

    def _scale(self, v: torch.Tensor, scales: torch.Tensor) -> None:
        """v ([nr, L] q values as fp32) *= its blocks' scales ([nr, >= ceil(L/block)]): the fp32 decode."""
        for rows, sl in self._blocks(v):
            rows.mul_(scales[:, sl, None])

    def _q_values(self, v: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """v ([nr, L] fp32) = the values of the q fields ``q`` ([nr, L] int8, unpacked) before scaling."""
        return v.copy_(q)

    def _scale_view(self, rows: torch.Tensor, nblocks: int) -> torch.Tensor:
        """The stored scales of payload rows ``rows`` ([nr, nbytes] uint8) as [nr, nblocks]."""
        return rows[:, : self.scale_bytes * nblocks].view(self.scale_dtype)

    # rotate=hadamard (kernels/quant.cu, CqRot): y = H D x on whole blocks; decode x' = D H (y' * 2^-k)
    def _full_blocks(self, v: torch.Tensor):
        """The whole blocks of v ([nr, L], rows starting on a block) as [nr, nfull, block]: the rotated ones."""
        return [rows for rows, _ in self._blocks(v) if rows.shape[-1] == self.block]

    def _rotate(self, v: torch.Tensor) -> None:
        for rows in self._full_blocks(v):
            rows.view(torch.int32).bitwise_xor_(_rotation_sign_bits(self.params["rotate_seed"], self.block))
            _hadamard_(rows)

    def _unrotate(self, v: torch.Tensor) -> None:
        for rows in self._full_blocks(v):
            rows.mul_(2.0 ** -(self.block.bit_length() - 1))
            _hadamard_(rows)
            rows.view(torch.int32).bitwise_xor_(_rotation_sign_bits(self.params["rotate_seed"], self.block))

    def _encode_rows_torch(self, src, out, row_numel, feedback, salt) -> None:
        dst = aligned_like(out)
        self._salted(salt)._encode_pieces(src, dst, row_numel, feedback)
        if dst is not out:
            out.copy_(dst)

    def _encode_row_at(self, x: torch.Tensor, index0: int) -> torch.Tensor:
        """``encode(x)`` (torch backend) with the stochastic index of x[0] at ``index0``: row i of
        ``encode_rows`` is this of the padded row with index0 = i * row_numel (the per-row reference)."""
        out = empty_cpu(self.encoded_nbytes(x.numel(), x.dtype), torch.uint8).view(1, -1)
        self._encode_pieces(x, out, x.numel(), None, index0)
        return out.view(-1)

    def _encode_pieces(
        self, src: torch.Tensor, out: torch.Tensor, row_numel: int, feedback: torch.Tensor | None, index0: int = 0
    ) -> None:
        numel, dtype, rows, block = src.numel(), src.dtype, out.shape[0], self.block
        nb, scale_nbytes, _ = self._layout(row_numel)
        q_used = -(-row_numel * self.bits // 8)
        out[:, self.scale_bytes * nb : scale_nbytes].zero_()
        out[:, scale_nbytes + q_used :].zero_()
        scales_all = self._scale_view(out, nb)
        qsec = out[:, scale_nbytes : scale_nbytes + q_used]
        cap = min(self._chunk_numel(), rows * row_numel)
        f32 = torch.float32
        work = empty_cpu(cap, f32)  # |x|, x / scale, q; then the decode (feedback)
        comp = None  # x (+ residual) when x cannot be read in place
        if dtype != f32 or feedback is not None or numel < rows * row_numel:
            comp = empty_cpu(cap, f32)
        narrow = None if dtype == f32 or feedback is None else torch.empty(cap, dtype=dtype)
        sent_buf = None if narrow is None else torch.empty(cap, dtype=f32)
        scale_buf = torch.empty(-(-cap // block) + cap // row_numel + 1, dtype=self.scale_dtype)
        rot_buf = empty_cpu(cap, f32) if self.rotate else None
        if self.bits == 4:
            qbuf = torch.empty(cap + cap // row_numel + 1, dtype=torch.int8)
            pack_tmp = torch.empty(cap // 2 + cap // row_numel + 1, dtype=torch.int16)
        for r0, r1, j0, j1 in self._pieces(row_numel, rows * row_numel):
            nr, length = r1 - r0, j1 - j0
            e0, count = r0 * row_numel + j0, (r1 - r0) * (j1 - j0)
            have = max(0, min(count, numel - e0))
            if comp is None or (dtype == f32 and feedback is None and have == count):
                x = src[e0 : e0 + count]
            else:  # bf16/fp16 widen exactly; padding is zeros
                x = comp[:count]
                x[:have].copy_(src[e0 : e0 + have])
                x[have:].zero_()
                if feedback is not None:
                    x.add_(feedback[e0 : e0 + count])
            sent = x if narrow is None else sent_buf[:count].copy_(narrow[:count].copy_(x))  # c rounded to dtype
            nbs = -(-length // block)
            scales = scale_buf[: nr * nbs].view(nr, nbs)
            v = work[:count].view(nr, length)
            if self.bits == 8:
                q = qsec[r0:r1, j0:j1].view(torch.int8)
            else:
                even = length + length % 2
                qb = qbuf[: nr * even].view(nr, even)
                q = qb[:, :length]
            sent = sent.view(nr, length)
            if rot_buf is not None:
                sent = rot_buf[:count].view(nr, length).copy_(sent)
                self._rotate(sent)
            self._quantize(sent, v, scales, q, index0 + e0)
            scales_all[r0:r1, j0 // block : j0 // block + nbs].copy_(scales)
            if feedback is not None:  # residual = c - what the receivers decode (rounded to dtype)
                dec = self._q_values(v, q)  # before int4 packing overwrites q
                self._scale(dec, scales)
                if rot_buf is not None:
                    self._unrotate(dec)
                if narrow is not None:
                    dec.view(-1).copy_(narrow[:count].copy_(dec.view(-1)))
                r = feedback[e0 : e0 + count]
                torch.sub(x, dec.view(-1), out=r)
                r.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
                r[have:].zero_()
            if self.bits == 4:
                if length % 2:
                    qb[:, length] = 0
                # pack through int16 words (little-endian: low byte = even element):
                # byte = (low byte & 0x0F) | (high byte << 4), i.e. (word & 0x0F) | ((word >> 4) & 0xF0)
                words = qb.view(torch.int16)
                high = torch.bitwise_right_shift(words, 4, out=pack_tmp[: words.numel()].view_as(words))
                words.bitwise_and_(0x0F).bitwise_or_(high.bitwise_and_(0xF0))
                qsec[r0:r1, j0 // 2 : j0 // 2 + even // 2].copy_(words)

    def _dequantize(self, rows: torch.Tensor, numel: int, j0: int, j1: int, v: torch.Tensor, qwork) -> None:
        """fp32 decode of elements j0..j1-1 (j0 a multiple of block) of each payload row of ``rows``
        ([nr, nbytes], payloads of ``numel`` values) into v ([nr, j1 - j0], last dim contiguous)."""
        nblocks, scale_nbytes, _ = self._layout(numel)
        scales = self._scale_view(rows, nblocks)[:, j0 // self.block : -(-j1 // self.block)]
        qsec = rows[:, scale_nbytes:]
        if self.bits == 8:
            self._q_values(v, qsec[:, j0:j1].view(torch.int8))
        else:
            # unpack through int16 words (contiguous ops; little-endian: low byte = even element):
            # word = (sext(high nibble) << 8) | (sext(low nibble) & 0xFF)
            packed = qsec[:, j0 // 2 : (j1 + 1) // 2].view(torch.int8)
            shape, n = packed.shape, packed.numel()
            low = qwork[1][:n].view(shape).copy_(packed)  # the byte, sign-extended to int16
            words = torch.bitwise_right_shift(low, 4, out=qwork[0][:n].view(shape))
            words.bitwise_left_shift_(8)
            low.bitwise_left_shift_(12).bitwise_right_shift_(12).bitwise_and_(0xFF)
            words.bitwise_or_(low)
            v.copy_(words.view(torch.int8)[:, : j1 - j0])
        self._scale(v, scales)
        if self.rotate:
            self._unrotate(v)

    def _unpack_scratch(self, numel: int) -> torch.Tensor | None:
        return None if self.bits == 8 else torch.empty(2, numel, dtype=torch.int16)

    def _decode_rows_torch(self, payloads: torch.Tensor, out: torch.Tensor, row_numel: int) -> None:
        """Decode straight into ``out`` (fp32), or through one cache-sized fp32 piece (bf16/fp16)."""
        payloads = aligned(payloads)
        numel, dtype = out.numel(), out.dtype
        if self.rotate and numel % row_numel:  # a rotated block cut by numel is decoded whole, then clipped
            full = numel // row_numel
            if full:
                self._decode_rows_torch(payloads[:full], out[: full * row_numel], row_numel)
            last = torch.empty(row_numel, dtype=dtype)
            self._decode_rows_torch(payloads[full : full + 1], last, row_numel)
            out[full * row_numel :].copy_(last[: numel - full * row_numel])
            return
        cap = min(self._chunk_numel(), numel)
        work = None if dtype == torch.float32 else empty_cpu(cap, torch.float32)
        qwork = self._unpack_scratch(cap)
        for r0, r1, j0, j1 in self._pieces(row_numel, numel):
            nr, length = r1 - r0, j1 - j0
            e0 = r0 * row_numel + j0
            dst = out[e0 : e0 + nr * length].view(nr, length)
            v = dst if work is None else work[: nr * length].view(nr, length)
            self._dequantize(payloads[r0:r1], row_numel, j0, j1, v, qwork)
            if work is not None:
                dst.copy_(v)

    def _decode_sum_torch(self, payloads: torch.Tensor, numel: int, dtype: torch.dtype, out: torch.Tensor) -> None:
        """Row-order fp32 sum of the rows' decodes (each rounded to dtype first, as decode returns them).
        All p rows of a span are decoded in one pass; the sum is one ``index_add_`` per span, which on CPU
        adds the source rows into the accumulator in index order (torch's reductions have no fixed
        order), over a span that stays in cache: a constant number of ops whatever p."""
        payloads = aligned(payloads)
        p, block = payloads.shape[0], self.block
        span = min(numel, max(_SUM_SPAN_NUMEL, self._chunk_numel() // p) // block * block or block)
        work = empty_cpu(p * span, torch.float32)
        narrow = None if dtype == torch.float32 else torch.empty(p * span, dtype=dtype)
        qwork = self._unpack_scratch(p * span)
        zeros = torch.zeros(p, dtype=torch.long)
        for j0 in range(0, numel, span):
            j1 = min(numel, j0 + span)
            v = work[: p * (j1 - j0)].view(p, j1 - j0)
            self._dequantize(payloads, numel, j0, j1, v, qwork)
            if narrow is not None:
                v.view(-1).copy_(narrow[: v.numel()].copy_(v.view(-1)))
            out[j0:j1].zero_().view(1, -1).index_add_(0, zeros, v)

    # --- emulated backend (kernels/quant.cu built for the host) ---------------------------------
    def _host_fn(self, op: str, dtype: torch.dtype):
        fn = getattr(kernels.host_library("quant"), f"ccoll_host_{self.kernel_format}_{op}_{_DTYPE_NAMES[dtype]}")
        if fn.argtypes is None:
            i64, vp, i32, u32 = ctypes.c_longlong, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32
            fn.argtypes = {
                "encode_rows": [vp, i64, i64, i64, i64, i32, u32, vp, vp, i32, u32],
                "decode_rows": [vp, i64, i64, i64, i64, vp, i32, u32],
                "decode_sum": [vp, i64, i64, i64, i64, vp, i32, u32],
            }[op]
            fn.restype = None
        return fn

    def _encode_rows_emulated(self, src, out, row_numel, feedback, salt) -> None:
        enc, dst = self._salted(salt), aligned_like(out)
        self._host_fn("encode_rows", src.dtype)(
            src.data_ptr(), src.numel(), out.shape[0], row_numel, self.block, int(enc.stochastic),
            enc.params.get("seed", 0), None if feedback is None else feedback.data_ptr(), dst.data_ptr(),
            *self._rotate_args(),
        )
        if dst is not out:
            out.copy_(dst)

    def _decode_rows_emulated(self, payloads: torch.Tensor, out: torch.Tensor, row_numel: int) -> None:
        payloads = aligned(payloads)  # keep the (possibly copied) payloads alive during the call
        self._host_fn("decode_rows", out.dtype)(
            payloads.data_ptr(), payloads.shape[0], row_numel, out.numel(), self.block, out.data_ptr(),
            *self._rotate_args(),
        )

    def _decode_sum_emulated(self, payloads: torch.Tensor, numel: int, dtype: torch.dtype, out: torch.Tensor) -> None:
        payloads = aligned(payloads)
        self._host_fn("decode_sum", dtype)(
            payloads.data_ptr(), payloads.shape[0], payloads.shape[1], numel, self.block, out.data_ptr(),
            *self._rotate_args(),
        )

    def _rotate_args(self) -> tuple[int, int]:
        """The kernels' (rotate, rot_seed) arguments."""
        return int(self.rotate), self.params["rotate_seed"]

    # --- cupy backend (kernels/quant.cu through NVRTC, on torch's current stream) ---------------
    # One launch per call whatever the number of rows; temporaries (aligned copies) are freed after
    # the launch, which the caching allocator orders on the same stream.
    _THREADS = 256

    def _launch(self, op: str, dtype: torch.dtype, device: torch.device, nthreads: int, args: tuple) -> None:
        import numpy as np

        grid = max(1, min(-(-nthreads // self._THREADS), 1 << 20))  # kernels loop (grid-stride) beyond
        typed = tuple(
            a if isinstance(a, np.generic) else np.uint64(a) if isinstance(a, _Ptr) else np.int64(a) for a in args
        )
        kernels.launch("quant", f"ccoll_{self.kernel_format}_{op}_{_DTYPE_NAMES[dtype]}", grid, self._THREADS, typed,
                       device)

    def _team(self) -> int:
        """Lanes per quant block in the encode kernel: a power of two <= 32 covering its q words."""
        words = self.block * self.bits // 32
        return min(32, 1 << (words - 1).bit_length())

    def _encode_rows_cupy(self, src, out, row_numel, feedback, salt) -> None:
        import numpy as np

        enc, dst = self._salted(salt), aligned_like(out)
        rows, team = out.shape[0], self._team()
        self._launch(
            "encode_rows", src.dtype, src.device, rows * -(-row_numel // self.block) * team,
            (_Ptr(src.data_ptr()), src.numel(), rows, row_numel, self.block, np.int32(team),
             np.int32(enc.stochastic), np.uint32(enc.params.get("seed", 0)),
             _Ptr(0 if feedback is None else feedback.data_ptr()), _Ptr(dst.data_ptr()),
             np.int32(self.rotate), np.uint32(self.params["rotate_seed"])),
        )
        if dst is not out:
            out.copy_(dst)

    def _decode_rows_cupy(self, payloads: torch.Tensor, out: torch.Tensor, row_numel: int) -> None:
        import numpy as np

        payloads = aligned(payloads)
        rows = min(payloads.shape[0], -(-out.numel() // row_numel))
        if self.rotate:  # one team per block
            nthreads = rows * -(-row_numel // self.block) * self._team()
        else:  # one thread per q word
            nthreads = rows * -(-row_numel * self.bits // 32)
        self._launch("decode_rows", out.dtype, out.device, nthreads,
                     (_Ptr(payloads.data_ptr()), payloads.shape[0], row_numel, out.numel(), self.block,
                      _Ptr(out.data_ptr()), np.int32(self._team()), np.int32(self.rotate),
                      np.uint32(self.params["rotate_seed"])))

    def _decode_sum_cupy(self, payloads: torch.Tensor, numel: int, dtype: torch.dtype, out: torch.Tensor) -> None:
        import numpy as np

        payloads = aligned(payloads)
        nthreads = -(-numel // self.block) * self._team() if self.rotate else -(-numel * self.bits // 32)
        self._launch("decode_sum", dtype, payloads.device, nthreads,
                     (_Ptr(payloads.data_ptr()), payloads.shape[0], payloads.shape[1], numel, self.block,
                      _Ptr(out.data_ptr()), np.int32(self._team()), np.int32(self.rotate),
                      np.uint32(self.params["rotate_seed"])))


@functools.lru_cache(maxsize=None)
def _rotation_sign_bits(seed: int, block: int) -> torch.Tensor:
    """int32 masks (0 or the fp32 sign bit) of D for rotate_seed ``seed``: element i of every block is
    negated when mix32(i + key) is odd, key = mix32(seed ^ 0x5bd1e995) (kernels/quant.cu, CqRot)."""
    key = _mix32(seed ^ 0x5BD1E995)
    return torch.tensor([-(1 << 31) if _mix32(i + key) & 1 else 0 for i in range(block)], dtype=torch.int32)


def _hadamard_(t: torch.Tensor) -> None:
    """Unnormalised Walsh-Hadamard transform of the last dim of ``t`` (a power of two), in place: butterflies
    (a, b) -> (a + b, a - b) over the index bits in ascending order, the kernels' order. Each stage writes
    into the other of two buffers (two ops per stage, no temporary per stage)."""
    n, s = t.shape[-1], 1
    src, dst = t, torch.empty_like(t)
    while s < n:
        u, o = src.unflatten(-1, (n // (2 * s), 2, s)), dst.unflatten(-1, (n // (2 * s), 2, s))
        a, b = u.select(-2, 0), u.select(-2, 1)
        torch.add(a, b, out=o.select(-2, 0))
        torch.sub(a, b, out=o.select(-2, 1))
        src, dst = dst, src
        s *= 2
    if src is not t:
        t.copy_(src)


class _Ptr(int):
    """A device pointer argument (passed to the kernel as a 64-bit value)."""


_DTYPE_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}

#: every kernel of kernels/quant.cu this module launches (the NVRTC build check asserts each exists)
CUDA_KERNELS = tuple(
    f"ccoll_{fmt}_{op}_{name}"
    for fmt in ("int8", "int4", "fp8e4m3", "fp8e5m2")
    for op in ("encode_rows", "decode_rows", "decode_sum") for name in _DTYPE_NAMES.values()
)


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


#: fp8 element formats: (torch dtype, EMAX, largest finite value 1.75 * 2^EMAX)
_FP8_FORMATS = {
    "e4m3": (torch.float8_e4m3fn, 8, 448.0),
    "e5m2": (torch.float8_e5m2, 15, 57344.0),
}
#: E8M0 scale byte -> 2^(byte - 127) (byte 0: 2^-127, a subnormal fp32), byte 255 -> NaN
_E8M0 = torch.tensor([0x00400000] + [c << 23 for c in range(1, 255)] + [0x7FC00000], dtype=torch.int32).view(
    torch.float32
)


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

    def _quantize(self, x: torch.Tensor, v: torch.Tensor, scales: torch.Tensor, q: torch.Tensor, index0: int) -> None:
        """x ([nr, L] fp32) -> E8M0 codes (scales, [nr, nblocks] uint8) and fp8 bytes (q, [nr, L] int8 view);
        v: fp32 scratch. The bit arithmetic of kernels/quant.cu CqFp8::params, vectorised."""
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

    def _q_values(self, v: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return v.copy_(q.view(_FP8_FORMATS[self.params["format"]][0]))

    def _scale(self, v: torch.Tensor, scales: torch.Tensor) -> None:
        """v *= 2^e of each block (scales: E8M0 codes)."""
        super()._scale(v, _E8M0[scales.long()])
