"""ZFP on a CUDA device: the CuPy kernels give the emulated backend's bytes (which equal libzfp's) and
decode to the same values, on torch's current stream. Skipped without CUDA (conftest)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ccoll.codecs import get_codec

pytestmark = pytest.mark.gpu


def _sample(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = np.random.default_rng(seed)
    x = torch.from_numpy(g.standard_normal(n) * np.exp(3 * g.standard_normal(n))).to(dtype)
    if n > 40:
        x[3] = float("nan")  # non-finite block rule
        x[20:36] = 1e-31  # tiny block rule
    return x


@pytest.mark.parametrize("dims", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_given_cuda_tensor_when_encoded_with_cupy_then_bytes_and_decode_equal_emulated(dims, dtype):
    rate = 8.5 if dtype != torch.float64 else 12.25
    cuda = get_codec(f"zfp:rate={rate},dims={dims}", backend="cupy")
    emulated = get_codec(f"zfp:rate={rate},dims={dims}", backend="emulated")
    for i, n in enumerate((1, 5, 17, 1023, 2**20 + 3)):
        x = _sample(n, dtype, seed=i).clamp(-6e4, 6e4) if dtype == torch.float16 else _sample(n, dtype, seed=i)
        expected = emulated.encode(x)
        payload = cuda.encode(x.cuda())
        assert payload.is_cuda and torch.equal(payload.cpu(), expected), (dims, dtype, n)
        decoded = cuda.decode(payload, n, dtype)
        ref = emulated.decode(expected, n, dtype)
        # bit for bit, NaNs included: one NaN pattern per output dtype on every backend (test_nan_pattern.py)
        assert torch.equal(decoded.cpu().view(torch.uint8), ref.view(torch.uint8)), (dims, dtype, n)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("dims", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_given_cuda_payload_rows_when_decode_sum_then_equals_emulated(dims, dtype):
    n, p = 100_003, 4
    cuda = get_codec(f"zfp:rate=12.5,dims={dims}", backend="cupy")
    emulated = get_codec(f"zfp:rate=12.5,dims={dims}", backend="emulated")
    payloads = torch.stack([emulated.encode(_sample(n, dtype, seed=r)) for r in range(p)])
    got = cuda.decode_sum(payloads.cuda(), n, dtype)
    ref = emulated.decode_sum(payloads, n, dtype)
    assert torch.equal(_bits(got), _bits(ref))  # NaN sums are canonical: bits equal


@pytest.mark.parametrize("dims", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("row_numel", [4096, 1002])  # blocks fill the rows; a partial block per row
def test_given_rows_with_feedback_when_encoded_on_cuda_then_payload_residuals_and_decode_equal_emulated(
        dims, dtype, row_numel):
    """One launch for all rows; a last row partly and one wholly past the end; the tiny-block and
    non-finite rules (and subnormal decode scales, which -ftz=true would zero) inside."""
    rate = 8.5 if dtype != torch.float64 else 12.25
    cuda = get_codec(f"zfp:rate={rate},dims={dims}", backend="cupy")
    emulated = get_codec(f"zfp:rate={rate},dims={dims}", backend="emulated")
    n, rows = 3 * row_numel + 17, 5
    x = _sample(n, dtype, seed=row_numel)
    if dtype == torch.float16:
        x = x.clamp(-6e4, 6e4)
    elif dtype != torch.float64:
        x[100:116] = torch.tensor([2.0**-97.5, -(2.0**-126.5), 2.0**-140, 3e-45] * 4).to(dtype)
    nbytes = emulated.encoded_nbytes(row_numel, dtype)
    fb = (torch.randn(rows * row_numel) * 1e-2).to(emulated.feedback_dtype(dtype))
    fb[n:] = 0
    ref_out, ref_fb = torch.empty(rows, nbytes, dtype=torch.uint8), fb.clone()
    emulated.encode_rows(x, ref_out, row_numel, feedback=ref_fb)
    out, got_fb = torch.full((rows, nbytes), 0xA5, dtype=torch.uint8, device="cuda"), fb.cuda()
    cuda.encode_rows(x.cuda(), out, row_numel, feedback=got_fb)
    assert torch.equal(out.cpu(), ref_out) and torch.equal(_bits(got_fb), _bits(ref_fb))
    cuda.encode_rows(x.cuda(), out, row_numel)
    emulated.encode_rows(x, ref_out, row_numel)
    assert torch.equal(out.cpu(), ref_out)
    got = torch.empty(n, dtype=dtype, device="cuda")
    cuda.decode_rows(out, got, row_numel)
    assert torch.equal(_bits(got), _bits(emulated.decode_rows(ref_out, torch.empty(n, dtype=dtype), row_numel)))


def test_given_non_default_stream_when_encoded_then_runs_on_it():
    codec = get_codec("zfp:rate=8", backend="cupy")
    x = torch.randn(1 << 22, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        payload = codec.encode(x)
        y = codec.decode(payload, x.numel(), x.dtype)
    stream.synchronize()
    assert torch.equal(payload.cpu(), get_codec("zfp:rate=8", backend="emulated").encode(x.cpu()))
    assert torch.equal(y.cpu(), get_codec("zfp:rate=8", backend="emulated").decode(payload.cpu(), x.numel(), x.dtype))
