"""`python -m ccoll.bench.overhead` on a tiny run: the rows it must produce (in process, every op x size x
variant on two gloo ranks, every simulated world x op x size x variant, the skipped ones said), their fields, and
the figures' internal consistency. No timing thresholds: only the shape and arithmetic of the output."""
from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_given_tiny_run_when_measuring_overhead_expect_every_row_and_consistent_fields(tmp_path):
    out = tmp_path / "o.json"
    r = subprocess.run([sys.executable, "-m", "ccoll.bench.overhead", "--sizes", "4K,8K", "--codecs", "bf16",
                        "--calls", "2", "--rounds", "2", "--sim", "2,4", "--sim-sizes", "4K", "--sim-calls", "1",
                        "--sim-rounds", "2", "--sim-max-bytes", str(40 * 1024), "--json", str(out)],
                       cwd=REPO, env=dict(os.environ, PYTHONWARNINGS="ignore"), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "load average" in r.stdout and "host_over_wall" in r.stdout
    res = json.loads(out.read_text())
    local = {(x["op"], x["nbytes"], x["codec"]) for x in res["in_process"]}
    assert local == {(op, n, c) for op in ("all_reduce", "all_gather_into_tensor") for n in (4096, 8192)
                     for c in ("native", "none", "bf16")}
    assert "# in process" in r.stdout
    gloo = {(x["op"], x["nbytes"], x["codec"]): x for x in res["gloo"]}
    assert set(gloo) == {(op, n, c) for op in ("all_reduce", "all_gather_into_tensor", "sendrecv")
                         for n in (4096, 8192) for c in ("native", "bf16")}
    for x in res["gloo"]:
        assert x["world"] == "gloo p=2" and x["wall_us"] > 0 and x["cpu_us"] >= 0
        if x["codec"] == "native":  # the difference of native to itself, round by round
            assert x["over_wall_us"] == x["over_cpu_us"] == x["codec_us"] == x["host_over_wall_us"] == 0
        else:
            assert x["codec_us"] > 0  # the codec's calls were timed
    sim = {(x["world"], x["op"], x["codec"]) for x in res["simulated"]}
    # all_gather at p=4: 4 * 4 * 4 KiB of outputs is above --sim-max-bytes, so skipped and said
    assert sim == {(f"simulated p={p}", op, c) for p in (2, 4) for op in ("all_reduce", "all_gather_into_tensor")
                   for c in ("native", "none", "bf16") if not (p == 4 and op == "all_gather_into_tensor")}
    assert res["skipped"] == ["all_gather_into_tensor 4KiB at p=4 (64KiB of outputs)"]
    assert "# skipped: all_gather_into_tensor 4KiB at p=4" in r.stdout
    assert len(res["load_average"]) == 2
