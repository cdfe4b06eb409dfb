"""The "lossless" codec (ccoll/codecs/lossless.py, kernels/lossless.cu): decode(encode(x)) has x's exact bits
for bf16/fp16/fp32 -- every special pattern included -- on the torch backend and on the GPU kernels' own
logic built for the host ("emulated"), which produce the same bytes, equal to the base class's reference
loop over rows; the payload's used size is what its header says and never exceeds the capacity; payloads
that are not lossless payloads raise CodecError; bad specs raise CodecSpecError. (The cupy backend runs the
same kernels through NVRTC: test_kernels_build.py compiles them and checks every launched name exists.)"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ccoll
from ccoll.codecs.base import Codec
from ccoll.errors import CodecError, CodecSpecError

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
_INT = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.uint8)


def _patterns(dtype: torch.dtype) -> list[int]:
    """Bit patterns a lossless codec must keep: +-0, the smallest and largest subnormals, +-Inf, NaNs with
    payloads and sign, the largest finite, one."""
    if dtype == torch.float32:
        return [0, 1 << 31, 1, 0x007FFFFF, 0x7F800000, 0xFF800000, 0x7FC00001, 0xFFBFFFFF, 0x7F7FFFFF, 0x3F800000]
    if dtype == torch.float16:
        return [0, 0x8000, 1, 0x03FF, 0x7C00, 0xFC00, 0x7E01, 0xFDFF, 0x7BFF, 0x3C00]
    return [0, 0x8000, 1, 0x007F, 0x7F80, 0xFF80, 0x7FC1, 0xFFBF, 0x7F7F, 0x3F80]


def _from_bits(words: list[int], dtype: torch.dtype) -> torch.Tensor:
    width = 32 if dtype == torch.float32 else 16
    signed = [w - (1 << width) if w >= 1 << (width - 1) else w for w in words]
    return torch.tensor(signed, dtype=_INT[dtype]).view(dtype)


def _mixed(n: int, dtype: torch.dtype, seed: int, special_every: int = 37) -> torch.Tensor:
    """Activation-like values (log-normal magnitudes), an all-zero stretch, and special patterns."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, generator=g) * torch.exp(2 * torch.randn(n, generator=g))).to(dtype)
    x[n // 3: n // 3 + 40] = 0
    pats = _from_bits(_patterns(dtype), dtype)
    idx = torch.arange(0, n, special_every)
    x[idx] = pats[torch.arange(idx.numel()) % pats.numel()]
    return x


def _both():
    return ccoll.get_codec("lossless", backend="torch"), ccoll.get_codec("lossless", backend="emulated")


def _encode(codec, src, rows, row_numel, generic=False):
    out = torch.full((rows, codec.encoded_nbytes(row_numel, src.dtype)), 0xA5, dtype=torch.uint8)
    if generic:
        Codec._encode_rows_generic(codec, src, out, row_numel, None, 0)
    else:
        assert codec.encode_rows(src, out, row_numel) is out
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(DTYPES),
    words=st.lists(st.integers(0, (1 << 32) - 1), min_size=1, max_size=700),
    block=st.sampled_from([32, 64, 256, 1024]),
)
def test_given_any_bit_patterns_when_round_tripping_expect_identical_bits_and_backends_identical(dtype, words, block):
    width = 32 if dtype == torch.float32 else 16
    x = _from_bits([w & ((1 << width) - 1) for w in words], dtype)
    payloads = []
    for backend in ("torch", "emulated"):
        c = ccoll.get_codec(f"lossless:block={block}", backend=backend)
        p = c.encode(x)
        assert p.numel() == c.encoded_nbytes(x.numel(), dtype) == 16 + -(-x.numel() * dtype.itemsize // 16) * 16
        used = c.used_nbytes(p.view(1, -1))[0]
        assert 32 <= used <= p.numel() and used % 16 == 0 and bool((p[used:] == 0).all())
        assert torch.equal(_bits(c.decode(p, x.numel(), dtype)), _bits(x))
        payloads.append(p)
    assert torch.equal(payloads[0], payloads[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_given_rows_of_every_shape_expect_torch_emulated_and_reference_byte_identical_and_exact(dtype):
    ct, ce = _both()
    shapes = [(1024, 4, 256), (1000, 4, 300), (100, 4, 64), (5, 3, 64), (77, 7, 11), (1, 1, 1)]
    for i, (numel, rows, row_numel) in enumerate(shapes):
        src = _mixed(numel, dtype, seed=i)
        pt, pe, pg = _encode(ct, src, rows, row_numel), _encode(ce, src, rows, row_numel), _encode(ct, src, rows, row_numel, True)
        assert torch.equal(pt, pe) and torch.equal(pt, pg), (numel, rows, row_numel)
        for out_numel in {numel, min(rows * row_numel, numel + 3)}:
            yt = torch.full((out_numel,), 7.0, dtype=dtype)
            ye = yt.clone()
            ct.decode_rows(pt, yt, row_numel)
            ce.decode_rows(pt, ye, row_numel)
            padded = torch.zeros(out_numel, dtype=dtype)
            padded[:min(numel, out_numel)] = src[:out_numel]
            assert torch.equal(_bits(yt), _bits(padded)) and torch.equal(_bits(ye), _bits(padded))


@pytest.mark.parametrize("dtype", DTYPES)
def test_given_activation_like_values_expect_fewer_bytes_and_incompressible_values_expect_raw_capacity(dtype):
    c = ccoll.get_codec("lossless", backend="emulated")
    x = (torch.randn(1 << 14) * 0.05).to(dtype)
    p = c.encode(x)
    used = c.used_nbytes(p.view(1, -1))[0]
    # exponents of N(0, 0.05) values span ~4-5 bits per block: bf16 ~12.5/16, fp32 ~28.5/32; fp16 has only 5
    # exponent bits (and its small values are subnormal), so it saves ~1 bit in 16
    assert used < {torch.bfloat16: 0.85, torch.float16: 0.97, torch.float32: 0.95}[dtype] * x.numel() * dtype.itemsize
    noise = torch.randint(-(1 << 15), 1 << 15, (1 << 14,), generator=torch.Generator().manual_seed(0)).to(torch.int16)
    z = noise.view(dtype)  # uniformly random bit patterns (fp32: pairs of halves)
    pz = c.encode(z)
    assert c.used_nbytes(pz.view(1, -1))[0] == pz.numel()  # stored raw: capacity = raw + 16
    assert torch.equal(_bits(c.decode(pz, z.numel(), dtype)), _bits(z))


def test_given_payloads_when_decode_sum_expect_the_none_codecs_row_order_fp32_sum():
    c, none = ccoll.get_codec("lossless", backend="emulated"), ccoll.get_codec("none")
    for dtype in DTYPES:
        rows = torch.stack([(torch.randn(500) * (k + 1)).to(dtype) for k in range(3)])
        pl = torch.stack([c.encode(r) for r in rows])
        pn = torch.stack([none.encode(r) for r in rows])
        assert torch.equal(c.decode_sum(pl, 500, dtype), none.decode_sum(pn, 500, dtype))


def test_given_error_feedback_expect_the_reference_cast_residual():
    c = ccoll.get_codec("lossless", backend="torch")
    src = torch.randn(300).to(torch.bfloat16)
    fb1 = torch.randn(2 * 160) * 1e-3
    fb2 = fb1.clone()
    o1 = torch.empty(2, c.encoded_nbytes(160, torch.bfloat16), dtype=torch.uint8)
    o2 = o1.clone()
    c.encode_rows(src, o1, 160, feedback=fb1)
    Codec._encode_rows_generic(c, src, o2, 160, fb2, 0)
    assert torch.equal(o1, o2) and torch.equal(fb1, fb2)


def test_given_bad_payloads_expect_codec_error():
    c = ccoll.get_codec("lossless", backend="emulated")
    x = torch.randn(1000).to(torch.bfloat16)
    p = c.encode(x)
    with pytest.raises(CodecError):  # wrong length
        c.decode(p[:-16], 1000, torch.bfloat16)
    with pytest.raises(CodecError):  # another numel than encoded
        c.decode(c.encode(torch.randn(992).to(torch.bfloat16)), 992, torch.float16)
    for word, value in ((0, 48), (1, 7), (2, 999), (3, 512)):  # used, mode, numel, block corrupted
        bad = p.clone()
        bad[:16].view(torch.int32)[word] = value
        for backend in ("torch", "emulated"):
            with pytest.raises(CodecError):
                ccoll.get_codec("lossless", backend=backend).decode(bad, 1000, torch.bfloat16)
    bad = p.clone()
    bad[16:20].view(torch.int32)[0] = 9 << 8  # block 0 claims 9 exponent bits
    with pytest.raises(CodecError):
        c.decode(bad, 1000, torch.bfloat16)
    bad = p.clone()
    bad[16 + 16 * -(-4 // 4) + 4:16 + 16 * -(-4 // 4) + 8].view(torch.int32)[0] += 1  # offset of block 1
    with pytest.raises(CodecError):
        c.decode(bad, 1000, torch.bfloat16)
    with pytest.raises(CodecError):
        c.encode(torch.arange(10))  # integers
    with pytest.raises(CodecError):
        c.encode(torch.randn(4, dtype=torch.float64))


@pytest.mark.parametrize("spec", ["lossless:block=48", "lossless:block=16", "lossless:block=131072", "lossless:rate=8"])
def test_given_bad_spec_expect_codec_spec_error(spec):
    with pytest.raises(CodecSpecError):
        ccoll.get_codec(spec)


def test_capabilities_expect_exact_variable_size_and_capacity_bound():
    c = ccoll.get_codec("lossless")
    assert c.variable_size and not c.lossy and c.exact_for(torch.bfloat16) and c.spec == "lossless:block=256"
    assert not ccoll.get_codec("int8:block=256").variable_size
    assert c.max_encoded_nbytes(1000, torch.float32) == c.encoded_nbytes(1000, torch.float32) == 4016
