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
        assert torch.equal(decoded.cpu().view(torch.uint8), ref.view(torch.uint8)) or (
            torch.equal(decoded.cpu().isnan(), ref.isnan())
            and torch.equal(decoded.cpu().nan_to_num(), ref.nan_to_num())
        )


@pytest.mark.parametrize("dims", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_given_cuda_payload_rows_when_decode_sum_then_equals_emulated(dims, dtype):
    n, p = 100_003, 4
    cuda = get_codec(f"zfp:rate=8,dims={dims}", backend="cupy")
    emulated = get_codec(f"zfp:rate=8,dims={dims}", backend="emulated")
    payloads = torch.stack([emulated.encode(_sample(n, dtype, seed=r)) for r in range(p)])
    got = cuda.decode_sum(payloads.cuda(), n, dtype).cpu()
    ref = emulated.decode_sum(payloads, n, dtype)
    assert torch.equal(got.isnan(), ref.isnan()) and torch.equal(got.nan_to_num(), ref.nan_to_num())


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
    assert torch.equal(y.cpu(), get_codec("zfp:rate=8", backend="torch").decode(payload.cpu(), x.numel(), x.dtype))
