"""MPI progress under a job that mixes transports: real gloo + MPI ranks under mpiexec.

Each rank waits its outstanding async handles in its OWN random order (``--wait-order rank``). Without
ccoll's MPI progress thread this deadlocked at call 15 of this very program: a rank blocked in a gloo
wait left its MPI requests unprogressed, so a peer's MPI wait never finished (see
ccoll/transports/mpi.py, "Progress"). The runner checks every result against the exact value and that
all ranks hold identical results, and fails (exit 124) instead of hanging."""
from __future__ import annotations

import json

import pytest

from launch import run_mpi

pytestmark = pytest.mark.mpi


def test_mpi_given_two_transports_and_per_rank_wait_orders_expect_no_deadlock_and_identical_results():
    out = run_mpi(4, "ccoll.bench.two_transports", ["--calls", "60", "--wait-order", "rank", "--timeout", "150"],
                  timeout_s=240).stdout
    report = json.loads([line for line in out.splitlines() if line.startswith('{"ranks"')][-1])
    assert report["calls"] == 60 and report["identical_across_ranks"], report
    assert any(k.startswith("mpi/") for k in report["mix"]) and any(k.startswith("torch/") for k in report["mix"])
