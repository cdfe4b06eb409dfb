"""int8 / int4 block quantization: byte identity of the torch backend and the GPU kernels' own logic
(kernels/quant.cu built for the host, backend "emulated"), the error bound, exact zeros, unbiased and
reproducible stochastic rounding, the non-finite rule, the payload layout, and typed errors."""
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ccoll
from ccoll.errors import CodecError, CodecSpecError

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SIZES = [1, 3, 4, 5, 255, 256, 257, 1023]
QMAX = {"int8": 127, "int4": 7}


def _data(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Heavy-tailed values (magnitudes spread over ~6 decades) with some exact zeros."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp(2 * torch.randn(n, generator=g))
    x[torch.rand(n, generator=g) < 0.05] = 0.0
    if dtype == torch.float16:
        x = x.clamp(-6e4, 6e4)
    return x.to(dtype)


def _codecs(spec: str):
    return ccoll.get_codec(spec, backend="torch"), ccoll.get_codec(spec, backend="emulated")


def _assert_same_values(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal values and equal NaN positions (NaN payload bits may differ between torch and C casts)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    assert torch.equal(nan_a, nan_b)
    assert torch.equal(a[~nan_a], b[~nan_b])


def _bound(x: torch.Tensor, codec, dtype: torch.dtype) -> torch.Tensor:
    """Per-element round-to-nearest bound absmax/(2 qmax) of each element's block, plus fp32 rounding slack
    (a few ulp of absmax) and the output dtype's half-ulp."""
    block, qmax = codec.block, codec.qmax
    xf = x.float()
    pad = (-xf.numel()) % block
    absmax = torch.nn.functional.pad(xf.abs(), (0, pad)).view(-1, block).amax(1)
    per_elem = absmax.repeat_interleave(block)[: xf.numel()]
    out_ulp = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[dtype]
    return per_elem / (2 * qmax) * (1 + 2.0**-18) + per_elem * 2.0**-22 + xf.abs() * 2 * out_ulp + 6e-8 * (dtype == torch.float16)


@pytest.mark.parametrize("name", ["int8", "int4"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_given_many_sizes_and_blocks_when_encoding_expect_emulated_bytes_equal_torch_bytes(name, rounding, dtype):
    for block in (8, 24, 64, 256):
        spec = f"{name}:block={block},round={rounding},seed=7"
        ct, ce = _codecs(spec)
        for n in SIZES:
            x = _data(n, dtype, seed=n + block)
            pt, pe = ct.encode(x), ce.encode(x)
            assert pt.numel() == ct.encoded_nbytes(n, dtype)
            assert torch.equal(pt, pe), (spec, n)
            yt = ct.decode(pt, n, dtype)
            assert yt.dtype == dtype and yt.shape == (n,)
            _assert_same_values(yt, ce.decode(pt, n, dtype))


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_given_large_odd_tensor_when_encoding_expect_backends_identical_across_chunks(name):
    n = (1 << 20) + 3  # several torch chunks, a partial last block, an odd int4 tail
    x = _data(n, torch.float32, seed=1)
    for rounding in ("nearest", "stochastic"):
        ct, ce = _codecs(f"{name}:block=64,round={rounding},seed=99")
        pt = ct.encode(x)
        assert torch.equal(pt, ce.encode(x))
        _assert_same_values(ct.decode(pt, n, torch.float32), ce.decode(pt, n, torch.float32))


@pytest.mark.parametrize("name", ["int8", "int4"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_given_round_to_nearest_when_decoding_expect_error_within_half_step_of_block_absmax(name, dtype):
    codec = ccoll.get_codec(f"{name}:block=32", backend="torch")
    x = _data(10007, dtype, seed=3)
    y = codec.decode(codec.encode(x), x.numel(), dtype)
    err = (y.float() - x.float()).abs()
    assert bool((err <= _bound(x, codec, dtype)).all())
    # and the bound is tight: the quantization step is actually used (guards against a lossless bug)
    assert float(err.max()) > 0


@pytest.mark.parametrize("backend", ["torch", "emulated"])
@pytest.mark.parametrize("name", ["int8", "int4"])
def test_given_ties_when_rounding_to_nearest_expect_half_to_even(name, backend):
    qmax = QMAX[name]
    codec = ccoll.get_codec(f"{name}:block=8", backend=backend)
    # absmax = qmax so the scale is exactly 1 and x/scale is x: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> -0
    x = torch.tensor([qmax, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5], dtype=torch.float32)
    y = codec.decode(codec.encode(x), 8, torch.float32)
    assert y.tolist() == [qmax, 0.0, 2.0, 2.0, 0.0, -2.0, -2.0, 4.0]


@pytest.mark.parametrize("backend", ["torch", "emulated"])
@pytest.mark.parametrize("name", ["int8", "int4"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_given_zeros_when_round_tripping_expect_exact_zeros_and_no_nan(backend, name, rounding):
    codec = ccoll.get_codec(f"{name}:block=16,round={rounding}", backend=backend)
    x = _data(100, torch.float32, seed=5)
    x[16:48] = 0.0  # two all-zero blocks
    x[50] = -0.0
    y = codec.decode(codec.encode(x), 100, torch.float32)
    assert not bool(torch.isnan(y).any())
    assert bool((y[x == 0] == 0).all())
    z = torch.zeros(33, dtype=torch.bfloat16)
    assert torch.equal(codec.decode(codec.encode(z), 33, torch.bfloat16), z)


@pytest.mark.parametrize("name", ["int8", "int4"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_given_tiny_and_huge_magnitudes_expect_finite_identical_and_bounded(name, rounding):
    """Subnormal scales (absmax < 2^-119, the clamp path), scales that underflow to 0, and fp32's largest
    values all stay finite, bounded and byte-identical across backends."""
    ct, ce = _codecs(f"{name}:block=8,round={rounding}")
    g = torch.Generator().manual_seed(11)
    mags = [1e-45, 1e-44, 3e-42, 1e-39, 2e-38, 1e-37, 1e-30, 3e38, 3.4e38]
    x = torch.cat([torch.randn(8, generator=g).clamp(-1, 1) * m for m in mags]).float()
    fmax = torch.finfo(torch.float32).max
    x = torch.cat([x, torch.tensor([fmax, -fmax / 3, 1.0, 0, 0, 0, 0, 0]), torch.full((8,), -fmax)])
    pt = ct.encode(x)
    assert torch.equal(pt, ce.encode(x))
    y = ct.decode(pt, x.numel(), torch.float32)
    assert bool(torch.isfinite(y).all())
    _assert_same_values(y, ce.decode(pt, x.numel(), torch.float32))
    absmax = x.view(-1, 8).abs().amax(1).repeat_interleave(8)
    # never worse than dropping the block, or (a tiny block's step is 2^-126) than one step
    assert bool(((y - x).abs() <= absmax.clamp(min=2.0**-126)).all())
    normal = absmax >= 2.0**-100
    if rounding == "nearest":
        assert bool(((y - x).abs() <= _bound(x, ct, torch.float32))[normal].all())


@pytest.mark.parametrize("backend", ["torch", "emulated"])
@pytest.mark.parametrize("name", ["int8", "int4"])
def test_given_values_near_half_steps_expect_q_from_the_multiply_by_one_reciprocal_per_block(name, backend):
    """The documented rule q = rint(x * fl(1 / scale)), not rint(x / scale): values a few ulp from
    (k + 1/2) * scale, where the two differ for ~5% of them (the control below), computed here in numpy."""
    import numpy as np

    qmax, block, nblocks = QMAX[name], 8, 4096
    rng = np.random.default_rng(3)
    absmax = rng.uniform(0.5, 2.0, nblocks).astype(np.float32)
    scale = (absmax / np.float32(qmax)).astype(np.float32)
    inv = (np.float32(1) / scale).astype(np.float32)
    k = rng.integers(-qmax, qmax, (nblocks, block - 1)).astype(np.float32)
    near = ((k + np.float32(0.5)) * scale[:, None]).astype(np.float32)
    near = (near.view(np.int32) + rng.integers(-2, 3, near.shape).astype(np.int32)).view(np.float32)
    x = np.concatenate([absmax[:, None], np.clip(near, -absmax[:, None], absmax[:, None])], axis=1)
    q_mul = np.clip(np.rint((x * inv[:, None]).astype(np.float32)), -qmax, qmax).astype(np.int64).reshape(-1)
    q_div = np.clip(np.rint((x / scale[:, None]).astype(np.float32)), -qmax, qmax).astype(np.int64).reshape(-1)
    assert (q_mul != q_div).mean() > 0.02  # the control: the data tells the two rules apart
    codec = ccoll.get_codec(f"{name}:block={block}", backend=backend)
    payload = codec.encode(torch.from_numpy(x.reshape(-1)))
    assert torch.equal(payload[: 4 * nblocks].view(torch.float32), torch.from_numpy(scale))
    y = codec.decode(payload, x.size, torch.float32).double()
    q = torch.round(y / torch.from_numpy(scale).double().repeat_interleave(block)).long()
    assert torch.equal(q, torch.from_numpy(q_mul))


@pytest.mark.parametrize("backend", ["torch", "emulated"])
@pytest.mark.parametrize("name", ["int8", "int4"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_given_a_tiny_block_expect_the_smallest_normal_scale_and_steps_of_it(name, rounding, backend):
    """0 < absmax < qmax 2^-126: scale 2^-126 (so 1 / scale is finite), q = rint(x 2^126) exactly; an all-zero
    block keeps scale 0."""
    codec = ccoll.get_codec(f"{name}:block=8,round={rounding}", backend=backend)
    step = 2.0**-126
    tiny = torch.tensor([3.0, -2.0, 0.5, 1.5, 2.5, -0.25, 1e-7, 0.0]) * step  # q: 3 -2 0 2 2 -0 0 0
    x = torch.cat([tiny, torch.zeros(8)])
    payload = codec.encode(x)
    assert payload[:8].view(torch.float32).tolist() == [step, 0.0]
    y = codec.decode(payload, 16, torch.float32)
    if rounding == "nearest":
        assert (y[:8] / step).tolist() == [3.0, -2.0, 0.0, 2.0, 2.0, 0.0, 0.0, 0.0]
    else:
        assert bool(((y[:8] - tiny).abs() < step).all())
    assert y[8:].tolist() == [0.0] * 8


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_given_stochastic_rounding_when_averaging_expect_unbiased_mean(name):
    qmax, n = QMAX[name], 1 << 18
    codec = ccoll.get_codec(f"{name}:block=256,round=stochastic,seed=1", backend="torch")
    x = torch.full((n,), 0.3)
    x[::256] = 1.0  # absmax 1 in every block: scale = 1/qmax, 0.3 sits between two levels
    y = codec.decode(codec.encode(x), n, torch.float32)
    scale = 1.0 / qmax
    frac = 0.3 * qmax - math.floor(0.3 * qmax)
    vals = y[x == 0.3].double()
    lo, hi = math.floor(0.3 * qmax) * scale, math.ceil(0.3 * qmax) * scale
    assert bool(((vals - lo).abs() < 1e-6).logical_or((vals - hi).abs() < 1e-6).all())  # only the two neighbours
    sigma = scale * math.sqrt(frac * (1 - frac) / vals.numel())
    assert abs(float(vals.mean()) - 0.3) < 6 * sigma  # round-to-nearest is off by ~frac*scale >> 6 sigma
    assert abs(float((vals > 0.3).double().mean()) - frac) < 6 * math.sqrt(frac * (1 - frac) / vals.numel())


def test_given_stochastic_rounding_when_varying_seed_expect_unbiased_per_element_mean():
    x = torch.tensor([127.0, 10.25, -3.75, 0.5, 0.0, -127.0, 64.25, 1.0])  # scale 1: fractions 1/4, 3/4, 1/2
    acc = torch.zeros(8, dtype=torch.float64)
    base = ccoll.get_codec("int8:block=8,round=stochastic", backend="torch")
    seeds = 1000  # 6 sigma = 0.095 < 0.25, the bias round-to-nearest would have
    for seed in range(seeds):
        c = base.with_seed(seed)
        acc += c.decode(c.encode(x), 8, torch.float32).double()
    mean = acc / seeds
    assert float((mean - x.double()).abs().max()) < 6 * 0.5 / math.sqrt(seeds)
    assert mean[4] == 0.0  # zero never moves


@pytest.mark.parametrize("backend", ["torch", "emulated"])
def test_given_seed_when_encoding_twice_expect_same_bytes_and_other_seed_differs(backend):
    x = _data(5000, torch.float32, seed=2)
    a = ccoll.get_codec("int4:block=64,round=stochastic,seed=5", backend=backend)
    b = ccoll.get_codec("int4:block=64,round=stochastic,seed=6", backend=backend)
    assert torch.equal(a.encode(x), a.encode(x))
    assert not torch.equal(a.encode(x), b.encode(x))
    assert torch.equal(a.with_seed(6).encode(x), b.encode(x))
    nearest = ccoll.get_codec("int4:block=64", backend=backend)
    assert nearest.encode(x).numel() == a.encode(x).numel()


@pytest.mark.parametrize("backend", ["torch", "emulated"])
@pytest.mark.parametrize("name", ["int8", "int4"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_given_non_finite_value_expect_whole_block_nan_and_others_untouched(backend, name, bad):
    codec = ccoll.get_codec(f"{name}:block=16", backend=backend)
    x = _data(40, torch.float32, seed=8)
    x[20] = bad  # block 1 of [0,16) [16,32) [32,40)
    y = codec.decode(codec.encode(x), 40, torch.float32)
    assert bool(torch.isnan(y[16:32]).all())
    assert not bool(torch.isnan(y[:16]).any()) and not bool(torch.isnan(y[32:]).any())
    clean = x.clone()
    clean[16:32] = 0
    y_clean = codec.decode(codec.encode(clean), 40, torch.float32)
    assert torch.equal(y[:16], y_clean[:16]) and torch.equal(y[32:], y_clean[32:])


def test_given_small_input_expect_documented_payload_layout():
    """[nblocks fp32 scales, zero-padded to 16 B][q, two's complement, int4 low nibble first, padded to 16 B]."""
    x = torch.tensor([7.0, -7.0, 1.0, -1.0, 0.0, 3.0, 2.0, -2.0, 127.0, 63.5])
    p8 = ccoll.get_codec("int8:block=8", backend="emulated").encode(x)
    assert p8.numel() == 16 + 16
    scale0 = torch.tensor(7.0, dtype=torch.float32) / 127
    assert p8[:8].view(torch.float32).tolist() == [scale0.item(), 1.0]
    assert p8[8:16].tolist() == [0] * 8
    # 1/scale0 = 18.14.. -> 18; block 1 has scale 1: 63.5 is a tie -> 64 (even)
    assert p8[16:26].view(torch.int8).tolist() == [127, -127, 18, -18, 0, 54, 36, -36, 127, 64]
    assert p8[26:].tolist() == [0] * 6
    x[8:] = torch.tensor([14.0, 7.0])
    p4 = ccoll.get_codec("int4:block=8", backend="torch").encode(x)
    assert p4.numel() == 16 + 16
    assert p4[:8].view(torch.float32).tolist() == [1.0, 2.0]
    # q = [7,-7,1,-1,0,3,2,-2 | 7,4 (3.5 is a tie -> 4)]; nibbles 7,9,1,F,0,3,2,E,7,4
    assert p4[16:21].tolist() == [0x97, 0xF1, 0x30, 0xE2, 0x47]
    assert p4[21:].tolist() == [0] * 11


@pytest.mark.parametrize("name", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_given_p_payloads_when_decode_sum_expect_row_order_sum_of_decodes_on_both_backends(name, dtype):
    ct, ce = _codecs(f"{name}:block=24")
    n, p = 1001, 3
    payloads = torch.stack([ct.encode(_data(n, dtype, seed=20 + r)) for r in range(p)])
    expected = torch.zeros(n)
    for r in range(p):
        expected += ct.decode(payloads[r], n, dtype).float()
    for codec in (ct, ce):
        got = codec.decode_sum(payloads, n, dtype)
        assert got.dtype == torch.float32
        assert torch.equal(got, expected)


def test_given_misaligned_payload_view_and_out_tensor_expect_same_decode():
    codec = ccoll.get_codec("int8:block=64", backend="emulated")
    x = _data(300, torch.float32, seed=4).view(20, 15).t()  # non-contiguous input
    payload = codec.encode(x)
    assert torch.equal(payload, ccoll.get_codec("int8:block=64", backend="torch").encode(x))
    buf = torch.zeros(payload.numel() + 1, dtype=torch.uint8)
    buf[1:] = payload
    ref = codec.decode(payload, 300, torch.float32)
    for backend in ("torch", "emulated"):
        c = ccoll.get_codec("int8:block=64", backend=backend)
        assert torch.equal(c.decode(buf[1:], 300, torch.float32), ref)
        out = torch.empty(15, 20)
        assert c.decode(payload, 300, torch.float32, out=out) is out
        assert torch.equal(out.reshape(-1), ref)


@pytest.mark.parametrize(
    "spec, match",
    [
        ("int8", "required"),
        ("int8:block=0", "multiple of 8"),
        ("int8:block=12", "multiple of 8"),
        ("int4:block=4", "multiple of 8"),
        ("int4:block=2097152", "multiple of 8"),
        ("int8:block=-8", "multiple of 8"),
        ("int8:block=abc", "not a valid int"),
        ("int8:block=64,round=up", "nearest, stochastic"),
        ("int8:block=64,seed=-1", "seed"),
        ("int8:block=64,seed=4294967296", "seed"),
        ("int4:block=64,rate=8", "unknown parameter"),
    ],
)
def test_given_invalid_spec_expect_codec_spec_error_naming_the_rule(spec, match):
    with pytest.raises(CodecSpecError, match=match):
        ccoll.get_codec(spec)


@pytest.mark.parametrize("backend", ["torch", "emulated"])
def test_given_wrong_payload_or_dtype_expect_codec_error(backend):
    codec = ccoll.get_codec("int4:block=64", backend=backend)
    payload = codec.encode(torch.randn(100))
    with pytest.raises(CodecError, match="expected"):
        codec.decode(payload[:-1], 100, torch.float32)
    with pytest.raises(CodecError, match="expected"):
        codec.decode(payload, 200, torch.float32)
    with pytest.raises(CodecError, match="uint8"):
        codec.decode(payload.view(torch.int8), 100, torch.float32)
    with pytest.raises(CodecError, match="does not take"):
        codec.encode(torch.randn(10, dtype=torch.float64))
    with pytest.raises(CodecError, match="empty"):
        codec.encode(torch.empty(0))
    with pytest.raises(CodecError, match="expected"):
        codec.decode_sum(torch.stack([payload, payload])[:, 1:], 100, torch.float32)


def test_given_spec_expect_canonical_spec_round_trips_and_sizes_are_exact():
    codec = ccoll.get_codec("int4:block=64,round=stochastic,seed=3")
    assert ccoll.get_codec(codec.spec) == codec
    assert codec.encoded_nbytes(100, torch.float32) == 16 + 64  # 2 scales -> 16 B, 50 q bytes -> 64 B
    assert ccoll.get_codec("int8:block=256").encoded_nbytes(1 << 20, torch.bfloat16) == (1 << 20) + 4 * 4096
    assert codec.lossy and not codec.exact_for(torch.float32)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["int8", "int4"]),
    block=st.sampled_from([8, 16, 40, 64, 256, 1024]),
    n=st.integers(1, 3000),
    dtype=st.sampled_from(DTYPES),
    log_scale=st.floats(-30, 30),
    seed=st.integers(0, 2**32 - 1),
)
def test_property_round_trip_sizes_bytes_and_bound(name, block, n, dtype, log_scale, seed):
    g = torch.Generator().manual_seed(seed % 1000)
    x = torch.randn(n, generator=g) * math.exp(log_scale)
    x = x.to(dtype)
    if not bool(torch.isfinite(x).all()):
        x = torch.nan_to_num(x, posinf=0.0, neginf=0.0)
    for rounding in ("nearest", "stochastic"):
        spec = f"{name}:block={block},round={rounding},seed={seed}"
        ct, ce = _codecs(spec)
        pt = ct.encode(x)
        assert pt.numel() == ct.encoded_nbytes(n, dtype) and pt.numel() % 16 == 0
        assert torch.equal(pt, ce.encode(x))
        y = ct.decode(pt, n, dtype)
        _assert_same_values(y, ce.decode(pt, n, dtype))
        assert bool(torch.isfinite(y).all())
        xf = x.float()
        absmax = torch.nn.functional.pad(xf.abs(), (0, (-n) % block)).view(-1, block).amax(1)
        if bool((absmax >= 2.0**-100).all()):
            if rounding == "nearest":
                assert bool(((y.float() - xf).abs() <= _bound(x, ct, dtype)).all())
            else:  # one full quantization step
                assert bool(((y.float() - xf).abs() <= 2 * _bound(x, ct, dtype)).all())


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["int8", "int4"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_given_cuda_tensor_when_cupy_backend_expect_same_bytes_as_torch_backend(name, rounding, dtype):
    ct = ccoll.get_codec(f"{name}:block=64,round={rounding},seed=3", backend="torch")
    cc = ccoll.get_codec(f"{name}:block=64,round={rounding},seed=3", backend="cupy")
    for n in (1, 5, 257, 4099, (1 << 20) + 3):
        x = _data(n, dtype, seed=n)
        pt = ct.encode(x)
        pc = cc.encode(x.cuda())
        assert torch.equal(pc.cpu(), pt)
        _assert_same_values(cc.decode(pc, n, dtype).cpu(), ct.decode(pt, n, dtype))
        rows = torch.stack([pt, pt])
        assert torch.equal(cc.decode_sum(rows.cuda(), n, dtype).cpu(), ct.decode_sum(rows, n, dtype))
