"""python -m ccoll.bench.cpu_codec: a tiny run has the roofline rows and every codec x backend x phase, with the
fields its table prints and its JSON holds. No timing thresholds."""
from __future__ import annotations

import json

from ccoll.bench import cpu_codec


def test_given_a_tiny_run_expect_roofline_rows_and_every_codec_backend_and_phase(tmp_path, capsys):
    out = tmp_path / "cpu.json"
    assert cpu_codec.main(["--size", "64K", "--codecs", "int8:block=256,int4:block=64,round=stochastic",
                           "--backends", "torch,emulated", "--rounds", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    got = [(r["variant"], r["backend"], r["op"]) for r in result["rows"]]
    assert got[:2] == [("copy", "torch", "copy"), ("add", "torch", "add")]
    assert got[2:] == [(spec, backend, op) for spec in ("int8:block=256", "int4:block=64,round=stochastic")
                       for backend in ("torch", "emulated") for op in ("encode+ef", "decode_sum", "decode")]
    assert result["rows"][0]["of_copy"] == 1.0
    for r in result["rows"]:
        assert set(r) == set(cpu_codec.COLUMNS) and r["gbs"] > 0 and r["moved_gbs"] > 0 and r["ms"] > 0
    assert len(result["loadavg_start"]) == 3 and result["threads"] == 1
    printed = capsys.readouterr().out
    assert "load average" in printed and "int4:block=64,round=stochastic" in printed
