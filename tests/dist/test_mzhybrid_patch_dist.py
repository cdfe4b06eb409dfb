"""configs/mzhybrid.yaml under ccoll.patch on 2 real gloo ranks: the TP and PP traffic (torch.distributed
calls, as Megatron / DeepSpeed's pipeline engine make them) is compressed by the lossless codec through the
variable-size collectives, arrives bit-identical to the unpatched run, moves fewer bytes than it carries,
and DP gradients still take the lossy int4 codec."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch import run_gloo  # noqa: E402

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs", "mzhybrid.yaml")


def _traffic(rank: int, world: int) -> dict:
    """TP-like collectives and PP-like sends of activation-like bf16 and fp32 tensors (2-D and 3-D)."""
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(77 + rank)
    out = {}
    for dtype in (torch.bfloat16, torch.float32):
        act = (torch.randn(8, 16, 64, generator=g) * torch.exp(torch.randn(8, 16, 64, generator=g))).to(dtype)
        t = act.clone()
        dist.all_reduce(t)
        out[f"all_reduce_{dtype}"] = t
        gathered = torch.empty(world * act.numel(), dtype=dtype)
        dist.all_gather_into_tensor(gathered, act.reshape(-1))
        out[f"all_gather_{dtype}"] = gathered
        rs = torch.empty(act.numel() // world, dtype=dtype)
        dist.reduce_scatter_tensor(rs, act.reshape(-1).clone())
        out[f"reduce_scatter_{dtype}"] = rs
        # the pipeline engine's pattern: both stages post their receive and send, then wait
        recv = torch.empty_like(act)
        ops = [dist.P2POp(dist.isend, act, 1 - rank), dist.P2POp(dist.irecv, recv, 1 - rank)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        out[f"p2p_batch_{dtype}"] = recv
        r2 = torch.empty_like(act)
        if rank == 0:
            dist.send(act, 1)
            dist.recv(r2, 1)
        else:
            dist.recv(r2, 0)
            dist.send(act, 0)
        out[f"p2p_{dtype}"] = r2
    return out


def _job(rank: int, world: int) -> dict:
    import torch

    import ccoll
    import ccoll.patch as patch
    from ccoll import Policy

    ref = _traffic(rank, world)
    report = {}
    for dim in ("tp", "pp"):
        ccoll.reset_stats()
        with patch.installed(Policy.from_yaml(CONFIG), resolver=lambda group, op, dim=dim: dim):
            got = _traffic(rank, world)
        for k, v in ref.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), (dim, k)
        rows = [r for r in ccoll.stats() if r["codec"].startswith("lossless")]
        report[dim] = {(r["op"]): (r["raw_bytes"], r["wire_bytes"]) for r in rows}
    ccoll.reset_stats()
    with patch.installed(Policy.from_yaml(CONFIG), resolver=lambda group, op: "dp"):
        t = torch.randn(4096, generator=torch.Generator().manual_seed(rank))
        torch.distributed.all_reduce(t)
    report["dp"] = sorted({r["codec"] for r in ccoll.stats()})
    return report


def test_mzhybrid_given_tp_and_pp_traffic_when_patched_expect_bit_identical_results_fewer_bytes_and_lossy_dp():
    reports = run_gloo(2, _job, timeout_s=180)
    for rep in reports:
        for dim in ("tp", "pp"):
            ops = rep[dim]
            assert {"all_reduce", "all_gather", "reduce_scatter", "send", "recv"} <= set(ops), (dim, ops)
            for op, (raw, wire) in ops.items():
                assert 0 < wire < raw, (dim, op, raw, wire)
        assert [s.split(",")[0] for s in rep["dp"]] == ["int4:block=64"], rep["dp"]
