"""DeepSpeed: ``deepspeed.utils.groups`` places its groups (its mpu -- a PipelineParallelGrid in pipeline runs
-- with its topology, expert-parallel groups -> ep, expert-data-parallel -> dp, and with no mpu the cloned
world group -> dp); its comm backend's cached torch functions get ccoll's wrappers; under ``ccoll-run``,
``deepspeed.initialize`` honours the config's ``"ccoll"`` block (ccoll/patch/dsconfig.py). Never imports
deepspeed: reads what the process already imported."""
from __future__ import annotations

import sys

from .patches import CCOLL_RUN, INSTALL, Patch, Wrapping, call, rebind, replace

NAME = "DeepSpeed"
SOURCE = "DeepSpeed 'deepspeed.utils.groups' (mpu / PipelineParallelGrid topology, expert groups, DP world group)"
DESCS: dict = {}

#: DeepSpeed's TorchBackend (``deepspeed.comm.comm.cdb``) caches these torch.distributed functions at
#: construction
CDB = "deepspeed.comm.comm.cdb"
CDB_CACHED = {"all_gather_function": "all_gather_into_tensor", "reduce_scatter_function": "reduce_scatter_tensor"}

PATCHES = (
    Patch(NAME, CDB, tuple(CDB_CACHED), INSTALL, "ccoll.patch (the torch.distributed wrappers)",
          "cached at the backend's construction: a backend built before install would bypass the patch"),
    Patch(NAME, "deepspeed", ("initialize",), CCOLL_RUN, "ccoll.patch.dsconfig.wrap_initialize",
          "install the policy of the DeepSpeed config's \"ccoll\" block before the engine is built"),
)


def present() -> bool:
    return "deepspeed.utils.groups" in sys.modules


def signature():
    ds = sys.modules.get("deepspeed.utils.groups")
    return None if ds is None else (id(ds.mpu), id(getattr(ds, "_WORLD_GROUP", None)))


def place(placer, default_pg) -> int:
    ds = sys.modules.get("deepspeed.utils.groups")
    if ds is None:
        return 1
    add, stages = placer.add, 1
    ds_mpu = getattr(ds, "mpu", None)
    if ds_mpu is not None:
        topo = getattr(ds_mpu, "_topo", None) or call(ds_mpu, "get_topology")
        if topo is not None and hasattr(topo, "get_axis_comm_lists"):
            stages = placer.topology(topo, "deepspeed")
        else:
            add("dp", "deepspeed", groups=[call(ds_mpu, "get_data_parallel_group")])
            add("tp", "deepspeed", groups=[call(ds_mpu, "get_model_parallel_group")])
    elif getattr(ds, "_WORLD_GROUP", None) is not None:
        add("dp", "deepspeed", groups=[ds._WORLD_GROUP])  # no mpu: DeepSpeed's DP is every rank
    add("ep", "deepspeed", groups=list(getattr(ds, "_EXPERT_PARALLEL_GROUP", {}).values()),
        rank_sets=list(getattr(ds, "_EXPERT_PARALLEL_GROUP_RANKS", {}).values()))
    add("dp", "deepspeed", groups=list(getattr(ds, "_EXPERT_DATA_PARALLEL_GROUP", {}).values()),
        rank_sets=list(getattr(ds, "_EXPERT_DATA_PARALLEL_GROUP_RANKS", {}).values()))
    return stages


def _cdb():
    comm = sys.modules.get("deepspeed.comm.comm")
    return getattr(comm, "cdb", None) if comm is not None else None


def install(w: Wrapping) -> None:
    """A backend built before install holds torch's functions: give it the wrappers (one built while
    installed binds them by itself)."""
    cdb = _cdb()
    if cdb is None:
        return
    for attr, name in CDB_CACHED.items():
        if name in w.originals and getattr(cdb, attr, None) is w.originals[name]:
            replace(cdb, attr, w.wrappers[name], owner=CDB)


def uninstall(w: Wrapping) -> None:
    """A backend built while installed holds the wrappers: give it torch's functions back (the ones
    :func:`install` replaced are restored by ccoll.frameworks.restore)."""
    cdb = _cdb()
    if cdb is None:
        return
    for attr, name in CDB_CACHED.items():
        if name in w.wrappers and getattr(cdb, attr, None) is w.wrappers[name]:
            rebind(cdb, attr, w.originals[name], owner=CDB)
