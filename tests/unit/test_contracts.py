"""The shared contracts every layer builds on: the batched codec API's reference semantics, the
Work-shaped Handle, and checkpointable error feedback. CPU only, no process group."""
from __future__ import annotations

import datetime
import threading

import pytest
import torch

import ccoll
from ccoll.errors import CodecError, TransportError
from ccoll.feedback import ErrorFeedback
from ccoll.transports import Handle

SPECS = ["int8:block=64", "int4:block=32", "zfp:rate=8", "zfp:rate=6,dims=2", "bf16", "none"]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_encode_rows_equals_per_row_encode_with_zero_padding(spec, dtype):
    c = ccoll.get_codec(spec, backend="torch")
    if dtype not in c.dtypes:
        pytest.skip("dtype not taken")
    g = torch.Generator().manual_seed(1)
    n, rows, row_numel = 1000, 4, 256  # last row: 232 values + 24 zeros
    src = torch.randn(n, generator=g).to(dtype)
    out = torch.empty(rows, c.encoded_nbytes(row_numel, dtype), dtype=torch.uint8)
    c.encode_rows(src, out, row_numel)
    for i in range(rows):
        x = torch.zeros(row_numel, dtype=dtype)
        piece = src[i * row_numel:(i + 1) * row_numel]
        x[:piece.numel()] = piece
        assert torch.equal(out[i], c.encode(x)), i
    back = torch.empty(n, dtype=dtype)
    c.decode_rows(out, back, row_numel)
    for i in range(rows):
        lo, hi = i * row_numel, min(n, (i + 1) * row_numel)
        assert torch.equal(back[lo:hi], c.decode(out[i], row_numel, dtype)[: hi - lo])


@pytest.mark.parametrize("spec", ["int4:block=32", "zfp:rate=6"])
def test_feedback_residual_is_what_the_encode_dropped(spec):
    c = ccoll.get_codec(spec, backend="torch")
    x = torch.randn(300, generator=torch.Generator().manual_seed(2))
    fb = torch.zeros(2 * 160, dtype=torch.float32)
    out = torch.empty(2, c.encoded_nbytes(160, x.dtype), dtype=torch.uint8)
    c.encode_rows(x, out, 160, feedback=fb)
    dec = torch.empty(300)
    c.decode_rows(out, dec, 160)
    torch.testing.assert_close(fb[:300], x - dec, rtol=0, atol=0)
    assert torch.equal(fb[300:], torch.zeros(20)), "residuals of padding stay zero"
    # second call compensates: what travels is x + residual
    r0 = fb.clone()
    c.encode_rows(x, out, 160, feedback=fb)
    c.decode_rows(out, dec, 160)
    torch.testing.assert_close(fb[:300], (x + r0[:300]) - dec, rtol=0, atol=0)


def _ef_encode(ef, key, x, codec, salt: int = 0):
    """One compensated encode the way the collectives do it: the key's residual buffer
    (``call.feedback_buffer``) handed to the batched ``encode_rows`` as ``feedback=``."""
    from ccoll.collectives.call import feedback_buffer, rows

    flat = x.reshape(-1).contiguous()
    out = rows(1, codec.encoded_nbytes(flat.numel(), flat.dtype), flat.device)
    fb = feedback_buffer(ef, key, flat.numel(), flat.dtype, flat.device, codec)
    codec.encode_rows(flat, out, flat.numel(), feedback=fb, salt=salt)
    return out.view(-1)


def test_encode_rows_rejects_bad_shapes():
    c = ccoll.get_codec("int8:block=64")
    src = torch.randn(100)
    with pytest.raises(CodecError):
        c.encode_rows(src, torch.empty(1, c.encoded_nbytes(64, src.dtype), dtype=torch.uint8), 64)  # too few rows
    with pytest.raises(CodecError):
        c.encode_rows(src, torch.empty(2, 7, dtype=torch.uint8), 64)  # wrong row size
    with pytest.raises(CodecError):
        c.encode_rows(src, torch.empty(2, c.encoded_nbytes(64, src.dtype), dtype=torch.uint8), 64,
                      feedback=torch.zeros(10))


def test_decode_sum_writes_into_out():
    c = ccoll.get_codec("int8:block=64")
    xs = [torch.randn(200, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    rows = torch.stack([c.encode(x) for x in xs])
    out = torch.empty(200)
    assert c.decode_sum(rows, 200, torch.float32, out=out) is out
    ref = sum(c.decode(r, 200, torch.float32) for r in rows)
    assert torch.equal(out, ref)


class _Slow:
    """A request that completes when its event is set (stands in for a torch Work in these unit tests)."""

    def __init__(self):
        self.event = threading.Event()

    def wait(self):
        self.event.wait()

    def is_completed(self):
        return self.event.is_set()


def test_handle_is_work_shaped():
    req = _Slow()
    t = torch.zeros(3)
    ran = []
    h = Handle([req], lambda: ran.append(1), [t])
    assert not h.is_completed()
    with pytest.raises(TransportError):
        h.wait(timeout=datetime.timedelta(milliseconds=20))
    assert ran == []
    fut = h.get_future()
    assert not fut.done()
    req.event.set()
    assert fut.wait() == [t]
    assert h.is_completed() and ran == [1]
    assert h.wait(timeout=1.0) and ran == [1], "then runs exactly once"


def test_handle_future_carries_errors():
    def boom():
        raise ValueError("decode failed")

    h = Handle([], boom, [])
    with pytest.raises(ValueError):
        h.get_future().wait()


def test_error_feedback_state_round_trip():
    c = ccoll.get_codec("int4:block=32")
    ef = ErrorFeedback()
    x = torch.randn(256, generator=torch.Generator().manual_seed(3))
    _ef_encode(ef, ("layer", 1), x, c)
    state = ef.state_dict()
    ef2 = ErrorFeedback()
    ef2.load_state_dict(state)
    assert torch.equal(ef2.residual(("layer", 1)), ef.residual(("layer", 1)))
    assert torch.equal(_ef_encode(ef, ("layer", 1), x, c), _ef_encode(ef2, ("layer", 1), x, c))
    assert torch.equal(ef2.residual(("layer", 1)), ef.residual(("layer", 1)))
