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
                        "--sim-rounds", "2", "--sim-max-bytes", str(40 * 1024), "--fake-pg-calls", "5", "--calls-per-step", "3",
                        "--json", str(out)],
                       cwd=REPO, env=dict(os.environ, PYTHONWARNINGS="ignore"), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "load average" in r.stdout and "host_over_wall" in r.stdout
    res = json.loads(out.read_text())
    local = {(x["op"], x["nbytes"], x["codec"]) for x in res["in_process"]}
    assert local == {(op, n, c) for op in ("all_reduce", "all_gather_into_tensor") for n in (4096, 8192)
                     for c in ("native", "none", "bf16")}
    assert "# in process" in r.stdout
    patched = {(x["op"], x["nbytes"], x["codec"]): x for x in res["patched"]}
    assert set(patched) == {(op, n, "bf16") for op in ("all_reduce", "all_gather_into_tensor") for n in (4096, 8192)}
    for x in res["patched"]:
        assert x["world"] == "patched p=2" and x["path_us"] > 0 and x["floor_us"] > 0 and x["native_us"] > 0
    assert "# through the patch, in process" in r.stdout and "one ccoll.patch.step() per 3 calls" in r.stdout
    assert res["args"]["calls_per_step"] == 3
    assert [x["op"] for x in res["fake_pg"]] == ["all_reduce", "all_gather_into_tensor", "broadcast", "send", "recv",
                                                 "isend+wait"]
    assert all(x["torch_us"] > 0 and x["patched_us"] > 0 and x["wrapper_only_us"] > 0 for x in res["fake_pg"])
    assert "# pass-through on torch's fake process group" in r.stdout
    gloo = {(x["op"], x["nbytes"], x["codec"]): x for x in res["gloo"]}
    assert set(gloo) == {(op, n, c) for op in ("all_reduce", "all_gather_into_tensor", "sendrecv")
                         for n in (4096, 8192) for c in ("native", "bf16")}
    for x in res["gloo"]:
        assert x["world"] == "gloo p=2" and x["wall_us"] > 0 and x["cpu_us"] >= 0
        if x["codec"] == "native":  # the difference of native to itself, round by round
            assert x["over_wall_us"] == x["over_cpu_us"] == x["codec_us"] == x["host_over_wall_us"] == 0
            assert x["path_over_wall_us"] == 0
        else:
            assert x["codec_us"] > 0  # the codec's calls were timed (the clock-on block)
    for x in res["in_process"]:
        assert "path_over_wall_us" in x and (x["codec"] != "native" or x["path_over_wall_us"] == 0)
    sim = {(x["world"], x["op"], x["codec"]) for x in res["simulated"]}
    # all_gather at p=4: 4 * 4 * 4 KiB of outputs is above --sim-max-bytes, so skipped and said
    assert sim == {(f"simulated p={p}", op, c) for p in (2, 4) for op in ("all_reduce", "all_gather_into_tensor")
                   for c in ("native", "none", "bf16") if not (p == 4 and op == "all_gather_into_tensor")}
    assert res["skipped"] == ["all_gather_into_tensor 4KiB at p=4 (64KiB of outputs)"]
    assert "# skipped: all_gather_into_tensor 4KiB at p=4" in r.stdout
    assert len(res["load_average"]) == 2


def test_given_calls_per_step_below_one_expect_usage_error():
    import pytest

    from ccoll.bench.overhead import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(["--calls-per-step", "0"])
    assert e.value.code == 2
    assert parse_args([]).calls_per_step == 8


def test_given_arithmetic_removed_expect_hooks_skipped_within_and_every_class_restored_after():
    """The instrument behind ``path_over``: inside, a call runs every check and allocation but no codec
    arithmetic (the payload keeps the bytes it had); after, the codec classes are exactly as before (own
    hooks put back, inherited ones uncovered again) and encode again."""
    import torch

    from ccoll.bench.overhead import codec_arithmetic_removed
    from ccoll.codecs import get_codec
    from ccoll.errors import CodecError

    x = torch.linspace(-1, 1, 512)
    for spec in ("int8:block=256", "bf16", "none"):
        c = get_codec(spec)
        cls = type(c)
        before = dict(vars(cls))
        want = c.encode(x)
        out = torch.full((1, c.payload_nbytes(512, torch.float32)), 7, dtype=torch.uint8)
        with codec_arithmetic_removed(spec):
            c.encode_rows(x, out, 512)
            assert bool((out == 7).all()), spec  # nothing written
            try:  # the front end's checks still run
                c.encode_rows(x, out[:, :-1], 512)
                raise AssertionError("a bad payload shape was accepted")
            except CodecError:
                pass
        assert dict(vars(cls)) == before, spec
        c.encode_rows(x, out, 512)
        assert torch.equal(out.view(-1), want.view(-1)), spec
