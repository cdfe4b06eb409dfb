"""`python -m ccoll.bench`: real gloo / MPI ranks launched by the harness itself, checked through its
JSON and its printed table; and the correctness check (#wrong) on real 2-rank gloo groups."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from launch import run_gloo

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
           "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
           "broadcast": lambda n: 1.0, "sendrecv": lambda n: 1.0, "sendrecv_bw": lambda n: 1.0}
ROW_KEYS = {"collective", "size_bytes", "count", "dtype", "codec", "time_us", "algbw_gbps", "busbw_gbps", "ratio",
            "rel_err", "wrong", "speedup"}


def _bench(*args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "ccoll.bench", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _expected_ratio(collective: str, spec: str, count: int, n: int) -> float:
    """raw / wire bytes of one rank, from the codec's encoded_nbytes and the collectives' chunking
    (equal chunks of ceil(count / n) elements for the reduce / all-to-all paths; an all_reduce small
    enough for one exchange sends its whole tensor encoded once, ccoll.collectives.small)."""
    if spec == "native":
        return 1.0
    from ccoll.collectives.small import one_exchange

    c = ccoll_codec(spec)
    enc = lambda k: c.encoded_nbytes(k, torch.float32)  # noqa: E731
    chunk = -(-count // n)
    raw, wire = {
        "all_reduce": (count * 4, enc(count) if one_exchange(c, n, count, torch.float32) else n * enc(chunk)),
        "reduce_scatter": (count * 4, n * enc(count // n)),
        "all_to_all": (count * 4, n * enc(count // n)),
        "all_gather": (count // n * 4, enc(count // n)),
        "broadcast": (count * 4, enc(count)),
        "sendrecv": (count * 4, enc(count)),
        "sendrecv_bw": (count * 4, enc(count)),
    }[collective]
    return raw / wire


def ccoll_codec(spec: str):
    import ccoll

    return ccoll.get_codec(spec)


def test_given_three_gloo_ranks_when_benchmarking_all_collectives_expect_consistent_rows(tmp_path):
    out = tmp_path / "all.json"
    specs = ["native", "int4:block=64,round=stochastic"]  # the comma inside a spec must survive the list
    r = _bench("all", "--np", "3", "-b", "16K", "-e", "16K", "-n", "2", "-w", "1",
               "--codec", ",".join(specs), "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert {(x["collective"], x["codec"]) for x in rows} == {(c, s) for c in FACTORS for s in specs}
    assert len(rows) == len(FACTORS) * len(specs)
    for x in rows:
        where = f"{x['collective']} {x['codec']} {x['size_bytes']}"
        assert ROW_KEYS <= set(x), where
        assert x["wrong"] == 0, where
        assert x["time_us"] > 0 and x["size_bytes"] == x["count"] * 4, where
        assert math.isclose(x["algbw_gbps"], x["size_bytes"] / (x["time_us"] * 1e-6) / 1e9, rel_tol=1e-9), where
        assert math.isclose(x["busbw_gbps"], x["algbw_gbps"] * FACTORS[x["collective"]](3), rel_tol=1e-9), where
        assert math.isclose(x["ratio"], _expected_ratio(x["collective"], x["codec"], x["count"], 3),
                            rel_tol=1e-9), where
        if x["codec"] == "native":
            assert x["rel_err"] < 1e-6 and x["speedup"] == 1.0, where
        else:
            assert 0 < x["rel_err"] < 0.5, where
            native = next(y for y in rows if y["codec"] == "native" and
                          (y["collective"], y["size_bytes"]) == (x["collective"], x["size_bytes"]))
            assert math.isclose(x["speedup"], native["time_us"] / x["time_us"], rel_tol=1e-9), where
    # sizes that n does not divide are rounded down to a multiple of n where the collective needs it
    assert {x["count"] for x in rows if x["collective"] == "all_gather"} == {4095}
    assert {x["count"] for x in rows if x["collective"] == "all_reduce"} == {4096}
    # the printed table: '#' header lines with versions, a units row, then fixed columns
    lines = r.stdout.splitlines()
    assert lines[0].startswith("# ccoll ") and "torch" in lines[0]
    assert any("world_size 3" in ln and "backend gloo" in ln for ln in lines)
    assert any(ln.startswith("#") and "(GB/s)" in ln for ln in lines)
    data = [ln.split() for ln in lines if not ln.startswith("#")]
    assert len(data) == len(rows) and all(len(d) == 11 for d in data)


@pytest.mark.mpi
def test_given_mpi_backend_when_benchmarking_all_reduce_expect_no_wrong_elements(tmp_path):
    out = tmp_path / "mpi.json"
    r = _bench("all_reduce", "--backend", "mpi", "--np", "2", "-b", "64K", "-e", "64K", "-n", "2", "-w", "1",
               "--codec", "native,int8:block=256", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert doc["meta"]["backend"] == "mpi" and doc["meta"]["world_size"] == 2
    assert [x["codec"] for x in doc["rows"]] == ["native", "int8:block=256"]
    assert all(x["wrong"] == 0 for x in doc["rows"])
    assert math.isclose(doc["rows"][1]["ratio"], _expected_ratio("all_reduce", "int8:block=256", 16384, 2))


def test_given_bad_arguments_when_starting_expect_one_line_error_and_status_2(capsys):
    """Validated before any rank starts (so in-process here: nothing is launched)."""
    from ccoll.bench.harness import main

    assert main(["all_reduce", "--np", "2", "--codec", "native,nosuchcodec"]) == 2
    err = capsys.readouterr().err
    assert "unknown codec 'nosuchcodec'" in err and "int8" in err
    assert main(["all_reduce", "--np", "2", "-b", "2M", "-e", "1M"]) == 2
    assert "-b" in capsys.readouterr().err
    assert main(["all_reduce", "--np", "2", "--dtype", "float64", "--codec", "int8:block=256"]) == 2
    assert "does not take torch.float64" in capsys.readouterr().err


def _corrupted_check(rank: int, world_size: int) -> tuple[float, int]:
    """In a real 2-rank group: all_reduce's exact result, then rank 0 puts 5 elements far outside any
    bound and rank 1 flips the last mantissa bit of 7 others (inside the bound, but the ranks now
    disagree). Expected #wrong: 5 (bound, rank 0) + 5 + 7 (rank 1 differs from rank 0 bit-wise)."""
    from ccoll.bench.harness import COLLECTIVES, TorchWorld
    from ccoll.bench.measure import _check

    w = TorchWorld(60)
    coll = COLLECTIVES["all_reduce"]
    case = coll.build(w, 1000, torch.float32, 0)
    case.out.copy_(case.ref.to(torch.float32))
    if rank == 0:
        case.out[10:15] += 100.0
    else:
        bits = case.out.view(torch.int32)
        bits[500:507] ^= 1
    return _check(w, coll, case, ccoll_codec("int8:block=256"), case.out.numel())


def test_given_corrupted_or_disagreeing_output_when_checking_expect_wrong_counts_them():
    results = run_gloo(2, _corrupted_check, timeout_s=60)
    rel_err, wrong = results[0]
    assert results[0] == results[1]
    assert wrong == 5 + 5 + 7
    assert rel_err > 1e-3
