"""ZFP fixed-rate codec: byte-exact with libzfp (zfpy is the oracle) on the torch and emulated backends,
plus the project's own rules for what libzfp leaves undefined (non-finite and tiny blocks), typed errors
for unsafe parameters, and the fused decode-sum used by all_reduce."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ccoll.codecs import get_codec
from ccoll.errors import CodecError, CodecSpecError

try:
    import zfpy
except ImportError:  # no oracle: libzfp comparisons skip (see needs_zfpy); backend-vs-backend checks still run
    zfpy = None

#: the torch backend is libzfp itself (through zfpy); without zfpy only the host-built kernels run
CPU_BACKENDS = ("torch", "emulated") if zfpy is not None else ("emulated",)


def needs_zfpy() -> None:
    """Skip the calling test where libzfp (zfpy, the oracle) is not installed."""
    if zfpy is None:
        pytest.skip("zfpy (libzfp's Python binding) is not installed: comparison with libzfp skipped")
SIZES = (1, 3, 4, 5, 16, 17, 1023, 4096 + 5)
RATES = {  # lowest safe rate first, then fractional ones up to 32
    (1, torch.float32): (2.125, 3.3, 7.75, 12.6, 32),
    (2, torch.float32): (0.53125, 1.7, 8, 13.4375, 32),
    (1, torch.float64): (2.875, 5.5, 16.25, 32),
    (2, torch.float64): (0.71875, 3.1, 20.5, 32),
}


def codecs(rate, dims):
    return {b: get_codec(f"zfp:rate={rate},dims={dims}", backend=b) for b in CPU_BACKENDS}


def zfpy_bytes(x: torch.Tensor, rate: float, dims: int) -> np.ndarray:
    needs_zfpy()
    arr = x.reshape(-1).numpy()
    if dims == 2:
        arr = arr.reshape(-1, 4)
    return np.frombuffer(zfpy.compress_numpy(arr, rate=rate, write_header=False), dtype=np.uint8)


def zfpy_decode(payload: torch.Tensor, numel: int, dtype: torch.dtype, rate: float, dims: int) -> torch.Tensor:
    needs_zfpy()
    ztype = zfpy.type_double if dtype == torch.float64 else zfpy.type_float
    shape = [numel] if dims == 1 else [numel // 4, 4]
    return torch.from_numpy(zfpy._decompress(payload.numpy(), ztype, shape, rate=rate).reshape(-1))


def sample(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Mixed-sign values over a wide dynamic range with some exact zero blocks."""
    g = np.random.default_rng(seed)
    x = g.standard_normal(n) * np.exp(3 * g.standard_normal(n))
    if n >= 32:
        x[8:24] = 0.0
    return torch.from_numpy(x).to(dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8))


def assert_all_backends_match_zfpy(x: torch.Tensor, rate: float, dims: int) -> None:
    expected = zfpy_bytes(x, rate, dims)
    ref_decoded = zfpy_decode(torch.from_numpy(expected.copy()), x.numel(), x.dtype, rate, dims)
    for backend, codec in codecs(rate, dims).items():
        payload = codec.encode(x)
        assert payload.numel() == codec.encoded_nbytes(x.numel(), x.dtype)
        assert np.array_equal(payload.numpy(), expected), (backend, rate, dims, x.numel(), x.dtype)
        decoded = codec.decode(payload, x.numel(), x.dtype)
        assert same_bits(decoded, ref_decoded), (backend, rate, dims, x.numel(), x.dtype)


@pytest.mark.parametrize("dims,dtype", list(RATES), ids=lambda v: str(v).replace("torch.", ""))
def test_given_random_sizes_and_rates_when_encoded_then_every_backend_gives_zfpy_bytes_and_decode(dims, dtype):
    for rate in RATES[(dims, dtype)]:
        for i, n in enumerate(SIZES):
            n = n if dims == 1 else 4 * n  # numel % 4 == 0: zfpy on x.reshape(-1, 4) is the reference
            assert_all_backends_match_zfpy(sample(n, dtype, seed=i), rate, dims)


@pytest.mark.parametrize("dims", [1, 2])
def test_given_a_million_values_when_encoded_then_bytes_equal_zfpy(dims):
    n = 2**20 + 3 if dims == 1 else 2**20 + 4
    assert_all_backends_match_zfpy(sample(n, torch.float32, seed=7), 8.5, dims)


@pytest.mark.parametrize("dims", [1, 2])
@pytest.mark.parametrize(
    "values",
    [
        [1e-40, -3e-42, 2.0**-97, 5e-39, 1e-45, -(2.0**-110), -(2.0**-98), 0.0],  # denormals next to a safe max
        [1e38, -3.0e38, 2.0**127, 1.0, -1e-30, 7.0, 3.4e38, -1e37],  # huge (near FLT_MAX may decode to inf, as libzfp)
        [0.0, -0.0, 0.0, -0.0, 1.5, -2.5, 0.0, -0.0],  # signed zeros
        [1.0, -1.0, 1e-7, -1e7, 3.0, -3.0, 1e5, -1e-5],  # mixed sign, wide range
    ],
    ids=["denormal", "huge", "zeros", "mixed"],
)
def test_given_extreme_finite_values_when_encoded_then_bytes_and_decode_equal_zfpy(values, dims):
    x = torch.tensor(values * 4, dtype=torch.float32)
    for rate in (2.125 if dims == 1 else 0.53125, 8, 31.5):
        assert_all_backends_match_zfpy(x, rate, dims)


@pytest.mark.parametrize("dims", [1, 2])
def test_given_tiny_blocks_when_encoded_then_all_zero_block_and_decode_plus_zero(dims):
    """libzfp overflows its scale factor for blocks with max |v| < 2^-98 (float) and writes garbage; we
    define such blocks as all-zero blocks on every backend. The block just above the threshold is exact."""
    S = 4**dims
    tiny = torch.tensor([2.0**-99, -(2.0**-100), 1e-40, 3e-45] * (S // 4), dtype=torch.float32)
    safe = torch.tensor([2.0**-98, -(2.0**-100), 1e-40, 3e-45] * (S // 4), dtype=torch.float32)
    x = torch.cat([safe, tiny, safe])
    reference = x.clone()
    reference[S : 2 * S] = 0
    expected = zfpy_bytes(reference, 8, dims)
    assert not np.array_equal(zfpy_bytes(x, 8, dims), expected)  # libzfp's garbage, which we do not emit
    for codec in codecs(8, dims).values():
        payload = codec.encode(x)
        assert np.array_equal(payload.numpy(), expected)
        decoded = codec.decode(payload, x.numel(), x.dtype)
        assert torch.equal(decoded[S : 2 * S], torch.zeros(S)) and not decoded[S : 2 * S].signbit().any()
        assert same_bits(decoded, zfpy_decode(payload, x.numel(), x.dtype, 8, dims))


def test_given_tiny_float64_blocks_when_encoded_then_threshold_is_two_to_minus_962():
    x = torch.tensor([2.0**-962, 1e-300, -1e-310, 0.0, 2.0**-963, -1e-300, 1e-320, 0.0], dtype=torch.float64)
    reference = x.clone()
    reference[4:] = 0
    for codec in codecs(16, 1).values():
        payload = codec.encode(x)
        assert np.array_equal(payload.numpy(), zfpy_bytes(reference, 16, 1))
        assert torch.equal(codec.decode(payload, 8, torch.float64)[4:], torch.zeros(4, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=["f32", "f64", "bf16"])
@pytest.mark.parametrize("dims", [1, 2])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_given_non_finite_values_when_round_tripped_then_whole_block_is_nan_and_others_exact(bad, dims, dtype):
    S = 4**dims
    n = 5 * S + (3 if dims == 1 else 8)  # partial last block; numel % 4 == 0 for dims=2 (zfpy reference)
    x = sample(n, dtype, seed=3)
    x[S + 2] = bad  # second block
    x[n - 1] = bad  # partial last block
    zeroed = x.clone()
    zeroed[S : 2 * S] = 0
    zeroed[5 * S :] = 0
    payloads, decodes = {}, {}
    for backend, codec in codecs(9.25, dims).items():
        payload = codec.encode(x)
        payloads[backend] = payload
        decoded = decodes[backend] = codec.decode(payload, n, dtype)
        nan = torch.isnan(decoded)
        assert nan[S : 2 * S].all() and nan[5 * S :].all()
        assert not nan[:S].any() and not nan[2 * S : 5 * S].any()
        clean = codec.decode(codec.encode(zeroed), n, dtype)
        keep = torch.ones(n, dtype=torch.bool)
        keep[S : 2 * S] = False
        keep[5 * S :] = False
        assert torch.equal(decoded[keep], clean[keep])
    for backend in payloads:
        assert torch.equal(payloads[backend], payloads["emulated"])
        assert same_bits(decodes[backend], decodes["emulated"])  # the same NaN bits too
    # the marker is the header flag of an otherwise all-zero block: clearing it gives zfpy's bytes of
    # the input with those blocks zeroed
    marked = payloads["emulated"].numpy().copy()
    maxbits = math.floor(4**dims * 9.25 + 0.5)
    for block in (1, 5):
        bit = block * maxbits
        assert (marked[bit >> 3] >> (bit & 7)) & 1 == 1
        marked[bit >> 3] &= ~np.uint8(1 << (bit & 7))
    assert np.array_equal(marked, zfpy_bytes(zeroed.float() if dtype == torch.bfloat16 else zeroed, 9.25, dims))


@pytest.mark.parametrize("dims", [1, 2])
def test_given_all_nan_input_when_round_tripped_then_all_nan_on_every_backend(dims):
    x = torch.full((37,), float("nan"))
    results = [c.decode(c.encode(x), 37, torch.float32) for c in codecs(4, dims).values()]
    assert all(torch.isnan(r).all() for r in results)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 7, 13, 18, 31, 1021])
def test_given_dims2_and_partial_last_row_when_encoded_then_row_padded_like_zfp_partial_block(n):
    """numel % 4 != 0 with dims=2: the last row is padded along x with zfp's rule (a->aaaa, ab->abba,
    abc->abca), then zfp pads missing rows; both backends agree with zfpy on that padded array."""
    x = sample(n, torch.float32, seed=n)
    values = x.tolist()
    tail = values[n - n % 4 :]
    padded_tail = {1: lambda t: [t[0]] * 4, 2: lambda t: [t[0], t[1], t[1], t[0]],
                   3: lambda t: [t[0], t[1], t[2], t[0]]}[n % 4](tail)
    padded = torch.tensor(values[: n - n % 4] + padded_tail, dtype=torch.float32)
    expected = zfpy_bytes(padded, 10, 2)
    ref_decoded = zfpy_decode(torch.from_numpy(expected.copy()), padded.numel(), torch.float32, 10, 2)[:n]
    for codec in codecs(10, 2).values():
        payload = codec.encode(x)
        assert np.array_equal(payload.numpy(), expected)
        assert same_bits(codec.decode(payload, n, torch.float32), ref_decoded)


@pytest.mark.parametrize("dims", [1, 2])
def test_given_non_contiguous_input_when_encoded_then_bytes_equal_zfpy_of_its_values(dims):
    base = sample(64 * 24, torch.float32, seed=11).reshape(64, 24)
    for x in (base.t(), base[:, ::3], base[::2, 1:]):
        assert not x.is_contiguous()
        flat = x.contiguous().reshape(-1)
        expected = zfpy_bytes(flat, 6.5, dims)
        for codec in codecs(6.5, dims).values():
            assert np.array_equal(codec.encode(x).numpy(), expected)
        assert torch.equal(base, sample(64 * 24, torch.float32, seed=11).reshape(64, 24))  # input untouched


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dims", [1, 2])
def test_given_half_precision_input_when_encoded_then_widened_to_float32_and_decoded_to_its_dtype(dtype, dims):
    x = sample(1000, torch.float32, seed=5).clamp(-6e4, 6e4).to(dtype)
    expected = zfpy_bytes(x.float(), 12, dims)
    ref = zfpy_decode(torch.from_numpy(expected.copy()), 1000, torch.float32, 12, dims).to(dtype)
    for codec in codecs(12, dims).values():
        payload = codec.encode(x)
        assert payload.numel() == codec.encoded_nbytes(1000, dtype) == codec.encoded_nbytes(1000, torch.float32)
        assert np.array_equal(payload.numpy(), expected)
        assert same_bits(codec.decode(payload, 1000, dtype), ref)


def test_given_input_when_encoded_then_callers_tensor_is_not_modified():
    x = torch.tensor([1.0, float("nan"), 2.0, 3.0, 1e-35, 2e-35, 0.0, 1e-36, 4.0])
    before = x.clone()
    for codec in codecs(8, 1).values():
        codec.encode(x)
    assert same_bits(x, before)


@pytest.mark.parametrize("dims", [1, 2])
@pytest.mark.parametrize("rate", [2.125, 3.7, 8, 17.3, 64])
def test_given_any_numel_when_encoded_then_size_is_8_ceil_blocks_maxbits_over_64(rate, dims):
    codec = get_codec(f"zfp:rate={rate},dims={dims}", backend=CPU_BACKENDS[-1])
    maxbits = math.floor(4**dims * rate + 0.5)
    for n in (1, 2, 3, 4, 5, 15, 16, 17, 63, 64, 65, 1000, 12345):
        blocks = -(-n // 4**dims)
        assert codec.encoded_nbytes(n, torch.float32) == 8 * (-(-blocks * maxbits // 64))
    x = sample(12345, torch.float32, seed=1)
    assert codec.encode(x).numel() == codec.encoded_nbytes(12345, torch.float32)


@pytest.mark.parametrize(
    "spec",
    ["zfp:rate=2.12", "zfp:rate=2", "zfp:rate=0.53,dims=2", "zfp:rate=0", "zfp:rate=-4", "zfp:rate=nan",
     "zfp:rate=inf", "zfp:rate=64.5", "zfp:rate=1e9", "zfp:rate=8,dims=3", "zfp:rate=abc", "zfp",
     "zfp:rate=8,mode=x"],
)
def test_given_unsafe_or_invalid_spec_when_constructed_then_codec_spec_error(spec):
    with pytest.raises(CodecSpecError):
        get_codec(spec)


@pytest.mark.parametrize("rate,dims", [(2.125, 1), (2.8, 1), (0.53125, 2), (0.7, 2)])
def test_given_float64_below_its_minimum_rate_when_used_then_codec_error_before_libzfp(rate, dims):
    for backend, codec in codecs(rate, dims).items():
        x = torch.ones(16, dtype=torch.float64)
        with pytest.raises(CodecError, match="minimum"):
            codec.encode(x)
        with pytest.raises(CodecError, match="minimum"):
            codec.encoded_nbytes(16, torch.float64)
        with pytest.raises(CodecError):
            codec.decode(torch.zeros(8, dtype=torch.uint8), 16, torch.float64)
        assert codec.encode(x.float()).numel() > 0  # float32 at the same rate is fine


def test_given_empty_or_wrong_input_when_coded_then_codec_error():
    for codec in codecs(8, 1).values():
        with pytest.raises(CodecError):
            codec.encode(torch.empty(0))
        with pytest.raises(CodecError):
            codec.encode(torch.ones(8, dtype=torch.int32))
        payload = codec.encode(torch.ones(100))
        for wrong in (payload[:-8], torch.cat([payload, payload[:8]]), payload[:0]):
            with pytest.raises(CodecError, match="bytes"):
                codec.decode(wrong, 100, torch.float32)
        with pytest.raises(CodecError):
            codec.decode(payload, 0, torch.float32)


def test_given_misaligned_payload_view_when_decoded_then_same_values():
    x = sample(333, torch.float32, seed=2)
    for codec in codecs(7, 2).values():
        payload = codec.encode(x)
        buf = torch.zeros(payload.numel() + 3, dtype=torch.uint8)
        buf[3:] = payload
        assert same_bits(codec.decode(buf[3:], 333, torch.float32), codec.decode(payload, 333, torch.float32))


def test_given_out_tensor_when_decoded_then_filled_in_its_shape():
    x = sample(48, torch.float32, seed=4).reshape(6, 8)
    for codec in codecs(16, 2).values():
        out = torch.empty(6, 8)
        result = codec.decode(codec.encode(x), 48, torch.float32, out=out)
        assert result is out and same_bits(out.reshape(-1), codec.decode(codec.encode(x), 48, torch.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("dims", [1, 2])
def test_given_p_payloads_when_decode_sum_then_equals_fp32_sum_of_decodes_in_row_order(dtype, dims):
    n, p = 1001, 5
    rows = [sample(n, torch.float32, seed=20 + r).clamp(-6e4, 6e4).to(dtype) for r in range(p)]
    rows[2][40] = float("nan")
    for codec in codecs(9, dims).values():
        payloads = torch.stack([codec.encode(r) for r in rows])
        expected = torch.zeros(n)
        for row in payloads:
            expected += codec.decode(row, n, dtype).float()
        expected.masked_fill_(expected.isnan(), float("nan"))  # the rule: a NaN sum is 0x7FC00000
        result = codec.decode_sum(payloads, n, dtype)
        assert result.dtype == torch.float32
        assert same_bits(result, expected)
        assert result.isnan().sum() == 4**dims


def test_given_codec_when_spec_printed_then_round_trips():
    codec = get_codec("zfp:rate=8.5,dims=2")
    assert get_codec(codec.spec) == codec
    assert get_codec("zfp:rate=8").spec == "zfp:rate=8,dims=1"


@pytest.mark.parametrize("rate,dims", [(2.125, 1), (3.3, 1), (8, 1), (0.6, 2), (5.1, 2)])
def test_given_non_finite_values_in_random_blocks_when_round_tripped_then_exactly_those_blocks_are_nan(rate, dims):
    S = 4**dims
    nblocks = 1001
    g = np.random.default_rng(int(rate * 100))
    x = sample(nblocks * S - 1, torch.float32, seed=9)
    bad_blocks = np.sort(g.choice(nblocks, size=300, replace=False))
    x[torch.from_numpy(bad_blocks * S + g.integers(0, S - 1, size=300))] = float("nan")
    expected = torch.zeros(nblocks, dtype=torch.bool)
    expected[torch.from_numpy(bad_blocks)] = True
    results = []
    for codec in codecs(rate, dims).values():
        payload = codec.encode(x)
        decoded = codec.decode(payload, x.numel(), torch.float32)
        nan_blocks = torch.cat([decoded, decoded[-1:]]).view(-1, S).isnan()
        assert torch.equal(nan_blocks.all(dim=1), expected) and torch.equal(nan_blocks.any(dim=1), expected)
        results.append((payload, decoded))
    for payload, decoded in results[1:]:
        assert torch.equal(results[0][0], payload) and same_bits(results[0][1], decoded)
