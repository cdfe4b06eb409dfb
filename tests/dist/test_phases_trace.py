"""ccoll's phase labels in the tools people read: a torch.profiler trace of a real compressed
all_reduce on 2 gloo ranks shows them; the bench's --trace writes one per rank and --breakdown splits
a call into phases; the phase proxies change nothing in the results."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import ccoll
import ccoll.collectives.segments as segmenting
from collective_checks import GlooEnv, data
from launch import run_gloo

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPECTED = {"ccoll.encode", "ccoll.decode_sum", "ccoll.decode", "ccoll.exchange.all_to_all",
            "ccoll.exchange.all_gather", "ccoll.wait.all_to_all", "ccoll.wait.all_gather"}
#: a one-exchange all_reduce (ccoll.collectives.small: 64 KiB on two ranks): one encode, one all-gather,
#: one decode-and-sum of the gathered payloads
EXPECTED_ONE = {"ccoll.encode", "ccoll.decode_sum", "ccoll.exchange.all_gather", "ccoll.wait.all_gather"}


def _profiled_all_reduce(rank: int, world_size: int, directory: str) -> dict:
    from torch.profiler import ProfilerActivity, profile

    env = GlooEnv()
    segmenting.SEGMENT_BYTES = env.world * 4096 * 4  # several segments: labels numbered per segment
    n = 3 * env.world * 4096 + 77
    x = data(5, env.rank, n)
    plain = x.clone()
    ccoll.all_reduce(plain, "sum", env.group, "int8:block=256", min_bytes=0)
    traced = x.clone()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ccoll.all_reduce(traced, "sum", env.group, "int8:block=256", min_bytes=0)
    path = os.path.join(directory, f"trace{rank}.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        names = [e.get("name", "") for e in json.load(f)["traceEvents"]]
    return {"labels": sorted({s for s in names if s.startswith("ccoll.")}),
            "encodes": names.count("ccoll.encode"), "same": bool(torch.equal(plain, traced))}


@pytest.mark.parametrize("p", [2, 3])
def test_given_profiler_when_compressed_all_reduce_on_gloo_ranks_expect_phase_labels_in_trace(tmp_path, p):
    """4 segments. Two ranks: the one-exchange pipeline, one encode per segment; three: flat's, two encodes per
    segment (the chunks, the reduced chunk)."""
    results = run_gloo(p, _profiled_all_reduce, str(tmp_path), timeout_s=120)
    for r in results:
        assert (EXPECTED_ONE if p == 2 else EXPECTED) <= set(r["labels"]), r["labels"]
        assert r["encodes"] == (1 if p == 2 else 2) * 4
        assert r["same"]  # labelling changes no byte of the result (deterministic codec)


def test_given_bench_trace_and_breakdown_when_running_two_ranks_expect_trace_per_rank_and_phase_table(tmp_path):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    out = subprocess.run([sys.executable, "-m", "ccoll.bench", "all_reduce", "-b", "64K", "-e", "64K", "--np", "2",
                          "--codec", "native,int8:block=256", "-n", "2", "-w", "1", "--trace", str(tmp_path / "tr"),
                          "--breakdown", "--link-rate", "1gbit", "--json", str(tmp_path / "r.json")],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr
    files = sorted(os.listdir(tmp_path / "tr"))
    assert files == sorted(f"all_reduce-65536-{c}.rank{r}.json" for c in ("native", "int8_block=256") for r in (0, 1))
    with open(tmp_path / "tr" / "all_reduce-65536-int8_block=256.rank1.json") as f:
        assert EXPECTED_ONE <= {e.get("name") for e in json.load(f)["traceEvents"]}
    assert "# breakdown all_reduce 65536 B int8:block=256" in out.stdout
    assert "ccoll.exchange.all_gather" in out.stdout and "% of ideal" in out.stdout
    rows = json.load(open(tmp_path / "r.json"))["rows"]
    split = rows[1]["breakdown"]["split"]
    # the split adds up; bytes sent: the whole encoded tensor in the one all-gather, which on two ranks is
    # what flat's two exchanges send (half the encoded tensor in the all-to-all + its chunk in the all-gather)
    assert abs(split["idle_codec"] + split["idle_host"] + split["in_flight"] - split["wall"]) < 1e-9
    enc = ccoll.get_codec("int8:block=256").encoded_nbytes(8192, torch.float32)
    assert split["sent_bytes"] == 2 * enc == ccoll.get_codec("int8:block=256").encoded_nbytes(16384, torch.float32)
    assert abs(split["wire"] - 2 * enc * 8 / 1e9) < 1e-12
    assert "breakdown" not in rows[0]  # native: nothing to split


def test_given_no_profiler_when_labelling_expect_the_call_own_codec_and_transport():
    from ccoll.collectives.phases import labelled

    c, tr = object(), object()
    assert labelled(c, tr) == (c, tr)



def _every_collective(rank: int, group, spec: str, results: dict) -> list:
    """Each compressed collective once (send/recv between rank pairs); its results."""
    p = group.size()
    x = data(7, rank, 4 * p * 256)
    ar = x.clone()
    ccoll.all_reduce(ar, "sum", group, spec, min_bytes=0)
    rs = torch.empty(x.numel() // p)
    ccoll.reduce_scatter_tensor(rs, x.clone(), "sum", group, spec, min_bytes=0)
    ag = torch.empty(x.numel() * p)
    ccoll.all_gather_into_tensor(ag, x.clone(), group, spec, min_bytes=0)
    bc = x.clone()
    ccoll.broadcast(bc, 0, group, spec, min_bytes=0)
    pr = x.clone()
    if rank % 2 == 0:
        ccoll.send(pr, rank + 1, group, spec, min_bytes=0)
    else:
        ccoll.recv(pr, rank - 1, group, spec, min_bytes=0)
    return [ar, rs, ag, bc, pr]


@pytest.mark.parametrize("spec", ["int8:block=256", "lossless"])
def test_given_phase_recorder_when_every_collective_runs_in_simulated_world_expect_same_results_and_phases(spec):
    """The proxies the profiler and the breakdown run through (the same ones; the profiler only adds
    record_function ranges) change no result, on the fixed-size and the variable-size paths."""
    from ccoll.collectives.phases import Recorder, recording
    from ccoll.testing import simulated_world

    plain = simulated_world(4, _every_collective, spec, {}, timeout_s=120)
    rec = Recorder()
    with recording(rec):
        labelled = simulated_world(4, _every_collective, spec, {}, timeout_s=120)
    for a, b in zip(plain, labelled):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert len(rec.calls) == 4 * 5  # every call of every rank went through the proxies
    labels = {e[0] for call in rec.calls for e in call}
    assert {"ccoll.exchange.all_gather", "ccoll.exchange.broadcast"} <= labels, labels
    if spec != "lossless":  # the variable-size path exchanges its sizes and payloads blocking: no wait range
        assert {"ccoll.wait.all_gather", "ccoll.wait.all_to_all"} <= labels, labels
    assert "ccoll.encode" in labels and ("ccoll.decode" in labels or "ccoll.decode_sum" in labels), labels
