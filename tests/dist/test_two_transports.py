"""Policy ``transport: mpi`` under the patch: one mpiexec job whose "dp" traffic goes through MPI and
"tp" traffic through torch.distributed (gloo), with a seeded mix of sync and async collectives on both
(see two_transport_checks.py; the 1,000-call run is the same script with ``--calls 1000``)."""
from __future__ import annotations

import os

import pytest

from launch import free_port, run_mpi
from test_collectives_mpi import _report

pytestmark = pytest.mark.mpi

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "two_transport_checks.py")


@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_given_dp_on_mpi_and_tp_on_torch_when_mixed_calls_expect_each_on_its_transport_and_no_deadlock(n):
    report = _report(run_mpi(n, SCRIPT, ["--calls", "60"], timeout_s=240,
                             env={"MASTER_PORT": free_port()}).stdout)
    # every op ran on both dimensions, both below and above the native size bucket
    kinds = report["by_kind"]
    assert {k.rsplit(":", 1)[0] for k in kinds} >= {f"{d}:{o}" for d in ("dp", "tp")
                                                   for o in ("all_reduce", "all_gather", "reduce_scatter", "broadcast")}
    assert any(k.endswith(":compressed") for k in kinds) and any(k.endswith(":native") for k in kinds)
    # MPI communicators exist for the dp groups only (n == 2: dp is WORLD, tp the same ranks on torch)
    dp_groups = [[0, 1]] * 2 if n == 2 else [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert report["mpi_groups"] == [[g] for g in dp_groups]
    for counts in report["transport_calls"]:
        assert counts["mpi"] > 0 and counts["torch"] > 0, counts
    assert report["worst_rel_err"]["native"] < 1e-6  # the exact paths stayed exact on MPI and gloo


def test_given_torch_ranks_numbered_unlike_mpi_when_transport_mpi_expect_transport_error_on_every_rank():
    report = _report(run_mpi(2, SCRIPT, ["--mismatch"], timeout_s=120, env={"MASTER_PORT": free_port()}).stdout)
    assert report == {"mismatch": "TransportError"}
