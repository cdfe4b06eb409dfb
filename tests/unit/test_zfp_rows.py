"""ZFP batched row API (encode_rows with and without error feedback, decode_rows, decode_sum): the torch
backend (libzfp through zfpy), the emulated backend (kernels/zfp.cu built for the host, one call for all
rows) and the base class's generic reference (a loop over standalone zero-padded rows) agree byte for
byte: payloads, residuals and decodes, for every dtype, dims 1 and 2, partial rows, rows wholly past
the end, tiny blocks (libzfp's scale is subnormal or overflows) and non-finite blocks."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from ccoll.codecs import get_codec
from ccoll.codecs.base import Codec
from ccoll.errors import CodecError

try:
    import zfpy  # noqa: F401  (the torch backend is libzfp through zfpy)
    BACKENDS = ("torch", "emulated")
except ImportError:
    BACKENDS = ("emulated",)

RATES = (2.125, 4, 8, 12.5, 32)
# (numel, rows, row_numel): whole rows; a partial last row; a row_numel with a partial block in every
# row and a last row wholly past the end of the tensor
SHAPES = ((192, 3, 64), (1000, 4, 256), (300, 4, 102))


def min_rate(dtype: torch.dtype, dims: int) -> float:
    return (11.5 if dtype == torch.float64 else 8.5) / 4**dims


def sample(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Wide-range values with, in order: a NaN block, an Inf block, a block whose max lies in
    [2^-98, 2^-97) holding subnormals (coded; libzfp's decode scale 2^-127 is subnormal), a block below
    2^-98 (tiny: all-zero block), a zero block."""
    g = np.random.default_rng(seed)
    x = g.standard_normal(n) * np.exp(2 * g.standard_normal(n))
    if dtype == torch.float16:
        x = np.clip(x, -6e4, 6e4)
    x = torch.from_numpy(x).to(dtype)
    if n >= 96:
        x[5] = float("nan")
        x[17] = float("-inf")
        if dtype in (torch.float32, torch.bfloat16):
            x[32:48] = torch.tensor([2.0**-97.5, -(2.0**-126.5), 2.0**-140, 3e-45] * 4, dtype=torch.float32).to(dtype)
            x[48:64] = 2.0**-99
        x[64:80] = 0
    return x


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def reference(codec, src, rows, row_numel, feedback):
    """Base class's generic encode_rows/decode_rows: a loop over standalone encodes of padded rows."""
    out = torch.empty(rows, codec.encoded_nbytes(row_numel, src.dtype), dtype=torch.uint8)
    Codec._encode_rows_generic(codec, src, out, row_numel, feedback, 0)
    dec = torch.empty(src.numel(), dtype=src.dtype)
    Codec._decode_rows_generic(codec, out, dec, row_numel)
    return out, dec


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64],
                         ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("dims", [1, 2])
def test_rows_equal_generic_reference_on_every_backend(dims, dtype):
    for i, rate in enumerate(RATES):
        rate = max(rate, min_rate(dtype, dims))
        numel, rows, row_numel = SHAPES[i % len(SHAPES)]
        src = sample(numel, dtype, seed=i)
        codecs = {b: get_codec(f"zfp:rate={rate},dims={dims}", backend=b) for b in BACKENDS}
        ref_codec = codecs[BACKENDS[0]]
        for with_feedback in (False, True):
            fb0 = None
            if with_feedback:
                g = torch.Generator().manual_seed(i)
                fb0 = (torch.randn(rows * row_numel, generator=g) * 1e-2).to(ref_codec.feedback_dtype(dtype))
                fb0[numel:] = 0
            ref_fb = None if fb0 is None else fb0.clone()
            ref_out, ref_dec = reference(ref_codec, src, rows, row_numel, ref_fb)
            for backend, codec in codecs.items():
                fb = None if fb0 is None else fb0.clone()
                out = torch.full_like(ref_out, 0xA5)  # stale bytes must not survive
                assert codec.encode_rows(src, out, row_numel, feedback=fb) is out
                case = (backend, rate, dims, dtype, with_feedback, row_numel)
                assert torch.equal(out, ref_out), case
                if fb is not None:
                    assert same_bits(fb, ref_fb), case
                    assert not fb[numel:].any(), case
                dec = torch.full((numel,), 7.0, dtype=dtype)
                codec.decode_rows(out, dec, row_numel)
                assert same_bits(dec, ref_dec), case


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64],
                         ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("dims", [1, 2])
def test_decode_sum_equals_row_order_fp32_sum_of_decodes(dims, dtype):
    numel, p = 250, 5  # a partial last block
    for rate in (4, 12.5):
        rate = max(rate, min_rate(dtype, dims))
        results = []
        for backend in BACKENDS:
            codec = get_codec(f"zfp:rate={rate},dims={dims}", backend=backend)
            payloads = torch.stack([codec.encode(sample(numel, dtype, seed=10 + r)) for r in range(p)])
            expected = torch.zeros(numel)
            for row in payloads:
                expected += codec.decode(row, numel, dtype).to(torch.float32)
            expected.masked_fill_(expected.isnan(), float("nan"))  # NaN sums are the canonical NaN
            out = torch.full((numel,), 3.0)
            assert codec.decode_sum(payloads, numel, dtype, out=out) is out
            assert same_bits(out, expected), (backend, rate, dims, dtype)
            assert out.isnan().sum() == 2 * 4**dims  # the NaN block and the Inf block
            results.append(out)
        assert all(same_bits(r, results[0]) for r in results)


@pytest.mark.parametrize("dims", [1, 2])
def test_rows_are_one_libzfp_stream_or_per_row_with_identical_bytes(dims):
    """rows whose blocks fill whole words form one stream (one libzfp call); others are coded per row."""
    codec = get_codec(f"zfp:rate=8,dims={dims}", backend=BACKENDS[0])
    S = 4**dims
    src = sample(8 * S * 16, torch.float32, seed=3)
    assert codec._one_stream(S * 16, codec.encoded_nbytes(S * 16, src.dtype))
    assert not codec._one_stream(S * 16 + 4, codec.encoded_nbytes(S * 16 + 4, src.dtype))
    assert not get_codec(f"zfp:rate=8.5,dims={dims}")._one_stream(S, get_codec(f"zfp:rate=8.5,dims={dims}").encoded_nbytes(S, src.dtype))
    for row_numel in (S * 16, S * 16 + 4):
        rows = -(-src.numel() // row_numel)
        out = torch.empty(rows, codec.encoded_nbytes(row_numel, src.dtype), dtype=torch.uint8)
        codec.encode_rows(src, out, row_numel)
        ref_out, _ = reference(codec, src, rows, row_numel, None)
        assert torch.equal(out, ref_out)


def test_misaligned_output_rows_are_filled_like_aligned_ones():
    """the kernels write 64-bit words: a [rows, nbytes] view at an odd address still gets the bytes."""
    codec = get_codec("zfp:rate=6", backend="emulated")
    src = sample(500, torch.float32, seed=4)
    nbytes = codec.encoded_nbytes(128, src.dtype)
    base = torch.zeros(4 * nbytes + 1, dtype=torch.uint8)
    out = base[1:].view(4, nbytes)
    codec.encode_rows(src, out, 128)
    aligned = torch.empty(4, nbytes, dtype=torch.uint8)
    codec.encode_rows(src, aligned, 128)
    assert torch.equal(out, aligned)
    back = torch.empty(500)
    codec.decode_rows(out, back, 128)
    assert same_bits(back, codec.decode_rows(aligned, torch.empty(500), 128))


def test_results_do_not_depend_on_flush_to_zero():
    """CuPy compiles kernels with -ftz=true; the kernels' fixed-point and dtype conversions are integer
    code, so a block whose max is in [2^-98, 2^-97) (libzfp's decode scale 2^-127 is subnormal) with
    subnormal members codes and decodes the same with the CPU's flush-to-zero / denormals-are-zero
    modes on (the host build standing in for the GPU's FTZ arithmetic: one block, so the calling
    thread, whose mode torch sets, runs it)."""
    codec = get_codec("zfp:rate=32,dims=2", backend="emulated")
    x = torch.tensor([2.0**-97.5, -(2.0**-126.5), 2.0**-140, 3e-45] * 4, dtype=torch.float32)
    payload = codec.encode(x)
    decoded = codec.decode(payload, 16, torch.float32)
    assert (decoded[:2] != 0).all() and decoded[2] != 0, "subnormal results are kept"
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode")
    try:
        payload_ftz = codec.encode(x)
        decoded_ftz = codec.decode(payload, 16, torch.float32)
    finally:
        torch.set_flush_denormal(False)
    assert torch.equal(payload_ftz, payload)
    assert same_bits(decoded_ftz, decoded)


def test_given_no_zfpy_when_torch_backend_used_then_codec_error_naming_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "zfpy", None)  # import zfpy now raises ImportError
    with pytest.raises(CodecError, match="pip install zfpy|backend='emulated'"):
        get_codec("zfp:rate=8", backend="torch").encode(torch.ones(8))


def test_every_cuda_kernel_the_codec_launches_is_defined_with_a_host_twin():
    """CUDA_KERNELS (read by the NVRTC build check) names entry points that kernels/zfp.cu defines; the
    emulated backend's host library exports each one's twin."""
    from ccoll import kernels
    from ccoll.codecs import zfp

    source = kernels.source("zfp").read_text()
    host = kernels.host_library("zfp")
    assert len(zfp.CUDA_KERNELS) == 16  # encode_rows, encode_tiles, decode_rows, decode_sum x 4 dtypes
    for name in zfp.CUDA_KERNELS:
        assert name + "," in source or name + ")" in source, name
        assert hasattr(host, name.replace("ccoll_zfp_", "ccoll_host_zfp_")), name


@pytest.mark.parametrize("dims", [1, 2])
def test_fused_feedback_residual_equals_reference_at_fractional_rates(dims):
    """the fused kernel derives the decode from the encoder's own bits (including the bit libzfp's decoder
    infers when the budget ends inside a group test) instead of reading them back: check it at rates
    where the budget ends at every kind of place."""
    src = sample(4096 + 7, torch.float32, seed=dims)
    for rate in (2.5, 3.3, 5.1, 7.75, 17.3, 40):
        codec = get_codec(f"zfp:rate={rate},dims={dims}", backend="emulated")
        fb = torch.randn(2 * 2304, generator=torch.Generator().manual_seed(5)) * 1e-3
        fb[src.numel():] = 0
        ref_fb = fb.clone()
        ref_out, _ = reference(codec, src, 2, 2304, ref_fb)
        out = torch.empty_like(ref_out)
        codec.encode_rows(src, out, 2304, feedback=fb)
        assert torch.equal(out, ref_out) and same_bits(fb, ref_fb), rate
