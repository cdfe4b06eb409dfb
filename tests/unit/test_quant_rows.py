"""The batched quantization API (encode_rows with and without error feedback, decode_rows, decode_sum into
out): the torch backend, the GPU kernels' own logic built for the host ("emulated") and the base class's
reference loop (Codec._encode_rows_generic / _decode_rows_generic, ccoll/codecs/base.py) agree byte for
byte -- payloads and residuals -- on partial blocks, rows wholly past the end, numel < row_numel, and
zero / subnormal / huge / non-finite blocks, and every kernel the module launches exists. (That the kernels
carry no flush-to-zero instruction even compiled as CuPy compiles them, -ftz=true, is ``make kernels-check``'s
nvcc pass: tests/unit/test_kernels_build.py.)"""
import math
import re
import shutil

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ccoll
from ccoll import kernels
from ccoll.codecs import quant
from ccoll.codecs.base import Codec
from ccoll.errors import CodecSpecError

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _mixed(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Gradient-like values with blocks of the awkward kinds: all zeros, subnormal, huge, and (rarely)
    NaN / +-Inf, at random positions."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp(2 * torch.randn(n, generator=g))
    kind = torch.randint(0, 12, (n // 8 + 1,), generator=g).repeat_interleave(8)[:n]
    x = torch.where(kind == 0, torch.zeros(()), x)
    x = torch.where(kind == 1, x * 1e-41, x)  # fp32 subnormals (bf16 keeps them, fp16 flushes them)
    x = torch.where(kind == 2, x.clamp(-1, 1) * 3e38, x)
    special = torch.rand(n, generator=g)
    x = torch.where(special < 0.002, torch.tensor(math.nan), x)
    x = torch.where((special > 0.998), torch.tensor(math.inf) * x.sign(), x)
    return x.to(dtype)


def _blocks_of_every_kind(n: int, dtype: torch.dtype, seed: int, block: int) -> torch.Tensor:
    """Whole blocks each of one kind, so that every kind reaches the host build's streaming paths (which take
    whole blocks; kernels/quant.cu "the CPU's streaming paths") as one block: gradient-like values, all zeros,
    -0.0, tiny (absmax below qmax 2^-126: the smallest normal scale), absmax within an ulp of FLT_MAX (the
    lowered scale and the clamp), one NaN, one +-Inf, a single nonzero value, exact half steps (ties)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp(2 * torch.randn(n, generator=g))
    nb = -(-n // block)
    kind = torch.randint(0, 9, (nb,), generator=g).repeat_interleave(block)[:n]
    pos = torch.arange(n) % block
    flt_max = torch.finfo(torch.float32).max
    x = torch.where(kind == 1, torch.zeros(()), x)
    x = torch.where(kind == 2, torch.full((), -0.0), x)
    x = torch.where(kind == 3, x.clamp(-1, 1) * 1e-38, x)
    x = torch.where(kind == 4, torch.where(pos == 0, torch.full((), flt_max), x.clamp(-1, 1) * 1e38), x)
    x = torch.where((kind == 5) & (pos == 3), torch.tensor(math.nan), x)
    x = torch.where((kind == 6) & (pos == 1), torch.tensor(-math.inf), x)
    x = torch.where(kind == 7, torch.where(pos == 2, torch.full((), 3.5), torch.zeros(())), x)
    x = torch.where(kind == 8, (pos % 15 - 7).float() * 0.5, x)  # absmax 3.5: ties of int4's step 0.5
    return x.to(dtype)


#: the inputs the backend comparisons run: ``mixed`` (values of every kind in blocks of 8, so most quant
#: blocks hold several kinds) and ``blocks`` (whole blocks of one kind each, ``_blocks_of_every_kind``)
DATA = ("mixed", "blocks")


def _data(kind: str, n: int, dtype: torch.dtype, seed: int, block: int) -> torch.Tensor:
    return _mixed(n, dtype, seed) if kind == "mixed" else _blocks_of_every_kind(n, dtype, seed, block)


def _feedback(rows: int, row_numel: int, seed: int) -> torch.Tensor:
    """A residual buffer as a caller might hand it over: small values, a few non-finite ones, and
    non-zero entries in the padding (the reference compensates padding with them too)."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(rows * row_numel, generator=g) * 0.1
    r[torch.rand(r.numel(), generator=g) < 0.001] = math.nan
    return r


def _codecs(spec: str):
    return ccoll.get_codec(spec, backend="torch"), ccoll.get_codec(spec, backend="emulated")


def _encode(codec, src, rows, row_numel, feedback, salt, generic=False):
    out = torch.full((rows, codec.encoded_nbytes(row_numel, src.dtype)), 0xA5, dtype=torch.uint8)  # no stale zeros
    fb = None if feedback is None else feedback.clone()
    if generic:
        Codec._encode_rows_generic(codec, src, out, row_numel, fb, salt)
    else:
        assert codec.encode_rows(src, out, row_numel, feedback=fb, salt=salt) is out
    return out, fb


def _assert_same_values(a: torch.Tensor, b: torch.Tensor) -> None:
    """The same bytes, NaNs included: every backend writes the one NaN pattern of the output dtype
    (tests/unit/test_nan_pattern.py), so nothing is normalised before comparing."""
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)), \
        f"{int((a.contiguous().view(torch.uint8) != b.contiguous().view(torch.uint8)).sum())} bytes differ"


def _check_rows(spec, dtype, numel, rows, row_numel, with_feedback, salt=0, seed=0, reference=True, data="mixed"):
    ct, ce = _codecs(spec)
    src = _data(data, numel, dtype, seed, ct.block)
    fb = _feedback(rows, row_numel, seed) if with_feedback else None
    pt, ft = _encode(ct, src, rows, row_numel, fb, salt)
    pe, fe = _encode(ce, src, rows, row_numel, fb, salt)
    assert torch.equal(pt, pe), "torch and emulated payloads differ"
    if with_feedback:
        assert torch.equal(ft, fe), "torch and emulated residuals differ"
        assert bool(torch.isfinite(ft).all()) and bool((ft[numel:] == 0).all())
    if reference:
        pg, fg = _encode(ct, src, rows, row_numel, fb, salt, generic=True)
        assert torch.equal(pt, pg), "payload differs from the base-class reference"
        if with_feedback:
            assert torch.equal(ft, fg), "residuals differ from the base-class reference"
    for out_numel in {numel, min(rows * row_numel, numel + 3)}:
        yt = torch.full((out_numel,), 7.0, dtype=dtype)
        ye = yt.clone()
        yg = yt.clone()
        assert ct.decode_rows(pt, yt, row_numel) is yt
        ce.decode_rows(pt, ye, row_numel)
        _assert_same_values(yt, ye)
        if reference:
            Codec._decode_rows_generic(ct, pt, yg, row_numel)
            _assert_same_values(yt, yg)
    return src, pt, ft


@pytest.mark.parametrize("name", ["int8", "int4"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_feedback", [False, True])
@pytest.mark.parametrize("data", DATA)
def test_given_rows_of_every_shape_when_encoding_expect_backends_and_reference_byte_identical(
    name, rounding, dtype, with_feedback, data
):
    spec = f"{name}:block=24,round={rounding},seed=5"
    shapes = [  # (numel, rows, row_numel)
        (96, 4, 24),     # aligned rows, no padding
        (1000, 4, 256),  # last row partly padding; 256 = 10 blocks + a partial one
        (100, 4, 64),    # rows 2 and 3 wholly past the end
        (5, 3, 64),      # numel < row_numel
        (77, 7, 11),     # rows shorter than a block and than an int4 word, odd lengths
        (301, 2, 151),   # odd row length: int4 rows end in a half byte
    ]
    for i, (numel, rows, row_numel) in enumerate(shapes):
        _check_rows(spec, dtype, numel, rows, row_numel, with_feedback, salt=12345 + i, seed=i, data=data)


@pytest.mark.parametrize("spec", ["int8:block=256", "int4:block=64", "int8:block=8", "int4:block=4096",
                                  "int8:block=256,round=stochastic,seed=7", "int4:block=64,round=stochastic,seed=8"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_feedback", [False, True])
@pytest.mark.parametrize("data", DATA)
def test_given_the_policies_blocks_when_encoding_expect_streaming_paths_byte_identical(spec, dtype, with_feedback, data):
    """The block sizes the shipped policies use (int8 256, int4 64) and the extremes, both roundings, on rows of
    whole blocks and rows ending in a partial block or in the tensor's end: the host build's streaming paths
    (whole blocks) and its general code (the rest) against the torch backend, byte for byte --
    payloads, residuals, decode_rows and, below, decode_sum of the rows."""
    block = ccoll.get_codec(spec).block
    for i, (numel, rows, row_numel) in enumerate([
        (8 * block, 2, 4 * block),               # whole blocks only
        (5 * block + 13, 3, 2 * block + 8),      # each row ends in a partial block; the tensor ends mid-block
        (3 * block, 1, 3 * block),               # one row
    ]):
        src, pt, _ = _check_rows(spec, dtype, numel, rows, row_numel, with_feedback, salt=i, seed=40 + i,
                                 reference=block <= 256, data=data)
        ct, ce = _codecs(spec)
        for codec in (ct, ce):
            got = codec.decode_sum(pt, row_numel, dtype)
            if codec is ct:
                expected = got
            else:
                _assert_same_values(expected, got)


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_given_rows_larger_than_a_torch_piece_expect_identical_bytes(name):
    """Long rows split into several pieces, many short rows grouped into several pieces, and outputs large
    enough for the host build's streaming stores (torch vs emulated only: the reference loop would take as
    long as the rest of this file)."""
    _check_rows(f"{name}:block=64", torch.float32, (1 << 20) + 3000, 2, (1 << 20) + 2000, True, salt=3,
                reference=False)
    _check_rows(f"{name}:block=64,round=stochastic,seed=9", torch.bfloat16, 1100 * 1000 - 7, 1100, 1000, True,
                salt=4, reference=False)
    # fp32 outputs of >= 8 MiB: the host build's decodes write them with streaming stores
    row_numel = (1 << 21) + 40
    _, payloads, _ = _check_rows(f"{name}:block=64", torch.float32, 2 * row_numel - 9, 2, row_numel, True, salt=5,
                                 reference=False, data="blocks")
    ct, ce = _codecs(f"{name}:block=64")
    _assert_same_values(ct.decode_sum(payloads, row_numel, torch.float32),
                        ce.decode_sum(payloads, row_numel, torch.float32))


@pytest.mark.parametrize("name", ["int8", "int4"])
@pytest.mark.parametrize("with_feedback", [False, True])
def test_stochastic_rows_index_rule(name, with_feedback):
    """The stochastic index of element j of row i is i * row_numel + j: block-aligned rows encode exactly
    like the whole padded tensor (scales and q bytes), and the salt changes the draw reproducibly."""
    block, rows, row_numel, numel = 32, 5, 96, 430
    codec = ccoll.get_codec(f"{name}:block={block},round=stochastic,seed=77", backend="torch")
    src = torch.randn(numel, generator=torch.Generator().manual_seed(1))
    padded = torch.zeros(rows * row_numel)
    padded[:numel] = src
    fb = torch.randn(rows * row_numel, generator=torch.Generator().manual_seed(2)) * 0.01 if with_feedback else None
    if fb is not None:
        fb[numel:] = 0
        padded = (padded + fb).to(src.dtype)
    salted = codec._salted(99)
    whole = salted.encode(padded)
    out, _ = _encode(codec, src, rows, row_numel, fb, 99)
    nb, scale_nbytes, _ = codec._layout(row_numel)
    _, whole_scale_nbytes, _ = codec._layout(rows * row_numel)
    qrow = row_numel * codec.bits // 8
    for i in range(rows):
        assert torch.equal(out[i, : 4 * nb], whole[4 * nb * i : 4 * nb * (i + 1)])
        assert torch.equal(out[i, scale_nbytes : scale_nbytes + qrow],
                           whole[whole_scale_nbytes + qrow * i : whole_scale_nbytes + qrow * (i + 1)])
    again, _ = _encode(codec, src, rows, row_numel, fb, 99)
    other, _ = _encode(codec, src, rows, row_numel, fb, 100)
    assert torch.equal(out, again) and not torch.equal(out, other)


def test_given_feedback_when_encoding_twice_expect_residual_is_what_was_dropped():
    """residual = (x + previous residual) - decode, for bf16 input (c is rounded to bf16 before encoding,
    the residual keeps the rounding error too)."""
    for backend in ("torch", "emulated"):
        c = ccoll.get_codec("int4:block=16", backend=backend)
        x = torch.randn(200, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
        fb = torch.zeros(2 * 128)
        out = torch.empty(2, c.encoded_nbytes(128, x.dtype), dtype=torch.uint8)
        dec = torch.empty(200, dtype=torch.bfloat16)
        previous = fb.clone()
        for _ in range(2):
            c.encode_rows(x, out, 128, feedback=fb)
            c.decode_rows(out, dec, 128)
            assert torch.equal(fb[:200], (x.float() + previous[:200]) - dec.float())
            assert bool((fb[200:] == 0).all())
            previous = fb.clone()


@pytest.mark.parametrize("name", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_given_many_payloads_when_decode_sum_into_out_expect_row_order_sum_on_both_backends(name, dtype):
    """p = 70 rows: the torch backend sums in several spans; the result is written into the caller's out."""
    ct, ce = _codecs(f"{name}:block=64")
    numel, p = 33001, 70
    payloads = torch.empty(p, ct.encoded_nbytes(numel, dtype), dtype=torch.uint8)
    ct.encode_rows(_mixed(p * numel, dtype, 4), payloads, numel)
    expected = torch.zeros(numel)
    for r in range(p):
        expected += ct.decode(payloads[r], numel, dtype).float()
    expected.masked_fill_(expected.isnan(), math.nan)  # the rule: a NaN sum is 0x7FC00000, whatever the rows held
    for codec in (ct, ce):
        out = torch.full((numel,), 3.0)
        assert codec.decode_sum(payloads, numel, dtype, out=out) is out
        _assert_same_values(out, expected)


def test_given_misaligned_payload_buffers_expect_same_bytes():
    """A [rows, nbytes] view at an odd byte offset of a larger buffer: written through an aligned copy."""
    for backend in ("torch", "emulated"):
        c = ccoll.get_codec("int8:block=32", backend=backend)
        src = torch.randn(150, generator=torch.Generator().manual_seed(6))
        nbytes = c.encoded_nbytes(64, src.dtype)
        aligned = torch.empty(3, nbytes, dtype=torch.uint8)
        c.encode_rows(src, aligned, 64)
        buf = torch.zeros(3 * nbytes + 1, dtype=torch.uint8)
        view = buf[1:].view(3, nbytes)
        c.encode_rows(src, view, 64)
        assert torch.equal(view, aligned)
        y = torch.empty(150)
        c.decode_rows(view, y, 64)
        assert torch.equal(y, c.decode_rows(aligned, torch.empty(150), 64))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["int8", "int4"]),
    block=st.sampled_from([8, 16, 40, 64]),
    rounding=st.sampled_from(["nearest", "stochastic"]),
    dtype=st.sampled_from(DTYPES),
    rows=st.integers(1, 6),
    row_numel=st.integers(1, 300),
    fill=st.floats(0.01, 1.0),
    with_feedback=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.sampled_from(DATA),
)
def test_property_rows_backends_identical(name, block, rounding, dtype, rows, row_numel, fill, with_feedback, seed,
                                          data):
    numel = max(1, int(rows * row_numel * fill))
    _check_rows(f"{name}:block={block},round={rounding},seed={seed}", dtype, numel, rows, row_numel,
                with_feedback, salt=seed * 7919, seed=seed, data=data)


def test_cuda_kernels_list_names_every_entry_point():
    source = kernels.source("quant").read_text()
    # 4 formats x 3 ops x 3 dtypes plain, and rotate=hadamard per words per lane: 1, 2, 4, 8 (int4: 1, 2, 4)
    assert len(quant.CUDA_KERNELS) == 36 + (3 * 4 + 3) * 3 * 3
    for name in quant.CUDA_KERNELS:
        fmt, op, words = re.fullmatch(
            r"ccoll_(int8|int4|fp8e4m3|fp8e5m2)_(\w+?)(?:_rot_w(\d))?_(?:f32|bf16|f16)", name).groups()
        assert f"CQ_FORMAT(MACRO, {fmt}," in source, name
        if words is None:
            assert f"ccoll_##FMT##_{op}_##NAME" in source and f"ccoll_host_##FMT##_{op}_##NAME" in source, name
        else:  # one host twin for every count (a team of one)
            assert f"ccoll_##FMT##_{op}_rot_w##W##_##NAME" in source, name
            assert f"ccoll_host_##FMT##_{op}_rot_##NAME" in source, name
            w8 = f"#define CQ_GLOBALS_ROT8_{fmt}(FMT, F, NAME, TR) CQ_GLOBALS_ROT_W(FMT, F, NAME, TR, 8)"
            assert words != "8" or w8 in source, name
    assert "ccoll_int4_encode_rows_rot_w8_f32" not in quant.CUDA_KERNELS  # 64 values a lane: never launched


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["int8", "int4"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_given_cuda_rows_when_cupy_backend_expect_torch_bytes(name, rounding, dtype):
    pytest.importorskip("cupy")
    spec = f"{name}:block=64,round={rounding},seed=3"
    ct, cc = ccoll.get_codec(spec, backend="torch"), ccoll.get_codec(spec, backend="cupy")
    for numel, rows, row_numel in [(1000, 4, 256), (100, 4, 64), (77, 7, 11), ((1 << 20) + 3, 3, 350000)]:
        src = _mixed(numel, dtype, numel)
        fb = _feedback(rows, row_numel, 1)
        pt, ft = _encode(ct, src, rows, row_numel, fb, 11)
        out = torch.empty(rows, ct.encoded_nbytes(row_numel, dtype), dtype=torch.uint8, device="cuda")
        fc = fb.cuda()
        cc.encode_rows(src.cuda(), out, row_numel, feedback=fc, salt=11)
        assert torch.equal(out.cpu(), pt) and torch.equal(fc.cpu(), ft)
        y = torch.empty(numel, dtype=dtype, device="cuda")
        cc.decode_rows(out, y, row_numel)
        _assert_same_values(y.cpu(), ct.decode_rows(pt, torch.empty(numel, dtype=dtype), row_numel))


def test_given_cupy_glue_when_launches_run_the_host_build_expect_torch_bytes(monkeypatch):
    """The cupy backend's argument lists and grid sizes, checked without a GPU: ``kernels.launch`` is
    replaced by a stand-in that runs the same-named host entry point of the same .cu (the CUDA kernel
    minus its ``team`` argument) and asserts the grid covers the work. The kernels themselves are
    checked on a GPU by test_given_cuda_rows_when_cupy_backend_expect_torch_bytes."""
    import numpy as np

    launched = []
    from ccoll.kernels import call as kernel_call

    dtypes = {name: dtype for dtype, name in kernel_call.SUFFIX.items()}
    quant_bits = {"int8": 8, "int4": 4, "fp8e4m3": 8, "fp8e5m2": 8}

    def fake_launch(module, kernel, grid, block, args, device):
        assert module == "quant" and kernel in quant.CUDA_KERNELS
        assert all(isinstance(a, np.generic) for a in args)
        fmt, op, rot, dtype_name = re.fullmatch(
            r"ccoll_(\w+?)_(encode_rows|decode_rows|decode_sum)(_rot_w[1248])?_(f32|bf16|f16)", kernel).groups()
        values = [int(a) for a in args]
        assert len(values) == len(kernel_call.SIGNATURES[("quant", op + (rot or ""))])
        assert block == (kernel_call.ROT_THREADS if rot else 256)  # rotate: smaller CTAs (registers)
        if op == "encode_rows":  # a team of lanes per block: the grid must cover rows * blocks_per_row teams
            rows, row_numel, block_numel, team = values[2], values[3], values[4], values.pop(5)
            assert grid * block >= rows * -(-row_numel // block_numel) * team
        else:
            if op == "decode_rows":
                rows, row_numel, numel, block_numel = values[1:5]
                units = min(rows, -(-numel // row_numel)) * -(-row_numel // block_numel)
                # 16-byte q groups (4 words) per row
                groups = min(rows, -(-numel // row_numel)) * -(-(-(-row_numel * quant_bits[fmt] // 32)) // 4)
            else:
                numel, block_numel = values[3:5]
                units = -(-numel // block_numel)
                groups = -(-(-(-numel * quant_bits[fmt] // 32)) // 4)
            if rot:  # one team per block
                team = values.pop(6)
                assert grid * block >= units * team
            else:  # one thread per 16-byte q group
                assert grid * block >= groups
        op += rot or ""
        host = kernel_call.host_function(kernel_call.kernel("quant", fmt, op, dtypes[dtype_name]))
        host(*values)
        launched.append(op)

    monkeypatch.setattr(kernels, "launch", fake_launch)
    for spec in ["int8:block=32", "int4:block=16,round=stochastic,seed=4", "fp8:format=e5m2,block=16",
                 "int4:block=16,rotate=hadamard,rotate_seed=3", "fp8:block=32,rotate=hadamard",
                 "int8:block=256,rotate=hadamard,rotate_seed=5"]:  # rotate: 1 word per lane, and 2
        ct = ccoll.get_codec(spec, backend="torch")
        cc = ccoll.get_codec(spec, backend="torch")  # the cupy methods, called directly on CPU tensors
        for dtype in (torch.float32, torch.bfloat16):
            numel, rows, row_numel = 500, 3, 180
            src = _mixed(numel, dtype, 1)
            fb = _feedback(rows, row_numel, 2)
            pt, ft = _encode(ct, src, rows, row_numel, fb, 5)
            out = torch.empty_like(pt)
            fc = fb.clone()
            cc._encode_rows_cupy(src, out, row_numel, fc, 5)
            assert torch.equal(out, pt) and torch.equal(fc, ft)
            y, yt = torch.empty(numel, dtype=dtype), torch.empty(numel, dtype=dtype)
            cc._decode_rows_cupy(out, y, row_numel)
            _assert_same_values(y, ct.decode_rows(pt, yt, row_numel))
            s, st_ = torch.empty(row_numel), torch.empty(row_numel)
            cc._decode_sum_cupy(out, row_numel, dtype, s)
            ct._decode_sum_torch(out, row_numel, dtype, st_)
            _assert_same_values(s, st_)
    assert set(launched) == {f"{op}{rot}" for op in ("encode_rows", "decode_rows", "decode_sum")
                             for rot in ("", "_rot_w1", "_rot_w2")}



def _bits(t: torch.Tensor) -> torch.Tensor:
    """fp32 bit patterns as they are: unlike torch.equal, -0.0 and +0.0 differ here, and so do NaNs."""
    return t.float().view(torch.int32)


@pytest.mark.parametrize("spec", ["int8:block=24", "int4:block=24", "int4:block=16,rotate=hadamard,rotate_seed=3",
                                  "fp8:format=e4m3,block=16"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [1, 2, 5])
def test_given_few_payloads_when_decode_sum_expect_bitwise_row_order_sum_from_positive_zero(spec, dtype, p):
    """decode_sum is (0.0 + decode(row 0)) + decode(row 1) + ... bit for bit. The torch backend decodes row 0
    straight into ``out`` only where that cannot differ (fp32 output of the int formats, unrotated), so
    payloads that decode to -0.0 (fp8's 0x80 byte, the rotation's sign flips) still sum to +0.0; flat's
    two-rank all_reduce sums one row (p = 1)."""
    ct, ce = _codecs(spec)
    numel = 301
    src = _mixed(p * numel, dtype, 11 + p)
    src[:40] = -0.0  # whole blocks of -0.0 in row 0
    payloads = torch.empty(p, ct.encoded_nbytes(numel, dtype), dtype=torch.uint8)
    ct.encode_rows(src, payloads, numel)
    expected = torch.zeros(numel)
    for r in range(p):
        expected += ct.decode(payloads[r], numel, dtype).float()
    expected.masked_fill_(expected.isnan(), math.nan)  # the rule: a NaN sum is 0x7FC00000, whatever the rows held
    for codec in (ct, ce):
        out = torch.full((numel,), 3.0)
        codec.decode_sum(payloads, numel, dtype, out=out)
        assert torch.equal(_bits(out), _bits(expected)), codec.backend


def test_given_every_int4_byte_when_decoding_expect_both_nibbles_sign_extended_on_both_backends():
    """All 256 byte values of the q section (nibble -8 included, which the encoder never writes) decode to
    (low nibble, high nibble) as signed 4-bit values: the torch backend's bytewise integer unpacking."""
    ct, ce = _codecs("int4:block=512")
    payload = torch.zeros(1, ct.encoded_nbytes(512, torch.float32), dtype=torch.uint8)
    payload[0, :4] = torch.tensor([0.5]).view(torch.uint8)
    payload[0, 16:16 + 256] = torch.arange(256, dtype=torch.uint8)
    b = torch.arange(256)
    expected = torch.stack([((b & 15) ^ 8) - 8, ((b >> 4) ^ 8) - 8], dim=1).reshape(-1).float() * 0.5
    for codec in (ct, ce):
        assert torch.equal(codec.decode_rows(payload, torch.empty(512), 512), expected), codec.backend
        assert torch.equal(codec.decode_sum(payload, 512, torch.float32), expected), codec.backend


@pytest.mark.parametrize("with_feedback", [False, True])
def test_given_every_int4_pair_when_encoding_expect_packed_nibbles_on_both_backends(with_feedback):
    """Every pair (even, odd) of q values in [-7, 7] packs into even | odd << 4 (two's complement
    nibbles), on the torch backend's bytewise integer packing and on the kernels."""
    ct, ce = _codecs("int4:block=8")
    pairs = torch.cartesian_prod(torch.arange(-7, 8), torch.arange(-7, 8)).float()  # 225 x (even, odd)
    blocks = torch.cat([torch.full((225, 2), 7.0), pairs, pairs.flip(1), -pairs], dim=1)  # absmax 7: scale 1
    x = blocks.reshape(-1)
    fb = torch.zeros(x.numel()) if with_feedback else None
    nbytes = ct.encoded_nbytes(x.numel(), x.dtype)
    got = [c.encode_rows(x, torch.empty(1, nbytes, dtype=torch.uint8), x.numel(),
                         feedback=None if fb is None else fb.clone()) for c in (ct, ce)]
    q = blocks.to(torch.int64) & 15
    expected = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1).to(torch.uint8)
    scale_nbytes = ct._layout(x.numel())[1]
    for payload in got:
        assert torch.equal(payload[0, scale_nbytes:scale_nbytes + expected.numel()], expected)
    assert torch.equal(got[0], got[1])


def test_given_two_threads_when_encoding_and_decoding_expect_the_bytes_of_one_thread():
    """The torch backend reuses per-thread scratch buffers: calls interleaved on two threads (different
    codecs, dtypes and sizes, error feedback included) give the bytes and residuals each gives alone."""
    import threading

    cases = [("int4:block=64", torch.bfloat16, 70001), ("int8:block=256", torch.float32, 50003)]

    def run(spec, dtype, numel, results, rounds):
        c = ccoll.get_codec(spec, backend="torch")
        src = _mixed(numel, dtype, numel)
        for _ in range(rounds):
            fb = _feedback(2, -(-numel // 2), 1)
            out = torch.empty(2, c.encoded_nbytes(-(-numel // 2), dtype), dtype=torch.uint8)
            c.encode_rows(src, out, -(-numel // 2), feedback=fb)
            s = c.decode_sum(out, -(-numel // 2), dtype)
            results.append((out, fb, _bits(s)))

    alone = []
    for case in cases:
        run(*case, alone, 1)
    together = [[], []]
    threads = [threading.Thread(target=run, args=(*case, together[i], 20)) for i, case in enumerate(cases)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for expected, got in zip(alone, together):
        assert len(got) == 20
        for g in got:
            assert all(torch.equal(a, b) for a, b in zip(expected, g))


@pytest.mark.parametrize(("spec", "dtype", "team"), [
    ("int8:block=256", torch.float32, 8),  # 64 words: 8 lanes x 8 words (WORDS_PER_LANE)
    ("int8:block=256", torch.bfloat16, 8),  # 8-byte words, two per 16-byte load: 8 lanes of 8 words
    ("fp8:format=e5m2,block=32", torch.float16, 4),  # 4 loads of two words: one per lane
    ("int4:block=64", torch.float32, 4),  # 32-byte words (two 16-byte loads): 4 lanes x 2 words
    ("int4:block=64", torch.bfloat16, 4),  # 16-byte words: 4 lanes x 2 words, 64 B per team load
    ("fp8:format=e4m3,block=32", torch.float32, 4),  # MX block: 8 words, two per lane, 64 B per team load
    ("int8:block=8", torch.float32, 2),  # fewer words than a team load needs: one lane per word
    ("int8:block=24", torch.float32, 4),  # 6 words: a team of 4, two lanes with a second word
    ("int8:block=1048576", torch.float32, 32),  # the cap
    ("int4:block=4096", torch.float16, 32),  # 512 words: 32 lanes x 16 (WORDS_PER_LANE is a target)
])
def test_plain_encode_team_spreads_block_work_over_lanes_words_and_keeps_half_a_line_per_load(spec, dtype, team):
    """The plain encode kernel's team (ccoll/codecs/quant_kernels.py _encode_team, kernels/quant.cu block):
    the per-block overhead (indices, team max, scale) is paid once per team, so lanes get up to 8 q words,
    but a team load instruction still reads >= 64 contiguous bytes (4 lanes of 16-byte loads) where the
    block has them (a lane's load: 16 bytes, two q words where a word is 8 bytes); a power of two
    <= 32 so that teams never straddle a warp. The rotate kernels keep one lane per word (_team)."""
    codec = ccoll.get_codec(spec, backend="emulated")
    got = codec._encode_team(dtype)
    assert got == team
    assert got & (got - 1) == 0 and 1 <= got <= 32
    words = codec.block * codec.bits // 32
    word_nbytes = 32 // codec.bits * dtype.itemsize
    per_load = 2 if word_nbytes == 8 else 1  # the kernel's V: a lane loads 16 bytes at once
    assert got * 16 >= 64 or got >= words // per_load  # half a line per team load, or a lane per load
    assert codec._team() == min(32, 1 << (words - 1).bit_length())


def test_given_cpu_tensors_when_backend_auto_expect_host_build_for_the_unrotated_int_formats(monkeypatch):
    """"auto" runs the int8 / int4 codecs without rotation on the host build where it is built (its streaming
    paths), everything else on the torch backend; CCOLL_CPU_BACKEND overrides; an explicit backend stays."""
    cpu = torch.device("cpu")
    monkeypatch.delenv("CCOLL_CPU_BACKEND", raising=False)
    monkeypatch.setattr(quant, "host_build_ready", lambda name: name == "quant")
    for spec in ("int8:block=256", "int4:block=64", "int4:block=64,round=stochastic"):
        assert ccoll.get_codec(spec).resolve_backend(cpu) == "emulated", spec
    for spec in ("int8:block=64,rotate=hadamard", "fp8:format=e4m3,block=32", "bf16", "zfp:rate=8"):
        assert ccoll.get_codec(spec).resolve_backend(cpu) == "torch", spec
    assert ccoll.get_codec("int8:block=256", backend="torch").resolve_backend(cpu) == "torch"
    monkeypatch.setenv("CCOLL_CPU_BACKEND", "torch")
    assert ccoll.get_codec("int8:block=256").resolve_backend(cpu) == "torch"
    monkeypatch.setenv("CCOLL_CPU_BACKEND", "emulated")
    assert ccoll.get_codec("int8:block=64,rotate=hadamard").resolve_backend(cpu) == "emulated"
    monkeypatch.setenv("CCOLL_CPU_BACKEND", "gpu")
    with pytest.raises(CodecSpecError, match="CCOLL_CPU_BACKEND"):
        ccoll.get_codec("int8:block=256").resolve_backend(cpu)
    monkeypatch.delenv("CCOLL_CPU_BACKEND")
    monkeypatch.setattr(quant, "host_build_ready", lambda name: False)  # no nvcc, or not built yet
    assert ccoll.get_codec("int8:block=256").resolve_backend(cpu) == "torch"


def test_given_torch_threads_when_the_host_build_runs_expect_its_team_follows_and_the_same_bytes():
    """The host build's OpenMP team is the caller's torch.get_num_threads() (kernels/call.py host_threads), and
    the bytes do not depend on it."""
    from ccoll.kernels import call

    c = ccoll.get_codec("int4:block=64", backend="emulated")
    src, n = _mixed(1 << 18, torch.float32, 3), 1 << 18
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            fb = _feedback(1, n, 5)
            out = torch.empty(1, c.encoded_nbytes(n, src.dtype), dtype=torch.uint8)
            c.encode_rows(src, out, n, feedback=fb)
            assert call._host_threads.n == threads
            results.append((out, fb, c.decode_sum(torch.cat([out, out]), n, src.dtype)))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(*results))
