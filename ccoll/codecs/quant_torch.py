"""The torch backend of the block quantizers (int8 / int4 / fp8): kernels/quant.cu's algorithm as
vectorised torch ops in the same fp32 operations and order, so it writes the same bytes (quant.py's
docstring specifies the format). A mixin of BlockQuantCodec: it reads the codec's ``block``, ``bits``,
``stochastic``, ``rotate``, layout and format hooks."""
from __future__ import annotations

import math
import threading

import torch

from .buffers import aligned, aligned_like, canonical_nan_, empty_cpu, narrow_
from .rowsum import add_rows_
from .quant_format import _hadamard_, _rotation_sign_bits, _uniform

_FLT_MIN_NORMAL = 2.0**-126
#: scales below this cannot overflow when multiplied by qmax (<= 127): the quantizer's fast path
_PLAIN_SCALE_LIMIT = 2.0**120
#: elements per torch-backend piece: temporaries stay cache-resident and no large scratch is allocated
_CHUNK_NUMEL = 1 << 20
#: least elements per row of one decode_sum span (fewer, longer adds when there are many rows)
_SUM_SPAN_NUMEL = 1 << 14
#: 1.5 * 2^23: for |v| < 2^22, v + _ROUND_MAGIC rounds v to the nearest integer k, ties to even (the sum
#: lies in [2^23, 2^24), where fp32's spacing is 1 and the add rounds to nearest even; _ROUND_MAGIC is
#: even), and its bit pattern is 0x4B400000 + k, whose low byte is k's (0x4B400000 ends in a zero byte):
#: the int32 -> int8 copy of those bits (two's complement, wraps) is k, for |k| <= 127 -- rintf's value,
#: one elementwise pass as ``round_`` was. Why not ``round_``: torch's rounding ops go through its
#: vectorised-math path, which splits a tensor over the thread pool from a few thousand values, and a busy
#: host makes each small call wait for a thread (measured 5-100x a plain add at 16K values).
_ROUND_MAGIC = 12582912.0

_SCRATCH = threading.local()


def _scratch(slot: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """This thread's reusable buffer named ``slot``: ``numel`` x ``dtype``, contents undefined. Why: a fresh
    multi-MiB temporary per call is fresh memory (the allocator maps it anew at these sizes), and faulting
    its pages in cost as much as the op that first wrote it (int8:block=256 encode_rows of 2^20 values with
    error feedback, one thread: 3.3 ms -> 2.4 ms). Pieces are at most ~_CHUNK_NUMEL values, so a thread
    keeps a few buffers of a few MiB. One slot per purpose within a call; no codec call nests in another."""
    pool = _SCRATCH.__dict__.setdefault("pool", {})
    nbytes = numel * dtype.itemsize
    buf = pool.get(slot)
    if buf is None or buf.numel() < nbytes:
        buf = pool[slot] = empty_cpu(nbytes, torch.uint8)
    return buf[:nbytes].view(dtype)


class QuantTorchBackend:
    """``_encode_rows_torch`` / ``_decode_rows_torch`` / ``_decode_sum_torch`` and the int formats' hooks
    (``_quantize``, ``_q_values``, ``_scale``) that fp8 overrides."""

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

    def _quantize(self, x: torch.Tensor, v: torch.Tensor, scales: torch.Tensor, q: torch.Tensor, index0: int) -> bool:
        """Quantize x ([nr, L] fp32, rows starting on a block) into q ([nr, L] int8) and scales ([nr,
        ceil(L/block)] fp32, contiguous). v: contiguous fp32 scratch [nr, L]; index0: stochastic index of
        x[0, 0] (the rows are consecutive in the flat array). Returns whether the piece was plain: every
        scale normal and below 2^120 (so x, its decode and their difference are finite)."""
        qmax = float(self.qmax)
        # absmax = max(amax, -amin): two read-only passes over x instead of |x| written out and read back
        # (torch.aminmax is one pass but, along a dim, ~8x slower than amax and amin together)
        lowest = torch.empty(scales.shape, dtype=scales.dtype)
        for rows, sl in self._blocks(x):
            scales[:, sl] = rows.amax(dim=2)  # NaN propagates, Inf stays Inf
            lowest[:, sl] = rows.amin(dim=2)
        torch.maximum(scales, lowest.neg_(), out=scales).add_(0.0)  # + 0.0: a block of -0 has absmax +0
        nonzero = scales != 0  # NaN included (masked below)
        scales.div_(qmax)
        # the common case, told by two reductions of the scales instead of a dozen elementwise tests: every
        # scale normal (no zero, tiny or non-finite block) and far below overflow
        plain = _FLT_MIN_NORMAL <= float(scales.amin()) and float(scales.amax()) < _PLAIN_SCALE_LIMIT
        must_clamp, all_finite = False, True
        if not plain:
            finite = torch.isfinite(scales)
            # absmax within ~1 ulp of FLT_MAX: qmax * scale would decode to Inf; use the next smaller scale
            overflow = torch.isinf(scales * qmax) & finite
            must_clamp = bool(overflow.any())
            if must_clamp:
                scales[overflow] = torch.nextafter(scales[overflow], torch.zeros(()))
            # a tiny block (absmax / qmax subnormal or 0): the smallest normal scale (kernels/quant.cu)
            scales.masked_fill_(nonzero & (scales < _FLT_MIN_NORMAL), _FLT_MIN_NORMAL)
            all_finite = bool(finite.all())
            if not all_finite:
                scales.masked_fill_(~finite, math.nan)
        # x * fl(1 / scale): one correctly rounded division per block (an all-zero block multiplies by 0;
        # a non-finite one's NaN products are masked below)
        inv = torch.ones_like(scales).div_(scales)
        if not plain:
            inv.masked_fill_(~nonzero, 0.0)
        for (rows_x, sl), (rows_v, _) in zip(self._blocks(x), self._blocks(v)):
            torch.mul(rows_x, inv[:, sl, None], out=rows_v)
        if not all_finite:  # Inf * 0, NaN * NaN are NaN: those blocks quantize to 0
            for rows_v, sl in self._blocks(v):
                rows_v.masked_fill_(~finite[:, sl, None], 0.0)
        if self.stochastic:
            v.add_(_uniform(self.params["seed"], index0, v.numel()).view_as(v))
            v.floor_().clamp_(-qmax, qmax)
        else:
            # |x| fl(1 / fl(absmax/qmax)) <= qmax (1 + 2^-22) (normal scale; a tiny block's 2^-126 only
            # lowers it), so rounding cannot leave [-qmax, qmax] unless the scale was lowered near FLT_MAX.
            # The clamp runs before the rounding here (rint(clamp(v)) = clamp(rint(v)): qmax is an integer
            # and rint is monotone), which also keeps |v| < 2^22 for the rounding by adding _ROUND_MAGIC
            if must_clamp:
                v.clamp_(-qmax, qmax)
            q.copy_(v.add_(_ROUND_MAGIC).view(torch.int32))  # half to even, as rintf; v is scratch after this
            return plain
        q.copy_(v)
        return plain

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
        work = _scratch("enc.work", cap, f32)  # x * inv, q; then the decode (feedback)
        comp = None  # x (+ residual) when x cannot be read in place
        if dtype != f32 or feedback is not None or numel < rows * row_numel:
            comp = _scratch("enc.comp", cap, f32)
        narrow = None if dtype == f32 or feedback is None else _scratch("enc.narrow", cap, dtype)
        sent_buf = None if narrow is None else _scratch("enc.sent", cap, f32)
        scale_buf = torch.empty(-(-cap // block) + cap // row_numel + 1, dtype=self.scale_dtype)
        rot_buf = _scratch("enc.rot", cap, f32) if self.rotate else None
        if self.bits == 4:
            qbuf = _scratch("enc.q", cap + cap // row_numel + 1, torch.int8)
            pack_tmp = _scratch("enc.pack", cap // 2 + cap // row_numel + 1, torch.int16)
        for r0, r1, j0, j1 in self._pieces(row_numel, rows * row_numel):
            nr, length = r1 - r0, j1 - j0
            e0, count = r0 * row_numel + j0, (r1 - r0) * (j1 - j0)
            have = max(0, min(count, numel - e0))
            if comp is None or (dtype == f32 and feedback is None and have == count):
                x = src[e0 : e0 + count]
            elif dtype == f32 and feedback is not None and have == count:  # c = x + residual in one pass
                x = torch.add(src[e0 : e0 + count], feedback[e0 : e0 + count], out=comp[:count])
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
            plain = self._quantize(sent, v, scales, q, index0 + e0)
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
                if not plain:  # a plain piece (every block finite, far from overflow) has finite residuals
                    r.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
                r[have:].zero_()
            if self.bits == 4:
                if length % 2:
                    qb[:, length] = 0
                # pack through int16 words (little-endian: low byte = even element's q, high byte = odd's):
                # w = word & 0x0F0F holds the two nibbles a byte apart; the low byte of w | (w >> 4) is the
                # packed byte (even element low), and the int16 -> uint8 copy keeps exactly that byte
                words = qb.view(torch.int16).bitwise_and_(0x0F0F)
                words.bitwise_or_(torch.bitwise_right_shift(words, 4, out=pack_tmp[: words.numel()].view_as(words)))
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
            # unpack through int16 words, bytewise (little-endian: low byte = even element), five contiguous
            # ops: the byte b zero-extended; (b | b << 4) & 0x0F0F puts its low nibble k in the low byte and
            # its high nibble in the high byte; (k + 0x78) ^ 0x78 per byte is k sign-extended from 4 bits
            # (k < 8: 0x78 | k -> k; k >= 8: 0x80 + k - 8 -> 0xF0 | k), with no carry between the bytes
            packed = qsec[:, j0 // 2 : (j1 + 1) // 2]
            shape, n = packed.shape, packed.numel()
            words = qwork[0][:n].view(shape).copy_(packed)
            words.bitwise_or_(torch.bitwise_left_shift(words, 4, out=qwork[1][:n].view(shape)))
            words.bitwise_and_(0x0F0F).add_(0x7878).bitwise_xor_(0x7878)
            v.copy_(words.view(torch.int8)[:, : j1 - j0])
        self._scale(v, scales)
        if self.rotate:
            self._unrotate(v)
            # a NaN block's values went through the butterflies' adds, subtracts and sign flips: one NaN pattern
            # again, as kernels/quant.cu's decode_rows stores after its inverse (x86 keeps an operand's sign)
            canonical_nan_(v)

    def _unpack_scratch(self, numel: int) -> torch.Tensor | None:
        return None if self.bits == 8 else _scratch("dec.unpack", 2 * numel, torch.int16).view(2, numel)

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
        work = None if dtype == torch.float32 else _scratch("dec.work", cap, torch.float32)
        qwork = self._unpack_scratch(cap)
        for r0, r1, j0, j1 in self._pieces(row_numel, numel):
            nr, length = r1 - r0, j1 - j0
            e0 = r0 * row_numel + j0
            dst = out[e0 : e0 + nr * length].view(nr, length)
            v = dst if work is None else work[: nr * length].view(nr, length)
            self._dequantize(payloads[r0:r1], row_numel, j0, j1, v, qwork)
            if work is not None:
                narrow_(dst, v)  # a NaN block's bf16 bits by the kernels' rule, not the CPU's cast path

    #: whether a decode can hold -0.0 (fp8 has a negative zero; the int formats' float(q) * scale never
    #: does). The sum starts from +0.0, so a row may be decoded straight into it only when it cannot.
    _decodes_negative_zero = False

    def _decode_sum_torch(self, payloads: torch.Tensor, numel: int, dtype: torch.dtype, out: torch.Tensor) -> None:
        """Row-order fp32 sum of the rows' decodes (each rounded to dtype first, as decode returns them).
        All p rows of a span are decoded in one pass; the sum (``rowsum.add_rows_``: one ``add_`` per row for few
        rows, one ``index_add_`` for many) adds the rows into the accumulator in row order (torch's
        reductions have no fixed order) over a span that stays in cache.

        Row 0 is decoded straight into ``out`` when 0.0 + decode is the decode (fp32 output, no -0.0: int
        formats, unrotated -- the rotation's signs and 2^-k can make -0.0): no zeroing pass, no scratch, and
        one add fewer per element; with two ranks flat.all_reduce sums one row, which is then a plain decode."""
        payloads = aligned(payloads)
        p, block = payloads.shape[0], self.block
        direct = dtype == torch.float32 and not self.rotate and not self._decodes_negative_zero
        # a NaN sum is 0x7FC00000 as the kernels write it; only a row rounded through bf16 / fp16 (torch's casts:
        # bf16 NaN 0xFFFF0000, and NaNs like 0x7FFFFFFF from the fp16 round trip on AVX-512) or un-rotated (a
        # sign flipped) can carry another NaN into it: the other rows' NaN decodes are that one
        canonical = dtype != torch.float32 or bool(self.rotate)
        rest = p - direct  # rows decoded into scratch and added
        span = min(numel, max(_SUM_SPAN_NUMEL, self._chunk_numel() // p) // block * block or block)
        work = _scratch("sum.work", rest * span, torch.float32) if rest else None
        narrow = None if dtype == torch.float32 else _scratch("sum.narrow", rest * span, dtype)
        qwork = self._unpack_scratch(max(rest, 1) * span)
        for j0 in range(0, numel, span):
            j1 = min(numel, j0 + span)
            acc = out[j0:j1].view(1, -1)
            if direct:
                self._dequantize(payloads[:1], numel, j0, j1, acc, qwork)
            if rest:
                v = work[: rest * (j1 - j0)].view(rest, j1 - j0)
                self._dequantize(payloads[p - rest:], numel, j0, j1, v, qwork)
                if narrow is not None:
                    v.view(-1).copy_(narrow[: v.numel()].copy_(v.view(-1)))
                if not direct:
                    acc.zero_()
                add_rows_(acc, v)
            if canonical:
                canonical_nan_(acc)
