"""One NaN rule per narrow dtype on every backend (kernels/common.cuh), torch's CPU cast: bf16 NaN ->
0xFFFF, fp16 NaN -> sign | 0x7E00 | top payload bits. A codec's NaN block (fp32 0x7FC00000) therefore
decodes to bf16 0xFFFF and fp16 0x7E00 on the torch backend and the kernels (emulated here, the same code
as cupy), bit for bit."""
from __future__ import annotations

import pytest
import torch

import ccoll
from ccoll.codecs import example_specs
from ccoll.errors import CcollError

NAN_BITS = {torch.bfloat16: 0xFFFF, torch.float16: 0x7E00}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16).to(torch.int32) & 0xFFFF


@pytest.mark.parametrize("dtype", list(NAN_BITS))
def test_given_torch_casts_expect_the_agreed_nan_patterns(dtype):
    x = torch.tensor([float("nan"), -float("nan")] * 20)
    x.view(torch.int32)[2] = 0x7FC02001  # a payload
    got = _bits(x.to(dtype)).tolist()
    if dtype == torch.bfloat16:
        assert set(got) == {0xFFFF}
    else:
        assert got[0] == 0x7E00 and got[1] == 0xFE00 and got[2] == 0x7E01
    assert int(_bits(x[:1].to(dtype))[0]) == NAN_BITS[dtype]


@pytest.mark.parametrize("spec", [s for s in example_specs() if ccoll.get_codec(s).lossy])
@pytest.mark.parametrize("dtype", list(NAN_BITS))
def test_given_a_nan_block_when_decoding_to_a_narrow_dtype_expect_one_nan_pattern_on_every_backend(spec, dtype):
    if dtype not in ccoll.get_codec(spec).dtypes or ccoll.get_codec(spec).exact_for(dtype):
        pytest.skip(f"{spec} does not take {dtype}, or keeps its bits")
    x = torch.linspace(-3, 3, 300).to(dtype)
    x[7] = float("nan")
    decoded = {}
    for backend in ("torch", "emulated"):
        try:
            c = ccoll.get_codec(spec, backend=backend)
            decoded[backend] = c.decode(c.encode(x), x.numel(), dtype)
        except CcollError as e:  # no host build (no nvcc) or no zfpy: compare what runs
            if backend == "torch":
                raise
            pytest.skip(f"{backend}: {str(e).splitlines()[0]}")
    for backend, y in decoded.items():
        nan = y.isnan()
        assert bool(nan[7]), (backend, spec)
        # the sign may be set (rotate=hadamard flips signs on the way back), the rest is the one pattern
        assert {b & 0x7FFF for b in _bits(y[nan]).tolist()} == {NAN_BITS[dtype] & 0x7FFF}, (backend, spec, dtype)
        if dtype == torch.bfloat16:
            assert set(_bits(y[nan]).tolist()) == {0xFFFF}, (backend, spec)
    assert torch.equal(_bits(decoded["torch"]), _bits(decoded["emulated"])), spec
