"""The tests' names for :mod:`ccoll.launch` (the one launcher of every program that starts ranks).

    from launch import run_gloo, run_mpi
    results = run_gloo(4, my_module_level_fn, arg1, timeout_s=60)  # fn(rank, world_size, *args) -> picklable
    out = run_mpi(2, "mpi_collective_checks", ["--quick"], timeout_s=60)  # module or script path

Any rank's exception fails the caller with that rank's traceback (a :class:`RankError`, an
AssertionError so pytest prints it like a failed assert); a hang kills every rank after ``timeout_s``.
Ranks run with one intra-op thread (the CI machine has 2 cores shared by all ranks) and end by
:func:`ccoll.launch.exit_process`. ``run_mpi`` here also finds the check scripts of this folder by module name.
"""
from __future__ import annotations

import os
import subprocess
from typing import Sequence

from ccoll.launch import RankError, free_port, mpiexec, run_gloo
from ccoll.launch import run_mpi as _run_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def run_mpi(n: int, script_or_module: str, args: Sequence[str] = (), timeout_s: float = 120.0,
            env: dict | None = None) -> subprocess.CompletedProcess:
    return _run_mpi(n, script_or_module, args, timeout_s=timeout_s, env=env, pythonpath=[REPO, HERE], cwd=REPO)


__all__ = ["RankError", "free_port", "mpiexec", "run_gloo", "run_mpi"]
