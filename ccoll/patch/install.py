"""install / uninstall / installed: put the wrappers in torch.distributed's place and take them out.

What is replaced where (torch.distributed and distributed_c10d, the functions DeepSpeed and Megatron
cached before install, DeviceMesh, DDP, FSDP2, Trainer) is ccoll/frameworks' table, and every replacement
and its undoing goes through it: install runs every adapter's ``install``, uninstall puts every original back.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

import torch.distributed as dist

from .. import auto as _auto, frameworks as _frameworks, report as _report  # zero code: DDP/FSDP2 hooks, user lines
from ..errors import PolicyError
from ..frameworks.megatron import CACHED as MEGATRON_CACHED  # noqa: F401  (re-exported)
from ..frameworks.torch_distributed import C10D_TOO  # noqa: F401  (re-exported)
from ..log import logger
from ..policy import Policy, load as _load_policy
from . import batch, fingerprint, wrap
from .state import SLOT, State, advance

#: torch.distributed attribute -> policy op
WRAPPED = {**{name: row.op for name, row in wrap.ROWS.items()}, "batch_isend_irecv": "send_recv"}

def _wrapper(name: str, orig: Callable) -> Callable:
    if name == "batch_isend_irecv":
        return batch.make(orig)
    if name == "init_process_group":
        return fingerprint.wrap_init_process_group(orig)
    return wrap.make(name, orig)


def _wrapping() -> _frameworks.Wrapping:
    return _frameworks.Wrapping(_wrapper, SLOT.originals, SLOT.wrappers)


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
            _auto.install(pol)  # before the adapters: an FSDP2 / Trainer already imported is wrapped now
            _frameworks.install(_wrapping())  # torch.distributed, DeepSpeed, Megatron, DeviceMesh, DDP, FSDP2, Trainer
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
    """Restore everything ccoll replaced (ccoll/frameworks' table: torch.distributed's functions, DeepSpeed's
    and Megatron's cached ones, DeviceMesh, DDP, FSDP2, Trainer; an attribute someone replaced on top of
    ccoll's is left, with a warning). Idempotent."""
    with SLOT.lock:
        SLOT.current = None
        _auto.uninstall()  # zero code: models built from now on are left alone
        if SLOT.step_hook is not None:
            SLOT.step_hook.remove()
            SLOT.step_hook = None
        if not SLOT.originals:
            return
        _frameworks.uninstall(_wrapping())
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
