"""The variable-size collectives on the simulated world (ccoll.testing: threads over the in-memory transport,
which matches message sizes exactly like NCCL): at p = 5 every result is bit-identical to the exact one on
every rank; point-to-point falls back to sending the capacity (so wire = capacity), the collectives still
move only the used bytes (padded to the call's largest)."""
from __future__ import annotations

import torch

import ccoll
from ccoll.testing import simulated_world


def _job(rank: int, group, n: int) -> dict:
    g = torch.Generator().manual_seed(rank)
    x = (torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g))).to(torch.bfloat16)
    codec = ccoll.get_codec("lossless", backend="emulated")
    p = 5
    out = torch.empty(p * n, dtype=torch.bfloat16)
    ccoll.all_gather_into_tensor(out, x, group=group, codec=codec, min_bytes=0)
    a, b = x.clone(), x.clone()
    ccoll.all_reduce(a, group=group, codec=codec, min_bytes=0)
    ccoll.all_reduce(b, group=group, codec="none", min_bytes=0)
    y = torch.empty(n, dtype=torch.bfloat16)
    hs = ccoll.isend(x, (rank + 1) % p, group=group, codec=codec, min_bytes=0)
    hr = ccoll.irecv(y, (rank - 1) % p, group=group, codec=codec, min_bytes=0)
    hr.wait()
    hs.wait()
    return {"gathered": out, "reduced": a, "none": b, "received": y, "x": x}


def test_varsize_given_simulated_world_of_5_expect_exact_results_and_capacity_p2p():
    n = 1000
    ccoll.reset_stats()
    res = simulated_world(5, _job, n)
    sends = [r for r in ccoll.stats() if r["op"] == "send" and r["codec"].startswith("lossless")]
    assert sends and sends[0]["wire_bytes"] == 5 * (16 + 2 * n)  # five ranks, each the capacity
    gathers = [r for r in ccoll.stats() if r["op"] == "all_gather" and r["codec"].startswith("lossless")]
    assert gathers[0]["wire_bytes"] < gathers[0]["raw_bytes"]
    xs = torch.cat([r["x"] for r in res])
    for r, rep in enumerate(res):
        assert torch.equal(rep["gathered"].view(torch.int16), xs.view(torch.int16))
        assert torch.equal(rep["reduced"].view(torch.int16), rep["none"].view(torch.int16))
        assert torch.equal(rep["reduced"].view(torch.int16), res[0]["reduced"].view(torch.int16))
        assert torch.equal(rep["received"].view(torch.int16), res[(r - 1) % 5]["x"].view(torch.int16))
