"""ccoll.resolvers.AutoResolver (the default of ``ccoll.patch.install``) on 4 real gloo ranks: Megatron-core
group_desc names, torch DeviceMesh dims by name (2-D and world-spanning 1-D meshes), real DeepSpeed
``deepspeed.utils.groups`` (no mpu: the cloned world group; a PipelineParallelGrid as mpu), no stale
answers after destroy_process_group + re-init, compression through the patch with no resolver given, and
the one warning when a compressing policy places nothing."""
from __future__ import annotations

import pathlib

import pytest

from launch import free_port, run_gloo

pytestmark = pytest.mark.slow

HYBRID = str(pathlib.Path(__file__).resolve().parents[2] / "configs" / "hybrid.yaml")
ENV = {"DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0"}


def _job(rank: int, world: int, port2: int):
    import datetime
    import gc
    import logging
    import time

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import ccoll
    import ccoll.patch as patch
    from ccoll.resolvers import AutoResolver, track_device_meshes

    out: dict = {}
    r = AutoResolver()
    out["plain_world"] = (r(None, "all_reduce"), r(None, "send_recv"))

    # Megatron-core parallel_state names its groups; identity of the name, whatever the rank set
    tp = [dist.new_group([0, 1], group_desc="TENSOR_MODEL_PARALLEL_GROUP"),
          dist.new_group([2, 3], group_desc="TENSOR_MODEL_PARALLEL_GROUP")][rank // 2]
    pp = [dist.new_group([0, 2], group_desc="PIPELINE_MODEL_PARALLEL_GROUP"),
          dist.new_group([1, 3], group_desc="PIPELINE_MODEL_PARALLEL_GROUP")][rank % 2]
    emb = dist.new_group([0, 3], group_desc="EMBEDDING_GROUP")
    out["mcore"] = (r(tp, "all_reduce"), r(pp, "send_recv"), r(emb, "all_reduce") if rank in (0, 3) else "default")

    # DeviceMesh, torchtitan names; a 2-D mesh's groups carry group_desc "mesh_<dim>"
    track_device_meshes(True)
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "tp"))
        out["mesh2d"] = (r(mesh.get_group("dp_replicate"), "all_reduce"), r(mesh.get_group("tp"), "all_gather"),
                         r(None, "all_reduce"))
        # a 1-D mesh over all ranks reuses the default group: WORLD *is* the dp group now
        shard = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
        out["mesh_world"] = (shard.get_group("dp_shard") is dist.group.WORLD, r(None, "all_reduce"),
                             r(dist.group.WORLD, "reduce_scatter"), r(None, "send_recv"))
        pipe = init_device_mesh("cpu", (world,), mesh_dim_names=("pp",))  # torch.distributed.pipelining's group
        out["mesh_world_pp"] = (r(None, "all_reduce"), r(pipe.get_group("pp"), "send_recv"))

        # per-call cost on a placed group (the steady state): report, not assert (the machine is shared)
        g = mesh.get_group("tp")
        t0 = time.perf_counter()
        for _ in range(20000):
            r(g, "all_reduce")
        out["call_us"] = (time.perf_counter() - t0) / 20000 * 1e6

        # compressed through the patch, no resolver given: tp activations int8, WORLD (= dp) gradients int4
        ccoll.reset_stats()
        with patch.installed(HYBRID):
            x = torch.randn(16384, generator=torch.Generator().manual_seed(rank))
            dist.all_reduce(x.clone(), group=mesh.get_group("tp"))
            dist.all_reduce(x.clone())
        out["stats"] = {(s["dim"], s["op"], s["codec"]): s["calls"] for s in ccoll.stats()}
        del mesh, shard, pipe, g
    finally:
        track_device_meshes(False)

    # destroy + re-init: the new WORLD is a new object; nothing about the old meshes may stick
    del tp, pp, emb
    gc.collect()
    dist.destroy_process_group()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port2}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    out["reinit_world"] = (r(None, "all_reduce"), r(None, "send_recv"))

    # DeepSpeed, real module: no mpu -> its DP group is a clone of WORLD -> dp (and WORLD with it)
    import deepspeed
    import deepspeed.utils.groups as ds_groups

    deepspeed.init_distributed(dist_backend="gloo")  # deepspeed.comm on the (re-)initialised WORLD
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology, PipelineParallelGrid

    clone = ds_groups._clone_world_group()
    out["ds_no_mpu"] = (r(clone, "all_reduce"), r(None, "all_reduce"))
    # a pipeline grid as DeepSpeed's mpu (what PipelineEngine passes): topology axes, WORLD p2p = pp
    grid = PipelineParallelGrid(topology=PipeModelDataParallelTopology(num_pp=2, num_mp=1, num_dp=2))
    ds_groups.mpu = grid
    try:
        out["ds_grid"] = (r(grid.get_data_parallel_group(), "all_reduce"), r(grid.get_pipe_parallel_group(), "broadcast"),
                          r(None, "send_recv"), r(None, "all_reduce"))
    finally:
        ds_groups.mpu = None
        ds_groups._WORLD_GROUP = None

    # a compressing policy that places nothing: one warning (rank 0's) after the first optimizer steps, naming
    # sources
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda rec: records.append(rec.getMessage())
    logging.getLogger("ccoll").addHandler(handler)
    try:
        with patch.installed(HYBRID):
            p = torch.nn.Parameter(torch.zeros(4))
            opt = torch.optim.SGD([p], lr=0.1)
            for _ in range(4):
                p.grad = torch.ones(4)
                opt.step()
    finally:
        logging.getLogger("ccoll").removeHandler(handler)
    out["warnings"] = [m for m in records if "no process group was placed" in m]
    return out


@pytest.fixture(scope="module")
def results():
    return run_gloo(4, _job, free_port(), timeout_s=240, env=ENV)


def test_given_no_framework_when_resolving_world_expect_default(results):
    assert all(r["plain_world"] == ("default", "default") for r in results)
    assert all(r["reinit_world"] == ("default", "default") for r in results)  # no stale mesh/dp after re-init


def test_given_megatron_core_group_desc_when_resolving_expect_tp_pp_and_others_default(results):
    assert all(r["mcore"] == ("tp", "pp", "default") for r in results)


def test_given_device_mesh_dims_by_name_when_resolving_expect_dp_tp_and_world_spanning_dims(results):
    for r in results:
        assert r["mesh2d"] == ("dp", "tp", "default")
        # WORLD is placed on dp when a dp dim spans all ranks (hybrid.yaml's comment), p2p on WORLD stays default
        assert r["mesh_world"] == (True, "dp", "dp", "default")
        # a world-spanning pp dim makes WORLD send/recv pipeline traffic; collectives keep the first mesh's dp
        assert r["mesh_world_pp"] == ("dp", "pp")
    print("AutoResolver per-call cost on a placed group: %.2f us" % results[0]["call_us"])


def test_given_no_resolver_when_patch_installed_expect_mesh_groups_compressed(results):
    from ccoll import get_codec

    int8, int4 = get_codec("int8:block=256").spec, get_codec("int4:block=64").spec
    for r in results:
        assert r["stats"] == {("tp", "all_reduce", int8): 1, ("dp", "all_reduce", int4): 1}


def test_given_real_deepspeed_groups_when_resolving_expect_dp_world_and_grid_axes(results):
    for r in results:
        assert r["ds_no_mpu"] == ("dp", "dp")
        assert r["ds_grid"] == ("dp", "pp", "pp", "default")


def test_given_compressing_policy_and_nothing_placed_when_steps_pass_expect_one_warning_naming_sources(results):
    assert [len(r["warnings"]) for r in results] == [1, 0, 0, 0]  # rank 0 says it for every rank
    msg = results[0]["warnings"][0]
    assert "dp/pp/tp" in msg and "DeviceMesh" in msg and "deepspeed.utils.groups" in msg and "megatron.mpu" in msg
    assert "`default:` rule" in msg
