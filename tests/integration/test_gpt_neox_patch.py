"""gpt_neox_patch/train.py's launch path against a minimal stand-in GPT-NeoX checkout: NeoX's own
train.py / megatron/initialize.py assert CUDA, so that path cannot run here (the real GPT2ModelPipe is
trained in test_gpt_neox_real.py, with NeoX's init calls made directly). The stand-in mirrors what the wrapper relies on: a ``train.py`` run as
``__main__`` that calls ``deepspeed.init_distributed`` (real DeepSpeed, gloo, CPU) and then
``megatron.mpu.initialize_model_parallel(..., topology=PipeModelDataParallelTopology)``, and an mpu
module with NeoX's accessor names. 4 ranks: tensor 2 x data 2, policy configs/hybrid.yaml."""
from __future__ import annotations

import json
import pathlib
import runpy
import subprocess
import sys
import textwrap

import pytest

from ccoll.launch import free_port, rank_env

pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[2]
WRAPPER = REPO / "gpt_neox_patch" / "train.py"

STANDIN_MPU = '''
"""Stand-in for GPT-NeoX's megatron.mpu: same accessor names, groups built from the topology."""
import torch.distributed as dist

_GROUPS = {}
_TOPOLOGY = None


def initialize_model_parallel(model_parallel_size, topology=None, fp32_allreduce=False):
    global _TOPOLOGY
    _TOPOLOGY = topology
    rank = dist.get_rank()
    for name, axis in (("data", "data"), ("pipe", "pipe"), ("model", "model")):
        for ranks in topology.get_axis_comm_lists(axis):
            group = dist.new_group(ranks=ranks)
            if rank in ranks:
                _GROUPS[name] = group


def model_parallel_is_initialized():
    return "data" in _GROUPS and "model" in _GROUPS


def get_data_parallel_group():
    return _GROUPS["data"]


def get_model_parallel_group():
    return _GROUPS["model"]


def get_pipe_parallel_group():
    return _GROUPS["pipe"]


def get_topology():
    return _TOPOLOGY
'''

STANDIN_TRAIN = '''
"""Stand-in for GPT-NeoX's train.py: distributed init the way megatron/initialize.py does it."""
import json, os, sys
import torch
import torch.distributed as dist
import ccoll
import ccoll.patch


def main():
    out = {"argv": sys.argv[1:], "installed_before_init": ccoll.patch.is_installed() and not dist.is_initialized()}
    import deepspeed
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    from megatron import mpu

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    rank = dist.get_rank()
    import deepspeed.comm.comm as ds_comm  # its backend, built after install, caches the wrappers
    out["cdb_wrapped"] = (ds_comm.cdb.all_gather_function is dist.all_gather_into_tensor
                          and hasattr(ds_comm.cdb.all_gather_function, "__wrapped__")
                          and ds_comm.cdb.reduce_scatter_function is dist.reduce_scatter_tensor)
    out["policy_source"] = ccoll.patch.current_policy().source
    t = torch.ones(4096)
    dist.all_reduce(t)  # before mpu exists: nothing is placed on a parallel dimension yet
    out["stats_before_mpu"] = ccoll.stats()
    mpu.initialize_model_parallel(2, topology=PipeModelDataParallelTopology(num_pp=1, num_mp=2, num_dp=2))
    ccoll.reset_stats()
    g = torch.Generator().manual_seed(rank)
    grad = torch.randn(16384, generator=g)
    dist.all_reduce(grad, group=mpu.get_data_parallel_group())
    act = torch.randn(8192, generator=g)
    dist.all_reduce(act, group=mpu.get_model_parallel_group())
    loss = torch.ones(1)
    dist.all_reduce(loss, group=mpu.get_data_parallel_group())
    out["stats"] = ccoll.stats()
    with open(os.path.join(os.environ["RESULT_DIR"], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
    from ccoll.launch import exit_process  # as every rank ends: no interpreter teardown after gloo

    exit_process(0)
'''


def _standin(root: pathlib.Path) -> pathlib.Path:
    neox = root / "neox"
    (neox / "megatron").mkdir(parents=True)
    (neox / "megatron" / "__init__.py").write_text("")
    (neox / "megatron" / "mpu.py").write_text(textwrap.dedent(STANDIN_MPU))
    (neox / "train.py").write_text(textwrap.dedent(STANDIN_TRAIN))
    return neox


def test_given_standin_neox_when_launched_through_wrapper_expect_patch_before_init_and_mpu_groups_compressed(tmp_path):
    neox = _standin(tmp_path)
    results = tmp_path / "results"
    results.mkdir()
    port, world = free_port(), 4
    argv = ["--deepspeed_config", "e30=", "--megatron_config", "e30="]  # what deepy.py passes (opaque here)
    procs = []
    for rank in range(world):
        env = rank_env(rank, world, port, extra=dict(
            CCOLL_POLICY=REPO / "configs" / "hybrid.yaml", GPT_NEOX_DIR=neox, DS_ACCELERATOR="cpu",
            OMP_NUM_THREADS="1", RESULT_DIR=results, CCOLL_STATS=results / "stats.json", PYTHONPATH=REPO))
        procs.append(subprocess.Popen([sys.executable, str(WRAPPER), *argv], env=env, cwd=str(tmp_path),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=300)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, p in enumerate(procs):
        assert p.returncode == 0, f"rank {rank} failed:\n{outputs[rank][-4000:]}"

    from ccoll import get_codec

    int4, int8 = get_codec("int4:block=64").spec, get_codec("int8:block=256").spec
    for rank in range(world):
        out = json.loads((results / f"rank{rank}.json").read_text())
        assert out["argv"] == argv  # NeoX's train.py sees deepy's arguments unchanged
        assert out["installed_before_init"] and out["cdb_wrapped"]
        assert out["policy_source"].endswith("hybrid.yaml")
        # before mpu built its groups: the policy's default dimension (native), nothing on dp/tp/pp
        assert [(r["dim"], r["codec"]) for r in out["stats_before_mpu"]] == [("default", "native")]
        by = {(r["dim"], r["op"], r["codec"]): r["calls"] for r in out["stats"]}
        assert by == {("dp", "all_reduce", int4): 1, ("tp", "all_reduce", int8): 1, ("dp", "all_reduce", "native"): 1}, by
        # CCOLL_STATS: one dump per rank, at exit
        dumped = json.loads((results / f"stats.rank{rank}.json").read_text())
        assert dumped["rank"] == rank
        assert {(r["dim"], r["op"], r["codec"]) for r in dumped["stats"]} == set(by)


def _wrapper_main():
    return runpy.run_path(str(WRAPPER), run_name="ccoll_gpt_neox_patch")["main"]


def test_given_no_policy_env_when_starting_wrapper_expect_clear_exit(monkeypatch, tmp_path):
    monkeypatch.delenv("CCOLL_POLICY", raising=False)
    with pytest.raises(SystemExit, match="set CCOLL_POLICY"):
        _wrapper_main()()


def test_given_directory_that_is_not_neox_when_starting_wrapper_expect_clear_exit(monkeypatch, tmp_path):
    monkeypatch.setenv("CCOLL_POLICY", str(REPO / "configs" / "hybrid.yaml"))
    monkeypatch.setenv("GPT_NEOX_DIR", str(tmp_path))
    with pytest.raises(SystemExit, match="not a GPT-NeoX checkout"):
        _wrapper_main()()
