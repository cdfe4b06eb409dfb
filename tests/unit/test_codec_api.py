"""Codec contract shared by every codec: spec parsing, registry errors, sizes, cast codecs."""
import pytest
import torch

import ccoll
from ccoll.codecs import parse_spec
from ccoll.errors import CodecError, CodecSpecError


def test_parse_spec_given_params_expect_name_and_strings():
    assert parse_spec("zfp:rate=8,dims=2") == ("zfp", {"rate": "8", "dims": "2"})
    assert parse_spec(" none ") == ("none", {})


@pytest.mark.parametrize("bad", ["", "zfp:rate", "zfp:rate=8,rate=9", "zfp:=3"])
def test_parse_spec_given_malformed_expect_codec_spec_error(bad):
    with pytest.raises(CodecSpecError):
        parse_spec(bad)


def test_get_codec_given_unknown_name_expect_error_listing_available():
    with pytest.raises(CodecSpecError, match="available: .*bf16.*none"):
        ccoll.get_codec("lz4")


def test_get_codec_given_unknown_param_expect_error_listing_allowed():
    with pytest.raises(CodecSpecError, match="unknown parameter"):
        ccoll.get_codec("bf16:rate=3")


def test_get_codec_given_unknown_backend_expect_codec_spec_error():
    with pytest.raises(CodecSpecError, match="backend"):
        ccoll.get_codec("none", backend="opencl")


def test_import_ccoll_does_not_import_heavy_optional_modules():
    import subprocess, sys

    code = "import sys, ccoll, ccoll.codecs; ccoll.get_codec('none'); print([m for m in ('cupy','mpi4py','deepspeed') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("spec", ["none", "bf16", "fp16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cast_codec_given_noncontiguous_input_expect_exact_size_and_expected_values(spec, dtype):
    codec = ccoll.get_codec(spec)
    if dtype not in codec.dtypes:
        with pytest.raises(CodecError, match="does not take"):
            codec.encode(torch.zeros(3, dtype=dtype))
        return
    x = torch.randn(7, 5).to(dtype).t()  # non-contiguous
    payload = codec.encode(x)
    assert payload.dtype == torch.uint8 and payload.dim() == 1
    assert payload.numel() == codec.encoded_nbytes(x.numel(), dtype)
    y = codec.decode(payload, x.numel(), dtype)
    wire = {"none": dtype, "bf16": torch.bfloat16, "fp16": torch.float16}[spec]
    assert torch.equal(y, x.reshape(-1).to(wire).to(dtype))
    assert codec.exact_for(dtype) == (wire == dtype)


def test_decode_given_wrong_payload_length_expect_codec_error():
    codec = ccoll.get_codec("bf16")
    payload = codec.encode(torch.randn(10))
    with pytest.raises(CodecError, match="expected 20"):
        codec.decode(payload[:-1], 10, torch.float32)


def test_encode_given_integer_or_empty_tensor_expect_codec_error():
    codec = ccoll.get_codec("none")
    with pytest.raises(CodecError):
        codec.encode(torch.arange(4))
    with pytest.raises(CodecError, match="empty"):
        codec.encode(torch.zeros(0))


def test_decode_given_out_expect_filled_in_place():
    codec = ccoll.get_codec("fp16")
    x = torch.randn(4, 3)
    out = torch.empty(4, 3)
    res = codec.decode(codec.encode(x), 12, torch.float32, out=out)
    assert res is out and torch.equal(out, x.half().float())


def test_decode_sum_given_rows_expect_fp32_sum_in_order():
    codec = ccoll.get_codec("bf16")
    xs = [torch.randn(33) for _ in range(3)]
    payloads = torch.stack([codec.encode(x) for x in xs])
    expect = xs[0].bfloat16().float() + xs[1].bfloat16().float() + xs[2].bfloat16().float()
    assert torch.equal(codec.decode_sum(payloads, 33, torch.float32), expect)


def test_given_bad_spec_via_api_or_policy_expect_codec_spec_error_or_policy_error_naming_the_rule():
    """``get_codec`` / ``codec=`` involve no policy: their bad specs are CodecSpecError (a CodecError, not a
    PolicyError); the same spec in a policy is a PolicyError naming where in the policy it stands."""
    from ccoll import Policy
    from ccoll.errors import PolicyError

    with pytest.raises(CodecSpecError) as api:
        ccoll.get_codec("int8:block=12")
    assert not isinstance(api.value, PolicyError)
    with pytest.raises(PolicyError, match=r"dp.*block=12") as pol:
        Policy.from_dict({"version": 1, "dp": {"codec": "int8:block=12"}})
    assert not isinstance(pol.value, CodecSpecError)
