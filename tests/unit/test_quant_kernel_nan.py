"""kernels/quant.cu's NaN rule on the kernel backends, bit for bit: every NaN a decode writes is the codecs' own
pattern (fp32 0x7FC00000; bf16 0xFFFF, fp16 0x7E00: kernels/common.cuh), whatever NaN the arithmetic produced.

Why: decode_sum adds p rows' decoded values in fp32, and an adder's NaN is not one pattern: x86 keeps the first
NaN operand's sign and payload and makes 0xFFC00000 of Inf - Inf, PTX's add returns its own canonical NaN, a bf16
decode's NaN widens to 0xFFFF0000. The kernel stores every NaN sum as CQ_NAN_BITS (cq_canonical_nan) so that
every backend and every GPU writes the same bytes; without that step the bytes follow the inputs' NaNs. The
encoders only write finite or NaN scales, so the payloads here are crafted: scales of negative and signalling
NaNs and of +Inf (with q of both signs: Inf - Inf in the sum), in different rows and blocks. The emulated build
and simt (the __global__ kernels, both thread orders) are checked; the torch backend's NaN bits are its own
module's tests (tests/unit/test_nan_pattern.py)."""
import shutil

import pytest
import torch

import ccoll
from ccoll.kernels import call as kernel_call

NAN32 = 0x7FC00000
NAN_OF = {torch.float32: NAN32, torch.bfloat16: 0xFFFF, torch.float16: 0x7E00}
INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _crafted(spec: str, rows: int, n: int) -> tuple[torch.Tensor, list[int]]:
    """Payloads of ``rows`` rows of ``n`` values (values of both signs everywhere) whose scales are: row 0 block 0
    a negative quiet NaN, row 1 block 1 a signalling NaN with a payload, rows 0 and 1 block 2 +Inf (so the sum
    meets +Inf and -Inf), row 2 block 3 NaN; returns them and the blocks touched."""
    em = ccoll.get_codec(spec, backend="emulated")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(rows * n, generator=g)
    x[::2] = -x[::2].abs()
    x[1::2] = x[1::2].abs()
    payloads = em.encode_rows(x, torch.zeros(rows, em.encoded_nbytes(n, torch.float32), dtype=torch.uint8), n)
    scales = payloads[:, : 4 * (-(-n // em.block))].contiguous().view(torch.int32)
    for r, b, bits in ((0, 0, 0xFFC00000), (1, 1, 0x7FA00001), (0, 2, 0x7F800000), (1, 2, 0x7F800000),
                       (2, 3, NAN32)):
        scales[r, b] = torch.tensor(bits, dtype=torch.int64).to(torch.int32)
    payloads[:, : scales.shape[1] * 4] = scales.view(torch.uint8)
    return payloads, [0, 1, 2, 3]


def _check_nans(out: torch.Tensor, dtype: torch.dtype, block: int, blocks: list[int], what: str) -> None:
    bits = out.view(INT_VIEW[dtype]).to(torch.int64) & ((1 << (8 * out.element_size())) - 1)
    nan = out.isnan()
    assert nan.any(), f"{what}: no NaN at all (the crafted blocks must give some)"
    wrong = torch.unique(bits[nan])
    assert wrong.tolist() == [NAN_OF[dtype]], f"{what}: NaN bits {[hex(b) for b in wrong.tolist()]}"
    for b in blocks[:2]:  # NaN-scale blocks are NaN throughout
        assert nan[b * block:(b + 1) * block].all(), f"{what}: block {b}"


@pytest.mark.parametrize("spec", ["int8:block=32", "int4:block=64", "int8:block=64,rotate=hadamard"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_decode_sum_and_decode_rows_write_one_nan_pattern(spec, dtype):
    """decode_sum (fp32 sums of rows decoded to ``dtype``) and decode_rows (``dtype``) on the emulated build: every
    NaN is the one pattern; decode_sum's sums of the crafted blocks include x86's 0xFFC00000 (Inf - Inf), a
    negative and a signalling NaN's payload and bf16's 0xFFFF0000, so the canonicalisation is what makes them
    equal."""
    em = ccoll.get_codec(spec, backend="emulated")
    n, rows = 6 * em.block + 5, 3
    payloads, blocks = _crafted(spec, rows, n)
    s = em.decode_sum(payloads, n, dtype)
    _check_nans(s, torch.float32, em.block, blocks, f"{spec} {dtype} decode_sum")
    # decode_rows of a payload an encoder writes (row 2: a NaN block has CQ_NAN_BITS as its scale) gives the
    # dtype's NaN; the crafted non-canonical scales of rows 0 and 1 are decode_sum's case only
    y = em.decode_rows(payloads[2:3].contiguous(), torch.empty(n, dtype=dtype), n)
    _check_nans(y, dtype, em.block, [3], f"{spec} {dtype} decode_rows")


@pytest.mark.skipif(shutil.which("g++") is None, reason="the simt backend needs g++")
@pytest.mark.parametrize("spec", ["int8:block=32", "int4:block=64"])
def test_decode_sum_kernel_writes_one_nan_pattern_in_both_thread_orders(spec):
    """The same on the __global__ kernels (simt, the codec's cupy launch geometry), forward and reverse: the
    kernel's bytes, not only the host loop's."""
    em = ccoll.get_codec(spec, backend="emulated")
    n, rows = 6 * em.block + 5, 3
    payloads, blocks = _crafted(spec, rows, n)
    ref = em.decode_sum(payloads, n, torch.bfloat16)
    for order in ("forward", "reverse"):
        out = torch.zeros(n)
        with kernel_call.cupy_on_simt(order=order):
            em._decode_sum_cupy(payloads, n, torch.bfloat16, out)
        _check_nans(out, torch.float32, em.block, blocks, f"{spec} simt {order}")
        assert torch.equal(out.view(torch.int32), ref.view(torch.int32)), order
