"""Host and device buffers for codec outputs: fresh outputs (huge pages on the host), the alignment the
kernels' word loads need, and the NaN bits a torch-backend output holds (kernels/common.cuh's rule, written
here rather than left to torch's cast). Every codec allocates through here."""
from __future__ import annotations

import ctypes
import functools
import math
import sys

import torch

_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14


@functools.lru_cache(maxsize=None)
def _madvise():
    """libc's madvise, or None where there is none (non-Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def empty_cpu(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """torch.empty for a fresh CPU output, asking the kernel for transparent huge pages on its 2 MiB-aligned
    interior before the first touch. Why: a codec's output is new memory on every call and first-touch
    page faults cost as much as the codec itself (measured on a VM: 64 MiB alloc+fill 60 ms -> 16 ms of
    CPU time). Advisory only: ignored where THP is off (what torch does under THP_MEM_ALLOC_ENABLE=1)."""
    t = torch.empty(numel, dtype=dtype)
    madvise = _madvise()
    nbytes = numel * t.element_size()
    if madvise is not None and nbytes >= 2 * _HUGE_PAGE:
        start = -(-t.data_ptr() // _HUGE_PAGE) * _HUGE_PAGE
        end = (t.data_ptr() + nbytes) // _HUGE_PAGE * _HUGE_PAGE
        if end > start:
            madvise(start, end - start, _MADV_HUGEPAGE)
    return t


def new_buffer(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A fresh 1-D output of ``numel`` x ``dtype`` on ``device`` (host: :func:`empty_cpu`)."""
    if device.type == "cpu":
        return empty_cpu(numel, dtype)
    return torch.empty(numel, dtype=dtype, device=device)


def round16(n: int) -> int:
    return (n + 15) // 16 * 16


def aligned(payload: torch.Tensor, alignment: int = 16) -> torch.Tensor:
    """Payload sections are read as 32/64-bit words: a view at an unaligned address is copied once."""
    return payload if payload.data_ptr() % alignment == 0 else payload.clone()


def aligned_like(out: torch.Tensor, alignment: int = 16) -> torch.Tensor:
    """``out`` if payloads can be written into it as words, else a fresh buffer of its shape (the caller
    copies it over)."""
    return out if out.data_ptr() % alignment == 0 else torch.empty_like(out)


#: kernels/common.cuh's BF16_NAN (0xFFFF) as the int16 a bf16 tensor's bits are viewed as
_BF16_NAN_I16 = -1


def narrow_(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst`` (bf16 / fp16) = ``src`` (fp32) rounded to nearest even, every NaN written as the kernels write
    it (kernels/common.cuh): bf16 0xFFFF. Why not ``dst.copy_(src)`` alone: torch's CPU cast picks a bf16
    NaN's bits by its vector path (AVX-512: 0xFFFF, the baseline x86-64 one: 0x7FC0), so the torch
    backend's bytes would depend on the CPU. fp16 needs nothing: both paths quiet the NaN and keep its top
    payload bits, the rule. Costs one read of ``src`` (a max, which propagates NaN) when ``dst`` is bf16;
    only a NaN block pays the rewrite. CPU tensors only (the torch backend): ``bool`` would sync a GPU."""
    dst.copy_(src)
    if dst.dtype == torch.bfloat16 and src.numel() and bool(src.max().isnan()):
        dst.view(torch.int16).masked_fill_(src.isnan().view(dst.shape), _BF16_NAN_I16)
    return dst


def canonical_nan_(t: torch.Tensor) -> torch.Tensor:
    """Every NaN of the fp32 tensor ``t`` written as 0x7FC00000, the quiet NaN a decode_sum kernel writes
    (kernels/common.cuh). Why: an addition returns one of its NaN operands on x86 and the canonical NaN on
    a GPU, and a row decoded through bf16 (0xFFFF0000) or un-rotated (sign flipped) carries another NaN
    into the sum. One read (a max) when there is no NaN; CPU tensors only, as :func:`narrow_`."""
    if t.numel() and bool(t.max().isnan()):
        t.masked_fill_(t.isnan(), math.nan)
    return t
