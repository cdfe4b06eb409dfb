"""install / uninstall / installed: put the wrappers in torch.distributed's place and take them out.

``isend``, ``irecv`` and ``batch_isend_irecv`` are replaced in both ``torch.distributed`` and
``torch.distributed.distributed_c10d`` (torch's ``P2POp`` checks its op against the latter by identity).
Functions frameworks cached before install are rebound (:func:`_rebind_cached`), so the import order does
not matter.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Callable, Iterator

import torch.distributed as dist

from .. import auto as _auto, report as _report  # zero code: DDP/FSDP2 hooks, user lines
from ..errors import PolicyError
from ..log import logger, warn_once
from ..policy import Policy, load as _load_policy
from . import batch, fingerprint, wrap
from .state import SLOT, State, advance

#: torch.distributed attribute -> policy op
WRAPPED = {**{name: row.op for name, row in wrap.ROWS.items()}, "batch_isend_irecv": "send_recv"}

#: names also replaced in ``torch.distributed.distributed_c10d``: ``P2POp`` checks its op against
#: ``distributed_c10d.isend/irecv`` by identity and ``batch_isend_irecv`` picks the peer keyword by
#: identity, so ``P2POp(dist.isend, ...)`` needs the same object in both modules
C10D_TOO = ("isend", "irecv", "batch_isend_irecv")

#: module-level names Megatron(-core) binds to torch.distributed functions at import
#: (tensor_parallel/mappings.py, distributed/param_and_grad_buffer.py, ...)
MEGATRON_CACHED = ("dist_all_gather_func", "dist_reduce_scatter_func")


def _wrapper(name: str, orig: Callable) -> Callable:
    if name == "batch_isend_irecv":
        return batch.make(orig)
    if name == "init_process_group":
        return fingerprint.wrap_init_process_group(orig)
    return wrap.make(name, orig)


def _rebind_cached(table_from: dict[str, Callable], table_to: dict[str, Callable]) -> None:
    """Where a framework holds one of ``table_from``'s functions, put ``table_to``'s in its place:
    DeepSpeed's TorchBackend (``all_gather_function``, ``reduce_scatter_function``, cached at
    construction) and every imported ``megatron.*`` module's :data:`MEGATRON_CACHED` names (bound at
    import). Modules imported while the patch is installed bind the wrappers by themselves; this covers
    the ones imported before install (and puts the originals back at uninstall), so the import order
    does not matter. Looks only at modules already in sys.modules."""
    by_id = {id(f): name for name, f in table_from.items()}

    def swap(obj: Any, attr: str) -> None:
        fn = getattr(obj, attr, None)
        name = by_id.get(id(fn)) if fn is not None else None
        if name is not None and name in table_to:
            setattr(obj, attr, table_to[name])

    comm = sys.modules.get("deepspeed.comm.comm")
    cdb = getattr(comm, "cdb", None) if comm is not None else None
    if cdb is not None:
        for attr in ("all_gather_function", "reduce_scatter_function"):
            swap(cdb, attr)
    for mod_name, mod in list(sys.modules.items()):
        if mod is not None and (mod_name == "megatron" or mod_name.startswith("megatron.")):
            for attr in MEGATRON_CACHED:
                swap(mod, attr)


def _bind(name: str, fn: Callable) -> None:
    """Set ``torch.distributed.<name>`` (and, for :data:`C10D_TOO`, ``distributed_c10d.<name>``)."""
    setattr(dist, name, fn)
    if name in C10D_TOO:
        setattr(dist.distributed_c10d, name, fn)


def _auto_resolver() -> Callable:
    from ..resolvers import AutoResolver

    return AutoResolver()


def install(policy: "Policy | str | os.PathLike[str]", resolver: Callable | None = None, *,
            step_counter: str = "optimizer") -> Policy:
    """Route torch.distributed calls through ccoll by ``policy`` (a Policy or a YAML path).

    ``resolver(group, op) -> dim | None`` (see ccoll.resolvers). None (the default): a new
    :class:`ccoll.resolvers.AutoResolver`, which places groups from what DeepSpeed, GPT-NeoX/Megatron
    mpu, Megatron-core parallel_state or torch DeviceMesh built, at call time, so installing before
    the framework exists is fine; groups it cannot place use the policy's "default" rules. An explicit
    resolver wins. Installing again replaces policy and resolver (wrappers are not stacked) and
    compares fingerprints again, so every rank must install the same sequence of policies.
    Returns the loaded Policy."""
    if step_counter not in ("optimizer", "manual"):
        raise PolicyError(f"step_counter must be 'optimizer' or 'manual', got {step_counter!r}")
    pol = _load_policy(policy)
    if resolver is None:
        resolver = _auto_resolver()
    with SLOT.lock:
        if not SLOT.originals:
            for name in list(WRAPPED) + ["init_process_group"]:
                orig = getattr(dist, name, None)
                if orig is None:
                    continue
                SLOT.originals[name] = orig
                SLOT.wrappers[name] = _wrapper(name, orig)
                # what ccoll's own transports call, so moving ccoll's payloads never re-enters the patch
                SLOT.wrappers[name].__ccoll_original__ = orig
                _bind(name, SLOT.wrappers[name])
            _rebind_cached(SLOT.originals, SLOT.wrappers)
            from ..resolvers import track_device_meshes

            track_device_meshes(True)
        st = State(pol, resolver, step_counter)
        if SLOT.current is not None:
            st.steps = SLOT.current.steps
        SLOT.current = st
        if SLOT.step_hook is not None:
            SLOT.step_hook.remove()
            SLOT.step_hook = None
        if step_counter == "optimizer":
            from torch.optim.optimizer import register_optimizer_step_post_hook

            SLOT.step_hook = register_optimizer_step_post_hook(lambda optimizer, *_: advance(optimizer))
        _auto.install(pol)  # zero code: attach to DDP / FSDP2 models built from now on
        _report.on_install(st)
    logger.info("ccoll patch installed: %s\n%s", pol, pol.describe())
    if dist.is_available() and dist.is_initialized():
        fingerprint.check(st)
    return pol


def uninstall() -> None:
    """Restore the original torch.distributed functions (and DeepSpeed's cached ones). Idempotent."""
    with SLOT.lock:
        SLOT.current = None
        _auto.uninstall()  # zero code: models built from now on are left alone
        if SLOT.step_hook is not None:
            SLOT.step_hook.remove()
            SLOT.step_hook = None
        if not SLOT.originals:
            return
        _rebind_cached(SLOT.wrappers, SLOT.originals)
        from ..resolvers import track_device_meshes

        track_device_meshes(False)
        for name, orig in SLOT.originals.items():
            if getattr(dist, name, None) is SLOT.wrappers[name]:
                _bind(name, orig)
            else:  # someone wrapped on top of us: leave theirs; ours is now a plain pass-through
                warn_once(f"ccoll-uninstall-{name}", "ccoll: torch.distributed.%s was replaced after ccoll "
                          "installed; leaving it (ccoll's wrapper below it now passes through)", name)
        SLOT.originals.clear()
        SLOT.wrappers.clear()


@contextlib.contextmanager
def installed(policy: "Policy | str | os.PathLike[str]", resolver: Callable | None = None, *,
              step_counter: str = "optimizer") -> Iterator[Policy]:
    """``with installed(policy, resolver): ...`` — install for the block, then restore what was before."""
    previous = SLOT.current
    pol = install(policy, resolver, step_counter=step_counter)
    try:
        yield pol
    finally:
        if previous is None:
            uninstall()
        else:
            install(previous.policy, previous.resolver, step_counter=previous.step_counter)


def is_installed() -> bool:
    return SLOT.current is not None


def current_policy() -> Policy | None:
    st = SLOT.current
    return None if st is None else st.policy


def set_resolver(resolver: Callable | None) -> None:
    """Attach a resolver to the current installation (e.g. once a framework's groups exist); None: a
    new automatic resolver."""
    st = SLOT.current
    if st is None:
        raise PolicyError("ccoll.patch.set_resolver: the patch is not installed")
    st.resolver = _auto_resolver() if resolver is None else resolver
