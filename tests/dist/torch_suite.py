"""torch's own distributed tests (``torch.testing._internal.distributed.distributed_test``, gloo, 2 ranks)
on a fixed selection, run unpatched or under ``ccoll-run --policy P`` (``python -m ccoll.run``), with each
test's outcome.

torch runs that suite from ``test/distributed/test_distributed_spawn.py`` (not in the wheel): environment
``BACKEND=gloo``, ``WORLD_SIZE=2``, ``TEMP_DIR``, and ``class TestDistBackendWithSpawn(TestDistBackend,
DistributedTest._DistTestBase)`` whose ``setUp`` spawns the ranks. This module is that file for ccoll:

    python -m tests.dist.torch_suite --out results.json [--policy configs/x.yaml] [test_name ...]

runs the selection (:data:`SELECTION`, or the names given) in a child interpreter: unpatched, or as
``python -m ccoll.run --policy P -- python -m tests.dist.torch_suite --child ...``, so every Python process
of the run, the spawned ranks included (multiprocessing's ``spawn`` starts fresh interpreters), gets
ccoll's ``sitecustomize`` and installs the patch when it imports torch. Each rank writes whether the patch
was installed in it, and with which policy (:func:`probe`): the parent reports the ranks that were not, so
a run that silently tested torch alone is noticed.

Outcome per test: ``passed``, ``failed`` (an assertion or an error, with the first line of its message),
or ``skipped`` (with torch's reason). ``tests/dist/test_torch_suite.py`` compares them per policy.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORLD_SIZE = 2
#: env var naming the directory each spawned rank writes its probe into
PROBE_ENV = "CCOLL_TORCH_SUITE_PROBE"
MODULE = "tests.dist.torch_suite"

#: the selected tests of ``DistributedTest._DistTestBase``: every one runs (none skipped) on gloo, CPU, 2
#: ranks, unpatched, in about a minute. Left out: what torch skips there (all_to_all: "Only MPI supports
#: CPU all_to_all_single"; subgroup tests: "small world size"; many DDP tests: "Need at least 2 CUDA
#: devices"), and slow or timeout tests.
SELECTION: tuple[str, ...] = (
    # all_reduce (sync, async, complex, every reduce op, whole world and full group), sparse, coalesced
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_sum_complex",
    "test_all_reduce_complex_unsupported_ops", "test_all_reduce_max", "test_all_reduce_min", "test_all_reduce_product",
    "test_all_reduce_full_group_sum", "test_all_reduce_full_group_min", "test_all_reduce_full_group_max",
    "test_sparse_all_reduce_sum", "test_all_reduce_coalesced_sum", "test_all_reduce_coalesced_full_group_max",
    # rooted: reduce, broadcast, scatter, gather
    "test_reduce_sum", "test_reduce_max", "test_reduce_full_group_sum", "test_reduce_full_group_max",
    "test_broadcast", "test_broadcast_full_group",
    "test_scatter", "test_scatter_checks", "test_scatter_full_group",
    "test_gather", "test_gather_checks", "test_gather_full_group",
    # all_gather list forms (the tensor form is compressed; its gloo tests are CUDA-only)
    "test_all_gather", "test_all_gather_complex", "test_all_gather_full_group",
    "test_all_gather_coalesced_simple", "test_all_gather_coalesced_with_empty", "test_all_gather_coalesced_full_group",
    # point-to-point: blocking, async, any source, tags, both profilers; batch_isend_irecv
    "test_send_recv", "test_send_recv_autograd_profiler", "test_send_recv_torch_profiler",
    "test_send_recv_any_source", "test_send_recv_any_source_autograd_profiler",
    "test_send_recv_any_source_torch_profiler",
    "test_send_recv_with_tag", "test_send_recv_with_tag_autograd_profiler", "test_send_recv_with_tag_torch_profiler",
    "test_isend", "test_isend_autograd_profiler", "test_isend_torch_profiler", "test_irecv",
    "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags",
    # objects, barriers, groups
    "test_all_gather_object_default_pg", "test_all_gather_object_subgroup", "test_scatter_object_list",
    "test_barrier", "test_barrier_full_group", "test_monitored_barrier_gloo", "test_monitored_barrier_gloo_subgroup",
    "test_get_rank", "test_get_backend", "test_get_rank_size_group",
    # DDP on CPU (under a compressing policy DDP models get ccoll's comm hook: ccoll.auto)
    "test_DistributedDataParallelCPU", "test_DistributedDataParallelCPU_grad_is_view",
    "test_DistributedDataParallel_requires_grad", "test_accumulate_gradients_no_sync",
    "test_accumulate_gradients_no_sync_grad_is_view", "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_grads_same_across_ranks_with_no_sync", "test_get_future", "test_ddp_create_graph",
    "test_ddp_logging_data_cpu", "test_static_graph_api_cpu",
)


def _setup_env(env: dict, tmp: str) -> dict:
    env = dict(env)
    env.update(BACKEND="gloo", WORLD_SIZE=str(WORLD_SIZE), TEMP_DIR=tmp, INIT_METHOD="env://",
               PYTHONDONTWRITEBYTECODE="1", CCOLL_LOG="off", OMP_NUM_THREADS="1")
    env[PROBE_ENV] = os.path.join(tmp, "probe")
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def run(policy: str | None, names: "tuple[str, ...] | list[str]" = SELECTION, timeout: float = 1200) -> dict:
    """Run ``names`` (unpatched when ``policy`` is None, else under ``python -m ccoll.run --policy``) in a child
    interpreter; returns ``{"outcomes": {name: [outcome, detail]}, "probes": [...], "seconds": s}``."""
    with tempfile.TemporaryDirectory(prefix="ccoll-torch-suite-") as tmp:
        out = os.path.join(tmp, "outcomes.json")
        os.makedirs(os.path.join(tmp, "probe"))
        child = [sys.executable, "-m", "tests.dist.torch_suite", "--child", out, *names]
        cmd = child if policy is None else [sys.executable, "-m", "ccoll.run", "--policy", policy, "--", *child]
        t0 = time.monotonic()
        p = subprocess.run(cmd, cwd=ROOT, env=_setup_env(os.environ, tmp), capture_output=True, text=True,
                           timeout=timeout)
        seconds = time.monotonic() - t0
        if not os.path.exists(out):
            raise RuntimeError(f"torch suite runner wrote no outcomes (exit {p.returncode}):\n{p.stdout[-4000:]}\n"
                               f"{p.stderr[-8000:]}")
        with open(out) as f:
            outcomes = json.load(f)
        probe_dir = os.path.join(tmp, "probe")
        probes = []
        for name in sorted(n for n in os.listdir(probe_dir) if n != "per_test_env.json"):
            with open(os.path.join(probe_dir, name)) as f:
                probes.append(json.load(f))
    return {"outcomes": outcomes, "probes": probes, "seconds": seconds, "policy": policy, "log": p.stderr}


def counts(outcomes: dict) -> dict:
    """{"passed": n, "failed": n, "skipped": n}"""
    c = {"passed": 0, "failed": 0, "skipped": 0}
    for outcome, _ in outcomes.values():
        c[outcome] += 1
    return c


# --- inside the child interpreter ------------------------------------------------------------------------------
def probe(test_name: str, rank: int) -> None:
    """Write whether ccoll's patch is installed in this rank (and its policy's source)."""
    d = os.environ.get(PROBE_ENV)
    if not d:
        return
    info = {"test": test_name, "rank": rank, "pid": os.getpid(), "installed": False, "policy": None}
    if "ccoll.patch" in sys.modules or os.environ.get("CCOLL_POLICY"):
        from ccoll import patch

        info["installed"] = bool(patch.is_installed())
        pol = patch.current_policy() if info["installed"] else None
        info["policy"] = getattr(pol, "source", None)
    with open(os.path.join(d, f"{test_name}.{rank}.json"), "w") as f:
        json.dump(info, f)


#: what torch's setUp sets per test in the parent's environment, which spawned ranks would inherit
_PER_TEST_ENV = ("TEMP_DIR", "INIT_METHOD")


def _env_file() -> str:
    return os.path.join(os.environ[PROBE_ENV], "per_test_env.json")


def _suite_class():
    from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        """torch's test/distributed/test_distributed_spawn.py, plus the probe in every rank. The ranks are
        forked from multiprocessing's forkserver, a fresh interpreter started once per run (so it gets
        ccoll's ``sitecustomize`` like a spawned rank) that has imported torch and this suite: a rank
        then starts in well under a second instead of importing torch's test suite again."""

        def setUp(self):
            super().setUp()  # a new TEMP_DIR (and INIT_METHOD) per test, in this process's environment
            import torch.multiprocessing as mp

            with open(_env_file(), "w") as f:  # the forkserver's environment is the one it started with
                json.dump({k: os.environ[k] for k in _PER_TEST_ENV}, f)
            self._start_processes(mp.get_context("forkserver").Process)

        @classmethod
        def _run(cls, rank, test_name, file_name, pipe, **kwargs):
            with open(_env_file()) as f:
                os.environ.update(json.load(f))
            probe(test_name, rank)
            return super()._run(rank, test_name, file_name, pipe, **kwargs)

    TestDistBackendWithSpawn.__module__ = MODULE  # pickled by this name into the ranks (not __main__)
    TestDistBackendWithSpawn.__qualname__ = "TestDistBackendWithSpawn"
    return TestDistBackendWithSpawn


if os.environ.get("BACKEND") == "gloo" and os.environ.get(PROBE_ENV):
    # spawned ranks unpickle the test class by this module's name: it must exist at import time
    TestDistBackendWithSpawn = _suite_class()


class _Result(unittest.TextTestResult):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.outcomes: dict = {}

    @staticmethod
    def _name(test) -> str:
        return test.id().rsplit(".", 1)[-1]

    def addSuccess(self, test):
        super().addSuccess(test)
        self.outcomes[self._name(test)] = ["passed", ""]

    def _failed(self, test, err):
        text = self._exc_info_to_string(err, test)
        self.outcomes[self._name(test)] = ["failed", _summary(text)]

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._failed(test, err)

    def addError(self, test, err):
        super().addError(test, err)
        self._failed(test, err)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.outcomes[self._name(test)] = ["skipped", str(reason)]


def _summary(text: str) -> str:
    """The child ranks' exception lines (torch's parent test re-raises them inside its own message)."""
    lines = [ln.strip() for ln in text.splitlines()]
    keep = [ln for ln in lines if ln and ("Error" in ln.split(":")[0] or ln.startswith("AssertionError"))]
    return " | ".join(dict.fromkeys(keep))[:1500] or (lines[-1] if lines else "")


def _child(out: str, names: list[str]) -> int:
    import importlib

    import torch.multiprocessing as mp

    mp.set_forkserver_preload([MODULE])
    cls = importlib.import_module(MODULE).TestDistBackendWithSpawn
    suite = unittest.TestSuite(cls(n) for n in names)
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=2, resultclass=_Result)
    result = runner.run(suite)
    with open(out, "w") as f:
        json.dump(result.outcomes, f, indent=1, sort_keys=True)
    return 0


def main(argv: "list[str] | None" = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", metavar="OUT", help=argparse.SUPPRESS)
    p.add_argument("--policy", help="a policy (ccoll-run --policy); unpatched when absent")
    p.add_argument("--out", help="write the outcomes as JSON here")
    p.add_argument("names", nargs="*")
    args = p.parse_args(argv)
    if args.child:
        return _child(args.child, args.names)
    res = run(args.policy, tuple(args.names) or SELECTION)
    for name, (outcome, detail) in sorted(res["outcomes"].items()):
        print(f"{outcome:8s} {name}  {detail[:300]}")
    print(counts(res["outcomes"]), f"{res['seconds']:.0f} s",
          f"ranks with the patch: {sum(p['installed'] for p in res['probes'])}/{len(res['probes'])}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
