"""Launch one training run (all ranks of one policy) and collect the ranks' results.

Ranks are plain subprocesses (``python -m ccoll.convergence.worker``) with gloo on loopback, or, with
``netem_rate``, one ``python -m ccoll.bench.netem`` command that starts every rank in its own network
namespace behind a shaped link. Either way this process owns the children: on failure or timeout it
stops exactly the processes it started and reports the failing rank's log tail.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

from ..errors import CcollError
from ..policy import DENSE_DIMS
from ..launch import free_port, rank_env, stop_process_groups


#: ops whose bytes the sender already counted
RECEIVE_OPS = ("recv", "irecv")


@dataclass
class RunResult:
    """What one policy's run produced (merged from every rank's file)."""

    name: str
    losses: list[float]
    samples_per_s: float
    seconds: float
    bytes: dict[str, dict[str, int]]
    stats: list[dict] = field(default_factory=list)
    seed: int = 0
    #: [[step, held-out loss], ...] (steps counted from 1, as in losses.csv)
    val_losses: list[list[float]] = field(default_factory=list)
    #: per rank, host-clock codec calls of steps 2..: {"encode"|"decode": {"nbytes", "seconds"}}
    codec: list[dict] = field(default_factory=list)


def _tail(path: str, nlines: int = 30) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-nlines:])
    except OSError:
        return "(no log)"


def _launch(spec_path: str, run_dir: str, world: int, netem_rate: str | None) -> list[subprocess.Popen]:
    worker = [sys.executable, "-m", "ccoll.convergence.worker", spec_path]
    base_env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    with open(spec_path) as f:
        spec = json.load(f)
    if spec.get("capture"):  # ccoll.capture reads these at import, in every rank
        base_env.update(CCOLL_CAPTURE=spec["capture"], CCOLL_CAPTURE_STEPS=",".join(map(str, spec["capture_steps"])))
    if netem_rate:
        cmd = [sys.executable, "-m", "ccoll.bench.netem", "--ranks", str(world), "--rate", netem_rate, "--", *worker]
        log = open(os.path.join(run_dir, "netem.log"), "w")
        return [subprocess.Popen(cmd, env=base_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)]
    port = free_port()
    procs = []
    for rank in range(world):
        env = rank_env(rank, world, port, local_rank=0, base=base_env)
        if "LOCAL_WORLD_SIZE" not in base_env:  # as these runs always had it: no node layout from the env
            del env["LOCAL_WORLD_SIZE"]
        log = open(os.path.join(run_dir, f"rank{rank}.log"), "w")
        procs.append(subprocess.Popen(worker, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    return procs


def _logs(run_dir: str, world: int, netem: bool) -> list[str]:
    return [os.path.join(run_dir, "netem.log")] if netem else [os.path.join(run_dir, f"rank{r}.log") for r in range(world)]


def run_policy(name: str, spec: dict, run_dir: str, on_step=None, timeout_s: float = 3600.0,
               netem_rate: str | None = None) -> RunResult:
    """Train ``spec`` on ``dp*tp*pp`` ranks. As rank 0 reports progress, ``on_step(step, loss, seconds)``
    is called per training step (``step`` from 0) and ``on_step("eval", step, val_loss)`` per evaluation."""
    os.makedirs(run_dir, exist_ok=True)
    for n in os.listdir(run_dir):  # a rerun must never read a previous run's results
        if n.startswith("rank") or n in ("progress.txt", "netem.log"):
            os.remove(os.path.join(run_dir, n))
    world = spec["dp"] * spec["tp"] * spec["pp"]
    spec = dict(spec, run_dir=os.path.abspath(run_dir))
    spec_path = os.path.join(run_dir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f, indent=1)
    progress_path = os.path.join(run_dir, "progress.txt")
    t0 = time.monotonic()
    procs = _launch(spec_path, run_dir, world, netem_rate)
    seen = 0
    try:
        while True:
            done = [p.poll() for p in procs]
            seen = _poll_progress(progress_path, seen, on_step)
            failed = [i for i, rc in enumerate(done) if rc not in (None, 0)]
            if failed:
                log = _logs(run_dir, world, bool(netem_rate))[failed[0]]
                raise CcollError(f"policy {name!r}: rank {failed[0]} exited with {done[failed[0]]}; "
                                 f"log {log}:\n{_tail(log)}")
            if all(rc == 0 for rc in done):
                break
            if time.monotonic() - t0 > timeout_s:
                raise CcollError(f"policy {name!r}: run exceeded {timeout_s:.0f} s; logs in {run_dir}")
            time.sleep(0.3)
        _poll_progress(progress_path, seen, on_step)
    finally:
        stop_process_groups(procs, term_wait_s=10.0)
    return _merge(name, run_dir, world, time.monotonic() - t0, spec["seed"])


def load_finished(name: str, spec: dict, run_dir: str) -> RunResult | None:
    """The result of an earlier run in ``run_dir`` if it ran exactly ``spec`` (same seed, policy, model,
    steps, ...) and every rank wrote its result; else None. Lets an interrupted or split comparison
    (e.g. seeds run by separate invocations into one ``--out``) be completed without rerunning what is
    done. Wall seconds: from the spec file's time (written at launch) to the last rank file's."""
    spec_path = os.path.join(run_dir, "spec.json")
    try:
        with open(spec_path) as f:
            old = json.load(f)
    except (OSError, ValueError):
        return None
    # "seeds" lists the whole comparison's seeds: it does not change this run
    if {k: v for k, v in old.items() if k != "seeds"} != dict(
            {k: v for k, v in spec.items() if k != "seeds"}, run_dir=os.path.abspath(run_dir)):
        return None
    world = spec["dp"] * spec["tp"] * spec["pp"]
    files = [os.path.join(run_dir, f"rank{r}.json") for r in range(world)]
    if not all(os.path.isfile(f) for f in files):
        return None
    wall_s = max(os.path.getmtime(f) for f in files) - os.path.getmtime(spec_path)
    return _merge(name, run_dir, world, wall_s, spec["seed"])


def _poll_progress(path: str, seen: int, on_step) -> int:
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return seen
    for line in lines[seen:]:
        parts = line.split()
        if on_step is not None and len(parts) == 3 and parts[0] == "eval":
            on_step("eval", int(parts[1]), float(parts[2]))
        elif on_step is not None and len(parts) == 3:
            on_step(int(parts[0]), float(parts[1]), float(parts[2]))
        seen += 1
    return seen


def _merge(name: str, run_dir: str, world: int, wall_s: float, seed: int = 0) -> RunResult:
    ranks = []
    for r in range(world):
        path = os.path.join(run_dir, f"rank{r}.json")
        try:
            with open(path) as f:
                ranks.append(json.load(f))
        except OSError as e:
            raise CcollError(f"policy {name!r}: rank {r} finished without writing {path}") from e
    # the pipeline engine hands every rank the DP-averaged loss of the last stage; rank 0's copy is it
    losses = ranks[0]["losses"]
    # throughput: the slowest rank's time over steps 2.. (step 1 includes one-off setup such as allocation)
    timed = max(sum(r["step_seconds"][1:]) if len(r["step_seconds"]) > 1 else sum(r["step_seconds"]) for r in ranks)
    nsteps = max(1, len(losses) - 1) if len(losses) > 1 else 1
    samples_per_s = ranks[0]["samples_per_step"] * nsteps / timed if timed > 0 else float("nan")
    totals = {d: {"raw": 0, "wire": 0} for d in DENSE_DIMS}
    all_stats = []
    for r in ranks:
        for row in r["stats"]:
            all_stats.append(dict(row, rank=r["rank"]))
            # a point-to-point message is counted once, by its sender (the receiver records the same bytes)
            if row["dim"] in totals and row["op"] not in RECEIVE_OPS:
                totals[row["dim"]]["raw"] += int(row["raw_bytes"])
                totals[row["dim"]]["wire"] += int(row["wire_bytes"])
    return RunResult(name, losses, samples_per_s, wall_s, totals, all_stats, seed, ranks[0].get("val_losses", []),
                     [r["codec"] for r in ranks if "codec" in r])
