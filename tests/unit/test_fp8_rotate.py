"""The "fp8" codec (MX-style block-scaled E4M3 / E5M2) and rotate=hadamard (int8, int4, fp8): the torch
backend, the GPU kernels' own logic built for the host ("emulated") and the base class's reference loop
agree byte for byte (payloads, residuals, decodes, decode_sum); the documented error bounds, scale rule,
non-finite rule and spec errors hold. The cupy argument lists for these codecs are checked by
test_quant_rows.py::test_given_cupy_glue_when_launches_run_the_host_build_expect_torch_bytes, and on a
GPU by ccoll.gpucheck's matrix."""
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ccoll
from ccoll.codecs.base import Codec
from ccoll.errors import CodecSpecError

from test_quant_rows import DTYPES, _assert_same_values, _check_rows, _mixed

FP8 = {"e4m3": (torch.float8_e4m3fn, 448.0, 3, 7), "e5m2": (torch.float8_e5m2, 57344.0, 2, 15)}


def _both(spec):
    return ccoll.get_codec(spec, backend="torch"), ccoll.get_codec(spec, backend="emulated")


@pytest.mark.parametrize("spec", [
    "fp8:format=e4m3,block=24",
    "fp8:format=e5m2,block=8",
    "int8:block=16,rotate=hadamard,rotate_seed=7",
    "int4:block=32,round=stochastic,seed=5,rotate=hadamard",
    "fp8:format=e4m3,block=32,rotate=hadamard,rotate_seed=1",
])
@pytest.mark.parametrize("dtype", DTYPES)
def test_given_rows_of_every_shape_when_encoding_expect_backends_and_reference_byte_identical(spec, dtype):
    shapes = [  # (numel, rows, row_numel): aligned, padded last row, rows past the end, numel < row_numel,
        (96, 3, 32), (1000, 4, 256), (100, 4, 64), (5, 3, 64), (77, 7, 11), (301, 2, 151)  # short/odd rows
    ]
    for i, (numel, rows, row_numel) in enumerate(shapes):
        _check_rows(spec, dtype, numel, rows, row_numel, with_feedback=i % 2 == 1, salt=99 + i, seed=i)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    codec=st.sampled_from(["fp8:format=e4m3", "fp8:format=e5m2", "int8", "int4"]),
    log2_block=st.integers(3, 7),
    rotate=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    rows=st.integers(1, 4),
    row_numel=st.integers(1, 300),
    fill=st.floats(0.01, 1.0),
    with_feedback=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_fp8_and_rotated_rows_backends_identical(codec, log2_block, rotate, dtype, rows, row_numel, fill,
                                                          with_feedback, seed):
    spec = f"{codec}{',' if ':' in codec else ':'}block={1 << log2_block}"
    if rotate:
        spec += f",rotate=hadamard,rotate_seed={seed}"
    numel = max(1, int(rows * row_numel * fill))
    _check_rows(spec, dtype, numel, rows, row_numel, with_feedback, salt=seed * 7919, seed=seed)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_given_fp8_when_round_tripping_expect_documented_bound_scale_rule_and_grid_values_exact(fmt):
    dtype8, fmax, mbits, bias = FP8[fmt]
    g = torch.Generator().manual_seed(0)
    n, block = 32 * 400, 32
    x = torch.randn(n, generator=g) * torch.exp(3 * torch.randn(n // block, generator=g)).repeat_interleave(block)
    for codec in _both(f"fp8:format={fmt},block={block}"):
        payload = codec.encode(x)
        assert payload.numel() == n // block + n  # one E8M0 byte per block + one byte per value
        y = codec.decode(payload, n, torch.float32)
        blocks = x.view(-1, block)
        amax = blocks.abs().amax(1)
        # the scale byte: the smallest e with absmax <= fmax * 2^e
        e = payload[: n // block].to(torch.int64) - 127
        assert bool((amax <= fmax * torch.exp2(e.double())).all())
        assert bool((amax > fmax * torch.exp2(e.double() - 1)).all())
        # |y - x| <= max(2^-(m+1) |x|, 2^(e + 1 - bias - m - 1)): half an ulp, or half a subnormal step
        bound = torch.maximum(x.abs() * 2.0 ** -(mbits + 1),
                              torch.exp2(e.double() + 1 - bias - mbits - 1).repeat_interleave(block).float())
        assert bool(((y - x).abs() <= bound).all())
    # values on the block's fp8 grid (every finite code, times 2^e) decode exactly; ties round to even
    codes = torch.arange(256, dtype=torch.uint8).view(dtype8).float()
    grid = codes[torch.isfinite(codes)]
    grid = grid[grid.abs() <= fmax]
    x = torch.cat([grid, grid.new_zeros((-grid.numel()) % 32)]) * 2.0**-20
    for codec in _both(f"fp8:format={fmt},block=32"):
        y = codec.decode(codec.encode(x), x.numel(), torch.float32)
        assert torch.equal(y, x)
    one_ulp = 2.0 ** -mbits  # between 1 and 1 + ulp: the midpoint rounds to 1 (even), just above to 1 + ulp
    x = torch.tensor([fmax, 1 + one_ulp / 2, 1 + 3 * one_ulp / 2, 1 + one_ulp / 2 + 2**-20] + [0.0] * 4)
    for codec in _both(f"fp8:format={fmt},block=8"):
        y = codec.decode(codec.encode(x), 8, torch.float32)
        assert y.tolist()[:4] == [fmax, 1.0, 1 + 2 * one_ulp, 1 + one_ulp]


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_given_every_code_and_scale_byte_when_decoding_expect_torchs_float8_value_times_the_scale(fmt):
    """Every one of the 256 element codes -- subnormals, +-0, and the NaN / Inf codes the encoder never writes
    -- under scale bytes from 0 (2^-127, a subnormal scale) to 254 (products past FLT_MAX: Inf) and 255 (NaN)
    decodes to torch's float8 -> fp32 value times 2^e rounded once, on the torch, host and simt backends:
    the kernels' code -> fp32 (kernels/quant.cu CqFp8::value) is exact."""
    dtype8 = FP8[fmt][0]
    scale_bytes = [0, 1, 2, 100, 127, 133, 200, 254, 255]
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    values = codes.view(dtype8).float()
    backends = ("torch", "emulated", "simt")
    for sb in scale_bytes:
        scale = math.nan if sb == 255 else 2.0 ** (sb - 127)
        want = values * torch.tensor(scale, dtype=torch.float32)
        # 8 blocks of 32 codes: 8 scale bytes padded to 16, then the codes
        payload = torch.cat([torch.full((8,), sb, dtype=torch.uint8), torch.zeros(8, dtype=torch.uint8), codes])
        for backend in backends:
            got = ccoll.get_codec(f"fp8:format={fmt},block=32", backend=backend).decode(payload, 256, torch.float32)
            # bit for bit, NaNs included: a NaN code or a NaN scale decodes to the one fp32 NaN, 0x7FC00000
            want = want.masked_fill(want.isnan(), math.nan)
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (backend, sb)


@pytest.mark.parametrize("spec", ["fp8:block=32", "fp8:format=e5m2,block=16,rotate=hadamard",
                                  "int4:block=32,rotate=hadamard"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_given_non_finite_value_expect_whole_block_nan_and_others_untouched(spec, bad):
    x = torch.linspace(-3, 3, 100)
    x[37] = bad  # block 1 of 32 (or 2 of 16)
    block = ccoll.get_codec(spec).block
    payloads = []
    for codec in _both(spec):
        payload = codec.encode(x)
        y = codec.decode(payload, 100, torch.float32)
        nan_block = torch.arange(100) // block == 37 // block
        assert bool(torch.isnan(y[nan_block]).all()) and bool(torch.isfinite(y[~nan_block]).all())
        payloads.append(payload)
    assert torch.equal(*payloads)
    if spec.startswith("fp8"):
        assert int(payloads[0][37 // block]) == 255  # the E8M0 NaN byte


def codec_fmt(spec):
    return ccoll.get_codec(spec).params["format"]


def test_given_zeros_and_tiny_and_huge_blocks_expect_exact_zeros_finite_and_identical():
    flt_max = torch.finfo(torch.float32).max
    x = torch.cat([torch.zeros(32), torch.full((32,), 1e-44), torch.full((32,), -flt_max),
                   torch.linspace(-1, 1, 32) * 3e38])
    for spec in ["fp8:block=32", "fp8:format=e5m2,block=32", "int8:block=32,rotate=hadamard"]:
        ct, ce = _both(spec)
        pt, pe = ct.encode(x), ce.encode(x)
        assert torch.equal(pt, pe), spec
        y = ct.decode(pt, x.numel(), torch.float32)
        assert torch.equal(y[:32], torch.zeros(32)), spec
        if spec.startswith("fp8"):  # near FLT_MAX the scale is capped at 2^(127 - EMAX): finite, saturating
            emax = 8 if "e4m3" in codec_fmt(spec) else 15
            assert int(pt[2]) == 127 + 127 - emax, spec
            assert bool(torch.isfinite(y).all()), spec
            assert bool(((y[64:] - x[64:]).abs() <= x[64:].abs() / 8).all()), spec


@pytest.mark.parametrize("name,qmax", [("int8", 127), ("int4", 7)])
def test_given_rotate_when_round_tripping_expect_documented_l2_bound_per_block(name, qmax):
    """Per whole block: ||x' - x||_2 <= ||x||_1 / (2 qmax) (half a step of the rotated block's absmax,
    which is at most ||x||_1, spread by the orthogonal inverse), up to fp32 rounding."""
    g = torch.Generator().manual_seed(1)
    block = 64
    x = torch.randn(block * 300, generator=g) * torch.exp(2 * torch.randn(block * 300, generator=g))
    for codec in _both(f"{name}:block={block},rotate=hadamard,rotate_seed=11"):
        y = codec.decode(codec.encode(x), x.numel(), torch.float32)
        err = (y - x).view(-1, block).double().norm(dim=1)
        bound = x.view(-1, block).double().abs().sum(1) / (2 * qmax)
        assert bool((err <= bound * (1 + 1e-5)).all())


def test_given_heavy_tailed_blocks_when_rotating_expect_lower_int4_error_and_seeded_signs():
    """What rotate=hadamard is for: a block with one outlier spends int4's 15 levels on it; rotated, the
    outlier's energy spreads over the block. Gaussian blocks with 1% outliers of 30 sigma."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64 * 500, generator=g)
    outliers = torch.rand(x.numel(), generator=g) < 0.01
    x = torch.where(outliers, 30 * torch.randn(x.numel(), generator=g), x)

    def rel(spec):
        c = ccoll.get_codec(spec)
        return float((c.decode(c.encode(x), x.numel(), torch.float32) - x).norm() / x.norm())

    assert rel("int4:block=64,rotate=hadamard") < 0.7 * rel("int4:block=64")
    a = ccoll.get_codec("int4:block=64,rotate=hadamard,rotate_seed=1")
    b = ccoll.get_codec("int4:block=64,rotate=hadamard,rotate_seed=2")
    assert torch.equal(a.encode(x), a.encode(x)) and not torch.equal(a.encode(x), b.encode(x))
    # the salt of encode_rows (per call) never changes the rotation: round-to-nearest bytes do not move
    out1 = torch.empty(1, a.encoded_nbytes(x.numel(), x.dtype), dtype=torch.uint8)
    out2 = out1.clone()
    a.encode_rows(x, out1, x.numel(), salt=1)
    a.encode_rows(x, out2, x.numel(), salt=2)
    assert torch.equal(out1, out2)


@pytest.mark.parametrize("spec", ["fp8:format=e5m2,block=32", "int4:block=16,rotate=hadamard",
                                  "fp8:block=32,rotate=hadamard"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_given_p_payloads_when_decode_sum_expect_row_order_sum_of_decodes_on_both_backends(spec, dtype):
    ct, ce = _both(spec)
    p, numel = 5, 1000  # 1000 = whole blocks + a partial (unrotated) one
    payloads = torch.stack([ct.encode(_mixed(numel, dtype, s)) for s in range(p)])
    expected = torch.zeros(numel)
    for row in payloads:
        expected += ct.decode(row, numel, dtype).float()
    expected.masked_fill_(expected.isnan(), math.nan)  # the rule: a NaN sum is 0x7FC00000 (a sign flip is not kept)
    for codec in (ct, ce):
        _assert_same_values(codec.decode_sum(payloads, numel, dtype), expected)


@pytest.mark.parametrize("spec,match", [
    ("fp8:format=e3m4", "must be one of e4m3, e5m2"),
    ("fp8:block=12", "multiple of 8"),
    ("fp8:round=stochastic", "unknown parameter"),
    ("int4:block=24,rotate=hadamard", "power of two"),
    ("int8:block=2048,rotate=hadamard", "power of two between 8 and 1024"),
    ("fp8:rotate=walsh", "must be one of none, hadamard"),
    ("int8:block=64,rotate=hadamard,rotate_seed=-1", r"rotate_seed=-1 must be in \[0, 2\^32\)"),
])
def test_given_invalid_spec_expect_codec_spec_error_naming_the_rule(spec, match):
    with pytest.raises(CodecSpecError, match=match):
        ccoll.get_codec(spec)


def test_given_specs_expect_canonical_round_trip_sizes_and_no_rotation_params_unless_rotating():
    assert ccoll.get_codec("int8:block=256").spec == "int8:block=256,round=nearest,seed=0"
    for spec in ["fp8", "fp8:format=e5m2,block=64,rotate=hadamard,rotate_seed=9", "int4:block=64,rotate=hadamard"]:
        codec = ccoll.get_codec(spec)
        assert ccoll.get_codec(codec.spec) == codec
    fp8 = ccoll.get_codec("fp8")
    assert fp8.spec == "fp8:format=e4m3,block=32"
    assert fp8.encoded_nbytes(1024, torch.bfloat16) == 32 + 1024  # 8.25 bits per value
    assert fp8.encoded_nbytes(100, torch.float32) == 16 + 112
    assert fp8.align_numel == 32 and fp8.lossy
    out = torch.empty(2, fp8.encoded_nbytes(64, torch.float32), dtype=torch.uint8)
    fp8.encode_rows(torch.ones(100), out, 64)
    assert torch.equal(fp8.decode_rows(out, torch.empty(100), 64), torch.ones(100))
