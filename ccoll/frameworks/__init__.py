"""ccoll/frameworks: the one place that knows the training frameworks.

One adapter module per framework, each saying (module-level names, the same in every adapter):

- ``NAME``; ``present()``: is the framework in this process (never imports it);
- ``place(placer, default_pg) -> pipeline stages``: which of its process groups go to which policy
  dimension (``placer.add(dim, source, groups=, rank_sets=)``, ``placer.topology(topo, source)``; called by
  ``ccoll.resolvers.AutoResolver`` when the frameworks' state changed), ``DESCS``: ``group_desc`` names ->
  dimension, ``signature``: None or a cheap function whose value changes when its placements may have
  (part of the resolver's per-call cache signature), ``SOURCE``: what the resolver looks for (None: nothing);
- ``PATCHES``: the rows of :data:`TABLE` -- which attributes of which objects ccoll replaces, when, by what;
- ``install(wrapping)`` / ``uninstall(wrapping)``: what it attaches, every replacement through
  :func:`ccoll.frameworks.patches.replace` (which refuses an attribute :data:`TABLE` does not list).
  ``ccoll.patch.install`` runs :func:`install` (every adapter, in :data:`ADAPTERS` order), ``uninstall``
  runs :func:`uninstall` (:func:`patches.restore`, then every adapter's sweep).

Adapters: torch.distributed itself (:mod:`.torch_distributed`), DeepSpeed, Megatron(-core and NeoX's
mpu), DeviceMesh, DDP, FSDP2, HF Trainer. To add a framework: one adapter module here, named in
:data:`ADAPTERS` (docs/ARCHITECTURE.md, "To add a framework").

This package sits below ``ccoll.patch``, ``ccoll.resolvers`` and ``ccoll._activate`` (which use it) and above
``ccoll.auto`` / ``ccoll.hf`` (the ccoll side of what DDP, FSDP2 and Trainer get attached).
"""
from __future__ import annotations

from . import ddp, deepspeed, devicemesh, fsdp2, hf, megatron, torch_distributed
from .patches import CCOLL_RUN, IMPORT, INSTALL, Patch, PatchError, Wrapping, active, register, replace, restore

#: every adapter; torch.distributed first (the others rebind its wrappers); placement order is trust order
#: (DeviceMesh, Megatron's mpu, DeepSpeed, then the groups of what ccoll attached to: FSDP2)
ADAPTERS = (torch_distributed, devicemesh, megatron, deepspeed, ddp, fsdp2, hf)

#: ccoll's own uses of the import system (not a framework's attributes, but replaced state all the same)
IMPORT_SYSTEM = (
    Patch("Python", "sys", ("meta_path",), IMPORT, "ccoll.frameworks.patches.when_imported",
          "wrap FSDP2 / Trainer right after the process imports them, never importing them itself"),
    Patch("Python", "sys", ("meta_path",), CCOLL_RUN, "ccoll/_activate/sitecustomize.py",
          "ccoll-run: install the patch right after torch is imported, wrap deepspeed.initialize when "
          "deepspeed is"),
)

#: the one table of every patch: (framework, owner, attributes, when, by, why)
TABLE = tuple(row for adapter in ADAPTERS for row in adapter.PATCHES) + IMPORT_SYSTEM
register(TABLE)

#: the adapters whose placements may change, in ADAPTERS order (AutoResolver's per-call signature)
SIGNATURES = tuple(a.signature for a in ADAPTERS if a.signature is not None)


def signature() -> tuple:
    """Every adapter's signature: the value of ``tuple(s() for s in SIGNATURES)``, written out because it is
    read on every torch.distributed call (the loop costs ~0.5 us more); tests/unit/test_frameworks.py checks
    the two agree, so an adapter that gains a signature must be added here."""
    return (devicemesh.MESHES.version, deepspeed.signature(), fsdp2.ATTACHED.version)

#: ``group_desc`` -> (dimension, source), from every adapter's DESCS
DESCS = {desc: (dim, a.DESC_SOURCE) for a in ADAPTERS for desc, dim in a.DESCS.items()}

#: what AutoResolver looks for, in the order it trusts them (named in the "nothing resolved" warning)
SOURCES = (("group_desc names (Megatron-core parallel_state, torch DeviceMesh 'mesh_<dim>')",)
           + tuple(a.SOURCE for a in ADAPTERS if a.SOURCE))


def install(wrapping: Wrapping) -> None:
    """Every adapter's replacements (``ccoll.patch.install``, once per installation)."""
    for adapter in ADAPTERS:
        adapter.install(wrapping)


def uninstall(wrapping: Wrapping) -> None:
    """Every original back (:func:`patches.restore`), then each adapter's sweep of what frameworks bound to
    ccoll's wrappers while installed."""
    restore()
    for adapter in reversed(ADAPTERS):
        adapter.uninstall(wrapping)


def present() -> list[str]:
    """The frameworks this process has (by NAME)."""
    return [a.NAME for a in ADAPTERS if a.present()]


__all__ = ["ADAPTERS", "TABLE", "Patch", "PatchError", "Wrapping", "install", "uninstall", "replace", "restore",
           "active", "present", "INSTALL", "IMPORT", "CCOLL_RUN"]
