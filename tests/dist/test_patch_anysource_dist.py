"""recv/irecv without src= (any source) under a compressing policy, on real gloo ranks: the receiver
decides as the senders do and decodes what arrives, so the user never gets payload bytes as data
(gloo accepts a shorter message into a longer buffer silently)."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from launch import run_gloo  # noqa: E402

NUMEL = 256


def _sent(rank: int, round_: int):
    import torch

    return (torch.arange(NUMEL) % 128).float() * 2.0 ** rank * (-1) ** round_  # exact in bf16, distinct per rank


def _job(rank: int, world: int):
    import torch
    import torch.distributed as dist

    import ccoll
    from ccoll import patch
    from ccoll.policy import Policy

    patch.install(Policy.from_dict({"version": 1, "pp": {"codec": "bf16", "min_bytes": 0}}),
                  resolver=lambda group, op: "pp", step_counter="manual")
    ccoll.reset_stats()
    out = {}
    try:
        if rank == 0:
            got = {}
            for _ in range(world - 1):  # round 0: blocking recv returns the sender
                buf = torch.empty(NUMEL)
                src = dist.recv(buf)
                got[src] = torch.equal(buf, _sent(src, 0))
            out["recv"] = got
            dist.barrier()  # round 1 starts only after every round-0 message arrived
            matched = []
            for _ in range(world - 1):  # round 1: irecv handles
                buf = torch.empty(NUMEL)
                dist.irecv(buf).wait()
                matched.append(sorted(r for r in range(1, world) if torch.equal(buf, _sent(r, 1))))
            out["irecv"] = matched
            out["stats"] = [(r["op"], r["codec"], r["calls"]) for r in ccoll.stats()]
        else:
            dist.send(_sent(rank, 0), 0)
            # Without this barrier an any-source receive may legitimately take this rank's round-1
            # message before the other sender's round-0 one (the flake CI hit: {1: False}).
            dist.barrier()
            dist.isend(_sent(rank, 1), 0).wait()
        dist.barrier()
    finally:
        patch.uninstall()
    return out


def test_given_compressing_policy_when_receiving_from_any_source_expect_decoded_values_and_sender():
    res = run_gloo(3, _job, timeout_s=120)
    r0 = res[0]
    assert r0["recv"] == {1: True, 2: True}
    assert sorted(r0["irecv"]) == [[1], [2]]
    assert ("recv", "bf16", 4) in r0["stats"]
    assert not [row for row in r0["stats"] if row[0] == "recv" and row[1] == "native"]
