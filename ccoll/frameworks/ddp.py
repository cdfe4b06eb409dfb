"""torch DDP: its reducer (C++) never calls the torch.distributed functions the patch wraps, so every DDP
model built while installed gets ccoll's comm hook at its first forward unless the user registers theirs
(the three methods below; what they do is ``ccoll.auto.ddp_methods``). Places no group: the model's
process group is placed by the other adapters like any group."""
from __future__ import annotations

from ..log import logger
from .patches import INSTALL, Patch, Wrapping, replace, replaced

NAME = "DDP"
SOURCE = None
DESCS: dict = {}
OWNER = "torch.nn.parallel.distributed.DistributedDataParallel"
METHODS = ("__init__", "register_comm_hook", "_register_builtin_comm_hook")
signature = None

PATCHES = (
    Patch(NAME, OWNER, METHODS, INSTALL, "ccoll.auto.ddp_methods",
          "number each model and attach ccoll's comm hook at its first forward; a user's hook wins"),
)


def present() -> bool:
    import sys

    return "torch.nn.parallel.distributed" in sys.modules


def place(placer, default_pg) -> int:
    return 1


def install(w: Wrapping) -> None:
    from .. import auto

    try:
        from torch.nn.parallel import DistributedDataParallel as DDP

        originals = [getattr(DDP, m) for m in METHODS]
    except (ImportError, AttributeError) as e:  # a torch without DDP's hook API: nothing to attach to
        logger.debug("ccoll: DDP not wrapped (%s)", e)
        return
    if replaced(DDP, "__init__"):
        return
    for name, fn in zip(METHODS, auto.ddp_methods(*originals)):
        replace(DDP, name, fn)


def uninstall(w: Wrapping) -> None:
    pass
