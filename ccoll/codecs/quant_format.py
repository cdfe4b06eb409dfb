"""The element formats' math of the block quantizers (kernels/quant.cu restated for the torch backend):
the counter-based random numbers of stochastic rounding, the rotate=hadamard transform and signs, and the
fp8 / E8M0 tables. Pure functions of their arguments; the codecs (quant.py) and the torch backend
(quant_torch.py) share them."""
from __future__ import annotations

import functools

import torch

_U32 = 0xFFFFFFFF


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


#: fp8 element formats: (torch dtype, EMAX, largest finite value 1.75 * 2^EMAX)
_FP8_FORMATS = {
    "e4m3": (torch.float8_e4m3fn, 8, 448.0),
    "e5m2": (torch.float8_e5m2, 15, 57344.0),
}
#: E8M0 scale byte -> 2^(byte - 127) (byte 0: 2^-127, a subnormal fp32), byte 255 -> NaN
_E8M0 = torch.tensor([0x00400000] + [c << 23 for c in range(1, 255)] + [0x7FC00000], dtype=torch.int32).view(
    torch.float32
)
