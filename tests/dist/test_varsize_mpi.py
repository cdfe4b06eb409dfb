"""The variable-size collectives over mpi4py (2 ranks under mpiexec): see varsize_mpi_checks.py."""
from __future__ import annotations

import os

import pytest

from launch import run_mpi

pytestmark = pytest.mark.mpi

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "varsize_mpi_checks.py")


def test_varsize_given_mpi_ranks_when_lossless_collectives_expect_exact_results_and_short_p2p_messages():
    assert "VARSIZE_MPI_OK" in run_mpi(2, SCRIPT, timeout_s=120).stdout
