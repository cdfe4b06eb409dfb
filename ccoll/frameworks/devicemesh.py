"""torch DeviceMesh (torchtitan, FSDP2/TP/PP meshes): a mesh names its dims; its groups carry ``group_desc``
``mesh_<dim>`` (:data:`DESCS`), except a dim spanning all ranks, which reuses the default group -- so ccoll
records every mesh built while installed (``DeviceMesh.__init__``) and places those dims by rank set."""
from __future__ import annotations

import functools
import weakref
from typing import Any

from .patches import INSTALL, Patch, Wrapping, replace, replaced, resolve, restore_one

NAME = "DeviceMesh"
SOURCE = "DeviceMesh dims spanning all ranks (meshes built while ccoll.patch is installed)"
OWNER = "torch.distributed.device_mesh.DeviceMesh"

#: torch DeviceMesh dimension names (torchtitan's spelling) -> policy dimension. Other names (cp, ...) have
#: no policy dimension and stay unplaced.
MESH_DIMS = {"dp": "dp", "dp_replicate": "dp", "dp_shard": "dp", "fsdp": "dp", "dp_shard_cp": "dp", "dp_cp": "dp",
             "tp": "tp", "pp": "pp", "ep": "ep"}
DESCS = {f"mesh_{name}": dim for name, dim in MESH_DIMS.items()}
DESC_SOURCE = "DeviceMesh"

PATCHES = (
    Patch(NAME, OWNER, ("__init__",), INSTALL, "ccoll.frameworks.devicemesh",
          "record every mesh: a dim spanning all ranks reuses the default group, whose group_desc names no dim"),
)


class _MeshTracker:
    """DeviceMeshes built while tracking is on, by creation number (weak: a mesh the user drops is
    forgotten; ordered: every rank reads them in the same order)."""

    def __init__(self) -> None:
        self.meshes: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
        self.version = 0  # meshes built so far: part of AutoResolver's cache signature


MESHES = _MeshTracker()


def signature() -> int:
    return MESHES.version


def present() -> bool:
    return resolve(OWNER) is not None


def place(placer, default_pg) -> int:
    """Every named dim of every recorded mesh (group_desc already names the ones that are not the default
    group); a ``pp`` dim over all ranks makes WORLD send/recv pipeline traffic."""
    stages = 1
    for _, mesh in sorted(MESHES.meshes.items()):
        for name in getattr(mesh, "mesh_dim_names", None) or ():
            dim = MESH_DIMS.get(name)
            if dim is None:
                continue
            try:
                grp = mesh.get_group(name)
            except Exception:  # noqa: BLE001 - a mesh this rank is not part of, or being torn down
                continue
            placer.add(dim, "DeviceMesh", groups=[grp])
            if dim == "pp" and placer.ranks(grp) == placer.ranks(default_pg):
                stages = 2
    return stages


def track(on: bool) -> None:
    """Record every DeviceMesh built from now on (on) / stop (off: the original ``__init__`` back)."""
    from torch.distributed import device_mesh

    cls = device_mesh.DeviceMesh
    if on and not replaced(cls, "__init__"):
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            init(self, *args, **kwargs)
            MESHES.version += 1
            MESHES.meshes[MESHES.version] = self

        replace(cls, "__init__", __init__)
    elif not on and replaced(cls, "__init__"):
        restore_one(cls, "__init__")


def install(w: Wrapping) -> None:
    track(True)


def uninstall(w: Wrapping) -> None:
    pass
