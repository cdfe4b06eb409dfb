"""The "lossless" codec: exact (bit for bit) compression of bf16, fp16 and fp32 tensors, for the
dimensions that must stay exact (TP activations, PP activations and gradients: the paper's MZHybrid).

Why this scheme: the entropy of a real bf16/fp32 tensor sits in its exponents (a few binades per neighbourhood);
sign and mantissa bits are close to uniform. So each value's exponent field is coded as (exponent - block
minimum) in the block's bit width and the rest is sent raw: a fixed-width code per block that a GPU encodes
in two passes (group ranges, then packing at offsets from a prefix sum) and decodes in one, with no
entropy coder. The algorithm and the exact payload layout are specified once, in kernels/lossless.cu's
header comment; every backend produces the same bytes (tests/unit/test_lossless.py).

Spec: ``lossless`` or ``lossless:block=B`` (values per exponent base: a multiple of 32 in [32, 65536],
default 256 -- the best ratio on captured real tensors, see the report of issue 12).

Variable size (``variable_size = True``): the payload of a row holds ``used_nbytes`` bytes (its header's
first word; ``used_nbytes(rows)`` reads them) out of a capacity ``encoded_nbytes(numel, dtype)`` = raw
bytes + 16 (a row that would not shrink is stored raw). The batched API is unchanged: rows are capacity
wide, bytes past ``used`` are zero and are never read, so a collective moves only the used bytes
(ccoll/collectives/varsize.py) and places them at the start of a capacity-wide row to decode.

Exact: decode(encode(x)) has x's bits (NaN payloads, -0, subnormals, Inf included); ``decode_sum`` is the
fp32 row-order sum of the exact decodes (what codec "none" gives). Error feedback, when asked for, is the
cast residual of the reference semantics (zero for inputs of the codec's dtype). Corrupt payloads whose
header, block table or sizes disagree raise CodecError; the codec carries no checksum of the value bits.
"""
from __future__ import annotations

import sys
from typing import ClassVar

import torch

from ..errors import CodecError
from ..kernels import call as kernel_call
from .base import CODECS, Codec, Param, per_backend
from .buffers import aligned, aligned_like, round16
from .rowsum import add_rows_

if sys.byteorder != "little":  # the payload is little-endian; the torch backend packs through integer views
    raise ImportError("ccoll.codecs.lossless needs a little-endian host")

MAX_BLOCK = 1 << 16
#: a row's capacity is stored in a 32-bit header word
MAX_ROW_NBYTES = (1 << 31) - 1
_HEADER_NBYTES = 16
_RAW, _CODED = 1, 0

#: (value bits W, exponent bits E) per dtype; the remainder (mantissa and sign) is R = W - E bits
_FIELDS = {torch.bfloat16: (16, 8), torch.float16: (16, 5), torch.float32: (32, 8)}
_INT_VIEW = {16: torch.int16, 32: torch.int32}
#: every kernel of kernels/lossless.cu this module launches (make kernels-check asserts each exists)
CUDA_KERNELS = kernel_call.cuda_kernels("lossless")


def _layout(row_numel: int, block: int, rem_bits: int) -> tuple[int, int, int, int, int, int]:
    """(groups, blocks, desc, offs, rem, exp): counts and section byte offsets of a coded row (LlLayout)."""
    groups, blocks = -(-row_numel // 32), -(-row_numel // block)
    desc = _HEADER_NBYTES
    offs = desc + round16(4 * blocks)
    rem = offs + round16(4 * blocks)
    return groups, blocks, desc, offs, rem, rem + round16(4 * groups * rem_bits)


def _bit_length(d: torch.Tensor, max_bits: int) -> torch.Tensor:
    """Bit length of each value of ``d`` (0 <= d < 2^max_bits), as int32."""
    powers = torch.tensor([1 << k for k in range(max_bits)], dtype=d.dtype, device=d.device)
    return (d.unsqueeze(-1) >= powers).sum(-1, dtype=torch.int32)


def _pack32(vals: torch.Tensor, k: int) -> torch.Tensor:
    """[N, 32] values of k bits (int32) -> [N, k] int32 words (value j at bits j*k.. of the group's
    little-endian bit stream; ll_pack32). Whole bytes are byte views; other widths OR each value's 64-bit
    shifted copy into the word where it starts (32 column ops), then fold each word's overflow into the next."""
    n = vals.shape[0]
    if k in (8, 16, 24):
        nbytes = k // 8
        b = torch.stack([(vals >> (8 * i)) & 0xFF for i in range(nbytes)], -1) if nbytes > 1 else vals
        return b.to(torch.uint8).reshape(n, 32 * nbytes).view(torch.int32)
    cols = vals.t().to(torch.int64)  # [32, N]: one contiguous row per value position
    acc = torch.zeros(k + 1, n, dtype=torch.int64, device=vals.device)
    for j in range(32):
        acc[j * k // 32].bitwise_or_(cols[j] << (j * k % 32))
    words = (acc[:k] & 0xFFFFFFFF) | (torch.cat([acc[:1] * 0, acc[:k - 1]]) >> 32)
    return words.to(torch.int32).t().contiguous()


def _unpack32(words: torch.Tensor, k: int) -> torch.Tensor:
    """[N, k] int32 words -> [N, 32] int32 values of k bits (ll_unpack32)."""
    n = words.shape[0]
    if k in (8, 16, 24):
        b = words.contiguous().view(torch.uint8).to(torch.int32).view(n, 32, k // 8)
        return sum(b[..., i] << (8 * i) for i in range(k // 8))
    w = words.t().to(torch.int64) & 0xFFFFFFFF  # [k, N] as unsigned
    w = torch.cat([w, torch.zeros(1, n, dtype=torch.int64, device=words.device)])
    out = torch.empty(32, n, dtype=torch.int64, device=words.device)
    for j in range(32):
        at, shift = j * k // 32, j * k % 32
        torch.bitwise_or(w[at] >> shift, w[at + 1] << (32 - shift), out=out[j])
    return (out & ((1 << k) - 1)).to(torch.int32).t()


@CODECS.register("lossless")
@per_backend("with", ("encode_rows", "decode_rows"), ("torch", "emulated", "cupy"))
@per_backend("kernel", ("range", "pack", "unpack"))
class LosslessCodec(Codec):
    """Exact exponent-plane coding of bf16/fp16/fp32; variable payload size (see the module docstring)."""

    name = "lossless"
    lossy = False
    variable_size: ClassVar[bool] = True
    float_bits_on_wire = True
    EXAMPLE_SPECS = ("lossless",)
    PARAMS = {"block": Param(int, 256, doc="values per exponent base: a multiple of 32 in [32, 65536]")}
    dtypes = (torch.float32, torch.bfloat16, torch.float16)

    @property
    def block(self) -> int:
        return self.params["block"]

    def _validate(self) -> None:
        self._check_block(32, MAX_BLOCK, "256, 1024")

    def encoded_nbytes(self, numel: int, dtype: torch.dtype) -> int:
        """The capacity of a payload of ``numel`` values: raw bytes + the 16-byte header, padded to 16."""
        self.check_dtype(dtype)
        if numel < 0:
            raise CodecError(f"codec {self.spec!r}: numel must be >= 0, got {numel}")
        return _HEADER_NBYTES + round16(numel * dtype.itemsize)

    max_encoded_nbytes = encoded_nbytes

    def used_nbytes(self, payloads: torch.Tensor) -> list[int]:
        """The bytes each row of ``payloads`` ([rows, >= 16] uint8, made by ``encode_rows``) really uses: its
        header's first word. On CUDA this reads the headers to the host (one synchronisation)."""
        if payloads.dim() != 2 or payloads.dtype != torch.uint8 or payloads.shape[1] < _HEADER_NBYTES:
            raise CodecError("used_nbytes expects [rows, nbytes] uint8 payloads of at least 16 bytes")
        head = payloads[:, :4].cpu().contiguous().view(torch.int32).view(-1)
        return head.tolist()

    # --- encode: shared glue, per-backend group passes -----------------------------------------------
    def _check_row(self, row_numel: int, dtype: torch.dtype) -> None:
        if self.encoded_nbytes(row_numel, dtype) > MAX_ROW_NBYTES:
            raise CodecError(f"codec {self.spec!r}: a row of {row_numel} x {dtype} exceeds 2 GiB; use smaller rows")

    def _encode_rows_with(self, backend: str, src, out, row_numel, feedback, salt) -> None:
        self._check_row(row_numel, src.dtype)
        if feedback is not None:  # the reference semantics: encode c = padded src + residual, rounded to dtype
            n = src.numel()
            comp = feedback.clone()
            comp[:n] += src.to(feedback.dtype)
            src = comp.to(src.dtype)
            feedback.copy_((comp - src.to(feedback.dtype)).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0))
            feedback[n:].zero_()
        dst = aligned_like(out)
        W, E = _FIELDS[src.dtype]
        R = W - E
        rows, block = out.shape[0], self.block
        groups, blocks, desc_at, offs_at, _, exp_at = _layout(row_numel, block, R)
        gpb = block // 32
        ranges = torch.empty(rows * groups, dtype=torch.int32, device=src.device)
        getattr(self, f"_range_{backend}")(src, rows, row_numel, ranges)
        ranges = ranges.view(rows, groups)
        pad = blocks * gpb - groups
        lo = torch.nn.functional.pad(ranges & 0xFFFF, (0, pad), value=0xFFFF).view(rows, blocks, gpb).amin(-1)
        hi = torch.nn.functional.pad(ranges >> 16, (0, pad), value=0).view(rows, blocks, gpb).amax(-1)
        width = _bit_length(hi - lo, E)
        ngroups = torch.full((blocks,), gpb, dtype=torch.int64, device=src.device)
        ngroups[-1] = groups - (blocks - 1) * gpb
        nwords = ngroups * width  # [rows, blocks] int64
        ends = torch.cumsum(nwords, -1)
        coded = exp_at + (4 * ends[:, -1] + 15) // 16 * 16
        raw_nbytes = out.shape[1]
        mode = (coded >= raw_nbytes).to(torch.int32)
        dst.zero_()
        header = dst[:, :_HEADER_NBYTES].view(torch.int32)
        header[:, 0] = torch.where(mode == _RAW, raw_nbytes, coded).to(torch.int32)
        header[:, 1] = mode
        header[:, 2] = row_numel
        header[:, 3] = block
        coded_rows = (mode == _CODED).unsqueeze(-1)
        dst[:, desc_at:desc_at + 4 * blocks].view(torch.int32).copy_(torch.where(coded_rows, lo | (width << 8), 0))
        dst[:, offs_at:offs_at + 4 * blocks].view(torch.int32).copy_(torch.where(coded_rows, ends - nwords, 0))
        getattr(self, f"_pack_{backend}")(src, dst, row_numel)
        if dst is not out:
            out.copy_(dst)

    # --- decode: shared validation, per-backend group pass ---------------------------------------------
    def _check_headers(self, payloads: torch.Tensor, rows: int, row_numel: int, dtype: torch.dtype) -> None:
        """CodecError unless the first ``rows`` rows have consistent headers and block tables (what the
        decode kernels trust: sizes, mode, block, offsets)."""
        W, E = _FIELDS[dtype]
        groups, blocks, desc_at, offs_at, _, exp_at = _layout(row_numel, self.block, W - E)
        cap = payloads.shape[1]
        head = payloads[:rows, :_HEADER_NBYTES].cpu().contiguous().view(torch.int32).to(torch.int64)
        used, mode, n, block = head.unbind(-1)
        bad = (n != row_numel) | (block != self.block) | ((mode != _RAW) & (mode != _CODED))
        bad |= (mode == _RAW) & (used != cap)
        coded = (mode == _CODED) & ~bad
        if bool(coded.any()):
            if cap < exp_at:
                bad |= coded
            else:
                tab = payloads[:rows, desc_at:desc_at + 4 * blocks].contiguous().view(torch.int32).to(torch.int64)
                offs = payloads[:rows, offs_at:offs_at + 4 * blocks].contiguous().view(torch.int32).to(torch.int64)
                base, width = (tab & 0xFF).cpu(), (tab >> 8).cpu()
                ngroups = torch.full((blocks,), self.block // 32, dtype=torch.int64)
                ngroups[-1] = groups - (blocks - 1) * (self.block // 32)
                nwords = ngroups * width
                ends = torch.cumsum(nwords, -1)
                row_bad = ((width > E) | (base >= 1 << E) | (offs.cpu() != ends - nwords)).any(-1)
                row_bad |= used != exp_at + (4 * ends[:, -1] + 15) // 16 * 16
                bad |= coded & (row_bad | (used > cap))
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            raise CodecError(
                f"codec {self.spec!r}: payload row {i} is not a lossless payload of {row_numel} x {dtype} "
                f"(header used={int(used[i])} mode={int(mode[i])} numel={int(n[i])} block={int(block[i])}, "
                f"row capacity {cap}, or an inconsistent block table)"
            )

    def _decode_rows_with(self, backend: str, payloads, out, row_numel) -> None:
        payloads = aligned(payloads)
        rows = min(payloads.shape[0], -(-out.numel() // row_numel))
        self._check_headers(payloads, rows, row_numel, out.dtype)
        getattr(self, f"_unpack_{backend}")(payloads, out, row_numel)

    def _decode_sum_any(self, payloads, numel, dtype, out) -> None:
        """Row-order fp32 sum of the exact decodes (as codec "none"): one batched decode, ``rowsum.add_rows_``
        (CPU: rows added in row order) or an outer ``cumsum`` (CUDA: sequential in fp32)."""
        p = payloads.shape[0]
        rows = torch.empty(p * numel, dtype=dtype, device=payloads.device)
        self.decode_rows(payloads, rows, numel)
        rows = rows.view(p, numel).to(torch.float32)
        if rows.device.type == "cuda":
            out.copy_(torch.cumsum(rows, 0)[-1])
            return
        out.zero_()
        add_rows_(out.view(1, numel), rows)

    # --- torch backend: the group passes as vectorised integer ops ------------------------------------
    def _fields(self, src: torch.Tensor, rows: int, row_numel: int):
        """(e, r, valid) of the padded [rows, groups * 32] value grid: exponent, remainder (int32) and
        whether the slot holds a row value (slots past row_numel do not; values past src's end are 0)."""
        W, E = _FIELDS[src.dtype]
        R = W - E
        groups = -(-row_numel // 32)
        u = torch.zeros(rows * row_numel, dtype=torch.int32)
        u[: src.numel()] = src.view(_INT_VIEW[W]).to(torch.int32)
        u = torch.nn.functional.pad(u.view(rows, row_numel), (0, groups * 32 - row_numel))
        if W == 16:
            u &= 0xFFFF
            v = ((u << 1) | (u >> 15)) & 0xFFFF
        else:
            v = (u << 1) | ((u >> 31) & 1)
        e = (v >> R) & ((1 << E) - 1)
        r = v & ((1 << R) - 1)
        valid = (torch.arange(groups * 32) < row_numel).expand(rows, -1)
        return e, r, valid

    def _range_torch(self, src, rows, row_numel, ranges) -> None:
        e, _, valid = self._fields(src, rows, row_numel)
        lo = torch.where(valid, e, 0xFFFF).view(rows, -1, 32).amin(-1)
        hi = torch.where(valid, e, 0).view(rows, -1, 32).amax(-1)
        ranges.copy_((lo | (hi << 16)).view(-1))

    def _pack_torch(self, src, dst, row_numel) -> None:
        W, E = _FIELDS[src.dtype]
        R = W - E
        rows, cap, block = dst.shape[0], dst.shape[1], self.block
        groups, blocks, desc_at, offs_at, rem_at, exp_at = _layout(row_numel, block, R)
        header = dst[:, :_HEADER_NBYTES].view(torch.int32)
        raw = header[:, 1] == _RAW
        for i in raw.nonzero().view(-1).tolist():
            lo, hi = i * row_numel, min((i + 1) * row_numel, src.numel())
            if hi > lo:
                dst[i, 16:16 + (hi - lo) * src.dtype.itemsize].copy_(src[lo:hi].view(torch.uint8))
        coded = (~raw).nonzero().view(-1)
        if coded.numel() == 0:
            return
        e, r, valid = self._fields(src, rows, row_numel)
        e, r, valid = e[coded], r[coded], valid[coded]
        nr = coded.numel()
        desc = dst[coded, desc_at:desc_at + 4 * blocks].contiguous().view(torch.int32)
        offs = dst[coded, offs_at:offs_at + 4 * blocks].contiguous().view(torch.int32).to(torch.int64)
        base, width = desc & 0xFF, desc >> 8
        g = torch.arange(groups)
        gb = g * 32 // block  # block of each group
        words = dst.view(-1).view(torch.int32) if dst.data_ptr() % 4 == 0 else None
        assert words is not None and cap % 4 == 0
        row_word0 = (coded * (cap // 4)).view(nr, 1)
        # remainder plane: fixed R words per group
        rem = _pack32(torch.where(valid, r, 0).view(nr * groups, 32), R).view(nr, groups * R)
        words.view(rows, cap // 4)[coded, rem_at // 4:rem_at // 4 + groups * R] = rem
        # exponent plane: per block width, groups at their prefix-summed offsets
        delta = torch.where(valid, e - base[:, gb].repeat_interleave(32, -1), 0).view(nr, groups, 32)
        gwidth = width[:, gb]  # [nr, groups]
        gword = exp_at // 4 + offs[:, gb] + (g - gb * (block // 32)) * gwidth  # first word of each group
        for k in gwidth.unique().tolist():
            if k == 0:
                continue
            sel = gwidth == k
            packed = _pack32(delta[sel], k)  # [nsel, k]
            at = (row_word0 + gword)[sel].unsqueeze(-1) + torch.arange(k)
            words[at.view(-1)] = packed.view(-1)

    def _unpack_torch(self, payloads, out, row_numel) -> None:
        W, E = _FIELDS[out.dtype]
        R = W - E
        cap, block, numel = payloads.shape[1], self.block, out.numel()
        rows = min(payloads.shape[0], -(-numel // row_numel))
        groups, blocks, desc_at, offs_at, rem_at, exp_at = _layout(row_numel, block, R)
        u = torch.empty(rows, groups * 32, dtype=torch.int32)
        header = payloads[:rows, :_HEADER_NBYTES].contiguous().view(torch.int32)
        raw = header[:, 1] == _RAW
        for i in raw.nonzero().view(-1).tolist():
            u[i, :row_numel] = payloads[i, 16:16 + row_numel * out.dtype.itemsize].contiguous().view(
                _INT_VIEW[W]).to(torch.int32)
        coded = (~raw).nonzero().view(-1)
        if coded.numel():
            nr = coded.numel()
            words = payloads[coded].contiguous().view(torch.int32)  # [nr, cap / 4]
            desc = words[:, desc_at // 4:desc_at // 4 + blocks]
            offs = words[:, offs_at // 4:offs_at // 4 + blocks].to(torch.int64)
            base, width = desc & 0xFF, desc >> 8
            r = _unpack32(words[:, rem_at // 4:rem_at // 4 + groups * R].reshape(nr * groups, R), R).view(nr, groups, 32)
            g = torch.arange(groups)
            gb = g * 32 // block
            gwidth = width[:, gb]
            gword = exp_at // 4 + offs[:, gb] + (g - gb * (block // 32)) * gwidth
            delta = torch.zeros(nr, groups, 32, dtype=torch.int32)
            flat = words.view(-1)
            row_word0 = (torch.arange(nr) * (cap // 4)).view(nr, 1)
            for k in gwidth.unique().tolist():
                if k == 0:
                    continue
                sel = gwidth == k
                at = (row_word0 + gword)[sel].unsqueeze(-1) + torch.arange(k)
                delta[sel] = _unpack32(flat[at.view(-1)].view(-1, k), k)
            e = (delta + base[:, gb].unsqueeze(-1)) & ((1 << E) - 1)
            v = (e << R) | r
            if W == 16:
                uu = (v >> 1) | ((v & 1) << 15)
            else:
                uu = ((v >> 1) & 0x7FFFFFFF) | (v << 31)
            u[coded] = uu.view(nr, groups * 32)
        flat_u = u[:, :row_numel].reshape(-1)[:numel]
        out.view(_INT_VIEW[W]).copy_(flat_u.to(_INT_VIEW[W]) if W == 32 else flat_u.to(torch.int16))

    # --- kernel backends (kernels/lossless.cu on the host build or a GPU, one launch point) ----------------
    def _range_kernel(self, backend: str, src, rows, row_numel, ranges) -> None:
        kernel_call.call(backend, "lossless", "lossless", "range", src.dtype, src.device, rows * -(-row_numel // 32),
                         src, src.numel(), rows, row_numel, ranges)

    def _pack_kernel(self, backend: str, src, dst, row_numel) -> None:
        kernel_call.call(backend, "lossless", "lossless", "pack", src.dtype, src.device,
                         dst.shape[0] * -(-row_numel // 32),
                         src, src.numel(), dst.shape[0], row_numel, self.block, dst.shape[1], dst)

    def _unpack_kernel(self, backend: str, payloads, out, row_numel) -> None:
        kernel_call.call(backend, "lossless", "lossless", "decode", out.dtype, out.device,
                         payloads.shape[0] * -(-row_numel // 32),
                         payloads, payloads.shape[0], payloads.shape[1], row_numel, out.numel(), self.block, out)

    # --- the Codec hooks: every backend through the same glue (_encode_rows_with / _decode_rows_with) -----
    _decode_sum_torch = _decode_sum_emulated = _decode_sum_cupy = _decode_sum_any
