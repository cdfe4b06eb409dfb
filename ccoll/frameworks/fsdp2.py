"""FSDP2 (``fully_shard``): its reduce-scatter / all-gather never reach the torch.distributed functions the
patch wraps, so ccoll gives each FSDP2 model its own comms at the root's first forward
(``FSDPState._lazy_init``, wrapped when the process imports FSDP2's state module; the attaching is
``ccoll.auto.on_fsdp_root``), and places the model's shard (and HSDP's replicate) groups on ``dp``."""
from __future__ import annotations

import weakref
from typing import Any

from ..log import logger
from .patches import IMPORT, Patch, Wrapping, replace, replaced, when_imported

NAME = "FSDP2"
SOURCE = "the process groups of FSDP2 modules ccoll attached to (dp)"
DESCS: dict = {}
MODULE = "torch.distributed.fsdp._fully_shard._fsdp_state"
OWNER = f"{MODULE}.FSDPState"

PATCHES = (
    Patch(NAME, OWNER, ("_lazy_init",), IMPORT, "ccoll.frameworks.fsdp2 -> ccoll.auto.on_fsdp_root",
          "the root's first forward, when every fully_shard is done: attach ccoll's comms, place the groups",
          module=MODULE),
)


class _AttachedGroups:
    """Process groups whose dimension ccoll knows from what it attached to: FSDP2 shards (and, for HSDP,
    replicates) a module's parameters over its mesh's groups, so those are ``dp`` -- also for the calls
    FSDP2 makes through torch.distributed itself (its parameter all-gathers when the policy keeps them
    native), which the automatic resolver could not place when the mesh has no dim names (``fully_shard``'s
    default mesh over all ranks). Placed at the root module's first forward, which every rank runs before
    any of those calls, so every rank decides alike."""

    def __init__(self) -> None:
        self.groups: "weakref.WeakKeyDictionary[Any, tuple[str, str]]" = weakref.WeakKeyDictionary()
        self.version = 0  # part of AutoResolver's cache signature


ATTACHED = _AttachedGroups()


def place_group(group: Any, dim: str, source: str) -> None:
    """Place ``group`` on ``dim`` for every automatic resolver (``source`` names who knows, for the
    "nothing compressed" diagnosis)."""
    if group is None or ATTACHED.groups.get(group) == (dim, source):
        return
    ATTACHED.groups[group] = (dim, source)
    ATTACHED.version += 1


def signature() -> int:
    return ATTACHED.version


def present() -> bool:
    import sys

    return MODULE in sys.modules


def place(placer, default_pg) -> int:
    """Groups of what ccoll attached to, after the frameworks' own placements (the adapter comes last)."""
    for grp, (dim, source) in list(ATTACHED.groups.items()):
        placer.add(dim, source, groups=[grp])
    return 1


def place_groups(root: Any) -> None:
    """FSDP2's shard (and HSDP's replicate) groups are ``dp`` for the patch too: its own calls through
    torch.distributed (parameter all-gathers the policy keeps native) are then counted and ruled as dp,
    not as ``default`` when the mesh has no dim names. Placed whether or not ccoll attaches its comms."""
    from torch.distributed.fsdp import FSDPModule

    for sub in root.modules():
        if isinstance(sub, FSDPModule):
            for group in sub._get_fsdp_state()._fsdp_param_groups:
                info = group.mesh_info
                for attr in ("shard_process_group", "replicate_process_group"):
                    place_group(getattr(info, attr, None), "dp", "FSDP2")


def _wrap() -> None:
    from .. import auto

    if not auto.installed():
        return
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    except ImportError as e:  # torch < 2.7: no FSDP2 custom comms
        logger.debug("ccoll: FSDP2 not wrapped (%s)", e)
        return
    lazy_init = getattr(FSDPState, "_lazy_init", None)
    if lazy_init is None:
        logger.debug("ccoll: FSDP2 not wrapped (no FSDPState._lazy_init in this torch)")
        return
    if replaced(FSDPState, "_lazy_init"):
        return

    def _lazy_init(self) -> None:
        first = self._is_root is None
        lazy_init(self)
        if first and self._is_root and auto.installed():
            root = self._modules[0]
            place_groups(root)
            auto.on_fsdp_root(root)

    replace(FSDPState, "_lazy_init", _lazy_init)


def install(w: Wrapping) -> None:
    """Wrapped when the process imports FSDP2's state module (never imported here: ~1 s)."""
    when_imported(MODULE, _wrap)


def uninstall(w: Wrapping) -> None:
    pass
