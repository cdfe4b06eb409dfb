"""Megatron: Megatron-core's ``parallel_state`` names its groups (``group_desc``, :data:`DESCS`); GPT-NeoX's
and legacy Megatron's ``megatron.mpu`` places its data / model / pipe groups (its topology when it has one);
the torch.distributed functions Megatron(-core) binds at import get ccoll's wrappers. Never imports
megatron: reads what the process already imported."""
from __future__ import annotations

import sys

from .patches import INSTALL, Patch, Wrapping, call, rebind, replace

NAME = "Megatron"
SOURCE = "GPT-NeoX/Megatron 'megatron.mpu' (model_parallel_is_initialized, get_topology)"

#: Megatron-core ``parallel_state`` group_desc -> policy dimension (the groups its initialize_model_parallel
#: builds; combined groups such as MODEL_PARALLEL_GROUP or EMBEDDING_GROUP stay unplaced)
DESCS = {
    "DATA_PARALLEL_GROUP": "dp", "DATA_PARALLEL_GROUP_GLOO": "dp", "DATA_PARALLEL_GROUP_WITH_CP": "dp",
    "DATA_PARALLEL_GROUP_WITH_CP_GLOO": "dp", "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP": "dp",
    "INTER_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP": "dp", "EXPERT_DATA_PARALLEL_GROUP": "dp",
    "EXPERT_DATA_PARALLEL_GROUP_GLOO": "dp",
    "TENSOR_MODEL_PARALLEL_GROUP": "tp", "EXPERT_TENSOR_PARALLEL_GROUP": "tp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
}
DESC_SOURCE = "megatron.core.parallel_state"

#: module-level names Megatron(-core) binds to torch.distributed functions at import
#: (tensor_parallel/mappings.py, distributed/param_and_grad_buffer.py, ...)
CACHED = ("dist_all_gather_func", "dist_reduce_scatter_func")

PATCHES = (
    Patch(NAME, "megatron.*", CACHED, INSTALL, "ccoll.patch (the torch.distributed wrappers)",
          "bound at import: a module imported before install would bypass the patch"),
)

signature = None


def present() -> bool:
    return "megatron" in sys.modules


def place(placer, default_pg) -> int:
    mpu = sys.modules.get("megatron.mpu")
    if mpu is None or not call(mpu, "model_parallel_is_initialized"):
        return 1
    topo = call(mpu, "get_topology")
    if topo is not None:
        return placer.topology(topo, "megatron.mpu")
    placer.add("dp", "megatron.mpu", groups=[call(mpu, "get_data_parallel_group")])
    placer.add("tp", "megatron.mpu", groups=[call(mpu, "get_model_parallel_group")])
    pipe = call(mpu, "get_pipe_parallel_group")
    if pipe is None:
        return 1
    placer.add("pp", "megatron.mpu", groups=[pipe])
    return len(placer.ranks(pipe))


def _modules():
    return [m for n, m in list(sys.modules.items()) if m is not None and (n == "megatron" or n.startswith("megatron."))]


def _swap(w: Wrapping, table_from: dict, table_to: dict, undo: bool) -> None:
    by_id = {id(f): name for name, f in table_from.items()}
    for mod in _modules():
        for attr in CACHED:
            name = by_id.get(id(getattr(mod, attr, None)))
            if name is not None and name in table_to:
                (rebind if undo else replace)(mod, attr, table_to[name])


def install(w: Wrapping) -> None:
    """Modules imported before install hold torch's functions: give them the wrappers (modules imported
    while installed bind the wrappers by themselves)."""
    _swap(w, w.originals, w.wrappers, undo=False)


def uninstall(w: Wrapping) -> None:
    """Modules imported while installed hold the wrappers: give them torch's functions back (the ones
    :func:`install` replaced are restored by ccoll.frameworks.restore)."""
    _swap(w, w.wrappers, w.originals, undo=True)
