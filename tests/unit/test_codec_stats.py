"""``ccoll.stats.codec_stats``: the host-clock time of the batched codec calls, which
``python -m ccoll.convergence.shaped`` turns into the in-run codec throughput its step-time prediction
uses. A figure that counted a call twice (a decode inside an error-feedback encode, a generic decode_sum
looping over decode_rows) or missed a phase would mis-predict the step by that much."""
from __future__ import annotations

import pytest
import torch

from ccoll import get_codec, stats


@pytest.fixture(autouse=True)
def _clean():
    stats.reset_stats()
    stats.time_codecs()
    yield
    stats.time_codecs(False)
    stats.reset_stats()


def test_given_clock_off_by_default_when_encoding_expect_nothing_timed():
    """Off unless asked for: every compressed collective runs through these calls."""
    stats.time_codecs(False)
    c = get_codec("int8:block=256")
    x = torch.randn(1024)
    c.encode_rows(x, torch.empty(1, c.encoded_nbytes(1024, x.dtype), dtype=torch.uint8), 1024)
    assert stats.codec_stats() == []


def _rows() -> dict:
    return {(r["dim"], r["codec"], r["phase"]): r for r in stats.codec_stats()}


@pytest.mark.parametrize("spec", ["int8:block=256", "zfp:rate=8", "lossless"])
def test_given_batched_calls_when_timed_expect_one_row_per_phase_values_counted_once(spec):
    c = get_codec(spec)
    rows, row_numel = 4, 1024
    x = torch.randn(rows * row_numel)
    payload = torch.empty(rows, c.encoded_nbytes(row_numel, x.dtype), dtype=torch.uint8)
    fb = None if spec == "lossless" else torch.zeros(rows * row_numel)
    with stats.dimension("dp"):
        c.encode_rows(x, payload, row_numel, feedback=fb)  # feedback decodes inside: not a decode call
        c.decode_rows(payload, torch.empty_like(x), row_numel)
        c.decode_sum(payload, row_numel, torch.float32)
    got = _rows()
    name = c.name
    assert set(got) == {("dp", name, p) for p in ("encode", "decode", "decode_sum")}
    assert got[("dp", name, "encode")]["nbytes"] == x.numel() * 4
    assert got[("dp", name, "decode")]["nbytes"] == x.numel() * 4
    assert got[("dp", name, "decode_sum")]["nbytes"] == rows * row_numel * 4  # 4 payloads of one chunk
    for r in got.values():
        assert r["calls"] == 1 and r["seconds"] > 0


def test_given_failing_call_when_timed_expect_nothing_recorded_and_later_calls_still_timed():
    c = get_codec("int8:block=256")
    x = torch.randn(1024)
    with pytest.raises(Exception):
        c.decode_rows(torch.empty(1, 3, dtype=torch.uint8), x, 1024)  # wrong payload size
    assert stats.codec_stats() == []
    payload = torch.empty(1, c.encoded_nbytes(1024, x.dtype), dtype=torch.uint8)
    c.encode_rows(x, payload, 1024)
    assert [r["phase"] for r in stats.codec_stats()] == ["encode"]


def test_given_reset_when_read_expect_codec_table_cleared():
    c = get_codec("bf16")
    x = torch.randn(64)
    c.encode_rows(x, torch.empty(1, c.encoded_nbytes(64, x.dtype), dtype=torch.uint8), 64)
    assert stats.codec_stats()
    stats.reset_stats()
    assert stats.codec_stats() == []
