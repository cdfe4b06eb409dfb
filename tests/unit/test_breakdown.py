"""The bench's time split (ccoll.bench.breakdown.decompose) on hand-made phase timelines."""
from __future__ import annotations

import pytest

from ccoll.bench.breakdown import decompose, parse_rate


def test_given_codec_then_exchange_when_decomposing_expect_idle_codec_and_in_flight_to_add_up():
    events = [("ccoll.encode", 0, 0.0, 1.0, 0),
              ("ccoll.exchange.all_to_all", 0, 1.0, 1.1, 125_000_000),  # 1 Gbit at 1 Gbit/s: 1 s ideal
              ("ccoll.encode", 1, 1.1, 1.5, 0),  # overlaps the flight: not idle
              ("ccoll.wait.all_to_all", 0, 1.5, 3.0, 0),
              ("ccoll.decode", 0, 3.0, 3.5, 0)]
    s = decompose(events, 0.0, 3.6, 1e9)
    assert s["in_flight"] == pytest.approx(2.0)
    assert s["idle_codec"] == pytest.approx(1.5)  # first encode and the decode
    assert s["idle_host"] == pytest.approx(0.1)
    assert s["wire"] == pytest.approx(1.0) and s["slow"] == pytest.approx(1.0)
    assert s["codec"] == pytest.approx(1.9) and s["wait"] == pytest.approx(1.5)
    assert s["idle_codec"] + s["idle_host"] + s["in_flight"] == pytest.approx(s["wall"])


def test_given_completion_seen_before_wait_when_decomposing_expect_flight_to_end_there():
    events = [("ccoll.exchange.all_gather", 0, 0.0, 0.1, 1000),
              ("ccoll.done.all_gather", 0, 0.5, 0.5, 0),
              ("ccoll.decode", 0, 0.1, 2.0, 0),
              ("ccoll.wait.all_gather", 0, 2.0, 2.0, 0)]
    s = decompose(events, 0.0, 2.0, None)
    assert s["in_flight"] == pytest.approx(0.5)
    assert s["idle_codec"] == pytest.approx(1.5)
    assert s["wire"] is None and s["slow"] is None


@pytest.mark.parametrize("text,bps", [("1gbit", 1e9), ("100mbit", 1e8), ("125MBps", 1e9), ("2000", 2000.0)])
def test_given_tc_rate_when_parsing_expect_bits_per_second(text, bps):
    assert parse_rate(text) == pytest.approx(bps)
