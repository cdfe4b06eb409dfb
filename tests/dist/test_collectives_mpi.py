"""ccoll collectives over mpi4py communicators: 2 and 4 ranks under mpiexec, every check of
collective_checks.py plus MPI-only transport paths (see mpi_collective_checks.py)."""
from __future__ import annotations

import json
import os

import pytest

from collective_checks import available_specs
from launch import run_mpi
from mpi_collective_checks import MPI_SPECS

pytestmark = pytest.mark.mpi

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_collective_checks.py")


def _report(out: str) -> dict:
    lines = [line for line in out.splitlines() if line.startswith("CCOLL_REPORT ")]
    assert len(lines) == 1, out[-4000:]
    return json.loads(lines[0][len("CCOLL_REPORT "):])


@pytest.mark.parametrize("n", [2, 4])
def test_mpi_given_ranks_when_every_collective_and_codec_expect_within_bound_and_identical(n):
    report = _report(run_mpi(n, SCRIPT, timeout_s=180).stdout)
    assert report["specs"] == [s for s in available_specs() if s in MPI_SPECS] and len(report["specs"]) >= 3
    ef = report["error_feedback"]
    assert ef["err_ef"] < 0.5 * ef["err_plain"], ef
