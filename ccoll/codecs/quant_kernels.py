"""The kernel backends of the block quantizers: kernels/quant.cu on the host build ("emulated") or on a GPU
("cupy"), both through the one launch point ccoll.kernels.call (one argument list per op, the CUDA
kernel's). One launch per call whatever the number of rows; temporaries (aligned copies) are freed after
the launch, which the caching allocator orders on the same stream. A mixin of BlockQuantCodec."""
from __future__ import annotations

import torch

from ..kernels import call as kernel_call
from .base import per_backend
from .buffers import aligned, aligned_like


@per_backend("kernel", ("encode_rows", "decode_rows", "decode_sum"))
class QuantKernelBackend:
    """``_encode_rows_<b>`` / ``_decode_rows_<b>`` / ``_decode_sum_<b>`` for b in emulated, cupy."""

    #: q words per 16-byte payload group: the plain kernels' unit of work per thread (kernels/quant.cu
    #: CQ_GROUP_WORDS)
    GROUP_WORDS = 4

    def _team(self) -> int:
        """Lanes per quant block in the rotate=hadamard kernels (encode and decodes: the team holds the whole
        block in registers): a power of two <= 32 covering its q words. The plain encode uses _encode_team."""
        words = self.block * self.bits // 32
        return min(32, 1 << (words - 1).bit_length())

    #: q words per lane per block the plain encode aims at: its per-block work (the unit's indices, the team
    #: max, the scale) is then spread over 8 words (32 values for int8 / fp8, 64 for int4) instead of 1 or 2
    WORDS_PER_LANE = 8
    #: bytes one lane's load instruction reads: the kernel's 16-byte vector loads (a chunk of V words; an
    #: int4 f32 word of 32 bytes is two of them)
    LANE_LOAD_NBYTES = 16
    #: bytes a team should read per load instruction: half a 128-byte line. Why not a whole line (8 lanes):
    #: fp8's MX block 32 has 8 words, so f32 then had one word = 4 values per lane to spread the per-block
    #: work over (indices, team max, scale: ~170 instructions; kernels/quant.cu's header), ~66 per value or
    #: ~53% of copy bandwidth at full issue; 4 lanes of 2 words: ~43, ~80%. Why not fewer: the encode reads
    #: its input twice (absmax, then quantize), ~29 B per clock per SM of L1 loads at H200's HBM rate; at 64
    #: bytes per line and load instruction (an L1 wavefront per line) that is ~0.45 wavefronts per clock, at
    #: 32 (a team of 2) ~0.9, against ~1 per clock (an estimate from the published L1 design, not measured).
    #: int4's f32 teams of 4 read 64 bytes of a line per instruction too (lanes 32 bytes apart).
    TEAM_LOAD_NBYTES = 64

    def _encode_team(self, dtype: torch.dtype) -> int:
        """Lanes per quant block in the plain encode kernel (kernels/quant.cu ``block``): a power of two <= 32
        giving each lane up to ``WORDS_PER_LANE`` q words, but at least ``TEAM_LOAD_NBYTES`` of input per
        team load instruction (4 lanes) when the block has that many 16-byte loads. A lane's unit is a 16-byte
        load: 2 words where a word is 8 bytes (int8 / fp8 of bf16 / f16; the kernel's V)."""
        words = self.block * self.bits // 32
        word_nbytes = (32 // self.bits) * dtype.itemsize
        per_load = 2 if word_nbytes == 8 else 1
        chunks = words // per_load
        team = max(-(-words // self.WORDS_PER_LANE), self.TEAM_LOAD_NBYTES // self.LANE_LOAD_NBYTES)
        return min(32, 1 << (chunks - 1).bit_length(), 1 << (team - 1).bit_length())

    def _groups(self, numel: int, group_words: int = GROUP_WORDS) -> int:
        """q groups of ``group_words`` words of a payload of ``numel`` values: the plain decodes' threads."""
        return -(-(-(-numel * self.bits // 32)) // group_words)

    @property
    def _sum_group_words(self) -> int:
        """q words per decode_sum thread (kernels/quant.cu CqDecodeSum::GW): 16 values per thread, so int4's
        8-byte groups leave registers for 4 rows of loads in flight."""
        return 2 if self.bits == 4 else self.GROUP_WORDS

    def _rot(self) -> tuple:
        """The rotate=hadamard instantiation's trailing argument (its sign seed); () for the plain kernels."""
        return (self.params["rotate_seed"],) if self.rotate else ()

    def _rot_words(self) -> int:
        """q words per lane of a rotate=hadamard team (kernels/quant.cu CqRotated): 1 for blocks of <= 32 words,
        else words / 32 (2, 4, 8; int4 up to 4: ccoll/kernels/call.py ROT_WORDS)."""
        return self.block * self.bits // 32 // self._team()

    def _op(self, op: str) -> str:
        """The kernel of ``op``: the plain instantiation, or ``<op>_rot_w<W>`` for rotate=hadamard."""
        return f"{op}_rot_w{self._rot_words()}" if self.rotate else op

    def _encode_rows_kernel(self, backend: str, src, out, row_numel, feedback, salt) -> None:
        enc, dst = self._salted(salt), aligned_like(out)
        rows = out.shape[0]
        team = self._team() if self.rotate else self._encode_team(src.dtype)
        kernel_call.call(
            backend, "quant", self.kernel_format, self._op("encode_rows"), src.dtype, src.device,
            rows * -(-row_numel // self.block) * team,
            src, src.numel(), rows, row_numel, self.block, team, int(enc.stochastic), enc.params.get("seed", 0),
            feedback, dst, *self._rot(),
        )
        if dst is not out:
            out.copy_(dst)

    def _decode_rows_kernel(self, backend: str, payloads: torch.Tensor, out: torch.Tensor, row_numel: int) -> None:
        payloads = aligned(payloads)  # keep the (possibly copied) payloads alive during the call
        rows = min(payloads.shape[0], -(-out.numel() // row_numel))
        if self.rotate:  # one team per block
            nthreads = rows * -(-row_numel // self.block) * self._team()
            rot = (self._team(), self.params["rotate_seed"])
        else:  # one thread per 16-byte q group
            nthreads = rows * self._groups(row_numel)
            rot = ()
        kernel_call.call(
            backend, "quant", self.kernel_format, self._op("decode_rows"), out.dtype, out.device, nthreads,
            payloads, payloads.shape[0], row_numel, out.numel(), self.block, out, *rot,
        )

    def _decode_sum_kernel(self, backend: str, payloads: torch.Tensor, numel: int, dtype: torch.dtype,
                           out: torch.Tensor) -> None:
        payloads = aligned(payloads)
        nthreads = -(-numel // self.block) * self._team() if self.rotate else self._groups(numel, self._sum_group_words)
        rot = (self._team(), self.params["rotate_seed"]) if self.rotate else ()
        kernel_call.call(
            backend, "quant", self.kernel_format, self._op("decode_sum"), dtype, payloads.device, nthreads,
            payloads, payloads.shape[0], payloads.shape[1], numel, self.block, out, *rot,
        )
