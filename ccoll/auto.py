"""Zero code for DDP and FSDP2: attach ccoll to every model built while ``ccoll.patch`` is installed.

DDP's reducer (C++) and FSDP2's collectives never call the ``torch.distributed`` functions the patch
wraps, so under ``ccoll-run`` they would run uncompressed. While installed (``ccoll.patch.install`` calls
:func:`install`), the adapters of ccoll/frameworks (``ddp``, ``fsdp2``, ``hf``: which methods, when, through
the one table of patches) call this module, which decides what each model gets:

- DDP: wraps ``DistributedDataParallel.__init__`` to number each instance (0, 1, ... in order of
  construction, the same in a resumed run) and build a :class:`ccoll.ddp.CompressionState` from the
  policy's ``dp`` all_reduce rule (codec, error feedback, min_bytes, warmup). The hook is attached at
  the model's first forward, not at construction: DDP takes one ``register_comm_hook`` call, and a user
  (or a framework: accelerate's comm-hook option, DDP's own mixed precision) may register theirs after
  construction. A hook registered before the first forward goes to torch and ccoll stays off that model;
  one registered after replaces ccoll's inside ccoll's dispatcher, so the user's hook always wins. Either
  way it is said once in the log.
- FSDP2: wraps ``FSDPState._lazy_init`` (the root's first forward, when every ``fully_shard`` is done) to
  give each FSDP module that still has torch's default reduce-scatter ccoll's
  (:class:`ccoll.fsdp.CompressedReduceScatter`, the policy's ``dp`` reduce_scatter rule), and its
  all-gather where the policy compresses ``dp`` all_gather. A custom comm set by the user is left alone.
- ``attach: {ddp: false}`` / ``{fsdp: false}`` in the policy turns either off.
- Hugging Face Trainer: ccoll/frameworks/hf.py wraps ``transformers.trainer.Trainer.__init__`` (when the
  process imports it) to put :class:`ccoll.hf.CcollCallback` first among the new Trainer's callbacks.

Error-feedback state of every attached model is part of :func:`ccoll.patch.state_dict` under
``"auto"`` (``{"ddp": {index: ...}, "fsdp": {index: ...}}``); :func:`ccoll.patch.load_state_dict` hands
each model its own, now or when the model with that index is attached.
"""
from __future__ import annotations

import atexit
import functools
import gc
import threading
import weakref
from typing import Any, Callable

from .errors import PolicyError
from .log import tell

__all__ = ["install", "uninstall", "state_dict", "load_state_dict", "attached", "Attached"]


class Attached:
    """What ccoll did with one DDP or FSDP2 model: ``kind`` ("ddp" | "fsdp"), ``index`` (order of
    construction / first forward), ``status`` ("pending" | "compressing" | "user hook" | "opted out" |
    "policy off"), ``detail`` (the user's hook name, the codec), ``state`` (CompressionState or
    FSDPCompression, None when ccoll does not act on the model)."""

    def __init__(self, kind: str, index: int, status: str, detail: str = "", state: Any = None):
        self.kind, self.index, self.status, self.detail, self.state = kind, index, status, detail, state
        self.user_hook: tuple[Any, Callable] | None = None  # (state, hook) a user registered after ccoll's
        self._pre_hook: Any = None  # DDP: the forward pre-hook that attaches ccoll's comm hook

    def __repr__(self) -> str:
        return f"<ccoll.auto {self.kind}#{self.index} {self.status} {self.detail}>"


_lock = threading.RLock()
class _Installed:
    """The policy models built from now on are attached with (None: ccoll.patch is not installed)."""

    policy = None
    exit_hook = False  # _release_ddp_models registered with atexit


_installed = _Installed()
_models: list[Attached] = []
_by_ddp: "weakref.WeakKeyDictionary[Any, Attached]" = weakref.WeakKeyDictionary()
_pending: dict[tuple[str, int], dict] = {}  # loaded state of models not attached yet
_counts = {"ddp": 0, "fsdp": 0}


def attached() -> list[Attached]:
    """Every DDP / FSDP2 model seen while installed, in order."""
    with _lock:
        return list(_models)


def _add(kind: str, status: str, detail: str = "", state: Any = None) -> Attached:
    with _lock:
        entry = Attached(kind, _counts[kind], status, detail, state)
        _counts[kind] += 1
        _models.append(entry)
        loaded = _pending.pop((kind, entry.index), None)
    if loaded is not None and state is not None:
        state.load_state_dict(loaded)
    return entry


# --- DDP ------------------------------------------------------------------------------------------------
def _ddp_dispatch(entry: Attached, bucket):
    """The one hook ccoll registers: ccoll's compress_hook, or the user's hook once they registered one."""
    if entry.user_hook is not None:
        state, hook = entry.user_hook
        return hook(state, bucket)
    from .ddp import compress_hook

    return compress_hook(entry.state, bucket)


def _ddp_attach(ddp: Any, entry: Attached, register: Callable) -> None:
    """At the first forward: register ccoll's dispatcher unless someone registered a hook already."""
    _ddp_attach_cancel(entry)
    if entry.status != "pending":
        return
    if getattr(ddp, "_comm_hooks", None):  # registered without our wrapper seeing it (DDP's mixed precision)
        hook = ddp._comm_hooks[0][1]
        _user_hook(entry, getattr(hook, "__qualname__", repr(hook)))
        return
    register(ddp, entry, _ddp_dispatch)
    entry.status = "compressing"


def _user_hook(entry: Attached, name: str) -> None:
    entry.status, entry.detail = "user hook", name
    tell("ccoll: DDP model #%d has your comm hook %s; ccoll leaves it alone (its gradients are not compressed "
          "by ccoll)", entry.index, name)


def ddp_methods(init: Callable, register: Callable, builtin: Callable) -> tuple[Callable, Callable, Callable]:
    """DDP's ``__init__``, ``register_comm_hook`` and ``_register_builtin_comm_hook`` as ccoll replaces them
    (ccoll/frameworks/ddp.py puts them in place), given torch's."""
    @functools.wraps(init)  # frameworks read DDP's signature (inspect follows __wrapped__)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _on_ddp(self, register)

    @functools.wraps(register)
    def register_comm_hook(self, state: object, hook: Callable) -> None:
        entry = _by_ddp.get(self)
        if entry is None or entry.status not in ("pending", "compressing"):
            return register(self, state, hook)
        self._check_comm_hook(hook)
        name = getattr(hook, "__qualname__", repr(hook))
        if entry.status == "pending":  # before the first forward: torch's own registration, ccoll stays off
            _ddp_attach_cancel(entry)
            register(self, state, hook)
        else:  # after: DDP takes one registration, ccoll's dispatcher calls theirs from now on
            entry.user_hook = (state, hook)
        _user_hook(entry, name)

    @functools.wraps(builtin)
    def _register_builtin_comm_hook(self, comm_hook_type):
        entry = _by_ddp.get(self)
        if entry is None or entry.status not in ("pending", "compressing"):
            return builtin(self, comm_hook_type)
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        if entry.status == "pending":
            _ddp_attach_cancel(entry)
            builtin(self, comm_hook_type)
        else:
            python = {dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
                      dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook}
            if comm_hook_type not in python:
                raise PolicyError(f"ccoll: DDP model #{entry.index} already runs ccoll's comm hook; register "
                                  f"{comm_hook_type} before its first forward, or set 'attach: {{ddp: false}}'")
            entry.user_hook = (self.process_group, python[comm_hook_type])
        _user_hook(entry, str(comm_hook_type))

    return __init__, register_comm_hook, _register_builtin_comm_hook


def _ddp_attach_cancel(entry: Attached) -> None:
    handle = entry._pre_hook
    if handle is not None:
        handle.remove()
        entry._pre_hook = None


def _on_ddp(ddp: Any, register: Callable) -> None:
    pol = _installed.policy
    if pol is None:
        return
    rule = pol.rule("dp", "all_reduce")
    if not pol.attach["ddp"]:
        entry = _add("ddp", "opted out", "attach: {ddp: false}")
    elif rule.codec_obj is None:
        entry = _add("ddp", "policy off", "dp all_reduce is native")
    else:
        from .ddp import CompressionState

        state = CompressionState(ddp.process_group, rule.codec_obj, error_feedback=rule.error_feedback,
                                 min_bytes=rule.min_bytes, warmup_steps=rule.warmup_steps, model=ddp)
        entry = _add("ddp", "pending", rule.codec_obj.spec, state)

        def first_forward(module, args):
            _ddp_attach(module, entry, register)

        entry._pre_hook = ddp.register_forward_pre_hook(first_forward)
    with _lock:
        _by_ddp[ddp] = entry


# --- FSDP2 ----------------------------------------------------------------------------------------------
def on_fsdp_root(root: Any) -> None:
    """At an FSDP2 root's first forward (ccoll/frameworks/fsdp2.py, which has placed its groups): give each
    FSDP module that still has torch's default reduce-scatter ccoll's, and its all-gather where the policy
    compresses dp all_gather."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    pol = _installed.policy
    rs, ag = pol.rule("dp", "reduce_scatter"), pol.rule("dp", "all_gather")
    if not pol.attach["fsdp"]:
        _add("fsdp", "opted out", "attach: {fsdp: false}")
        return
    if rs.codec_obj is None and ag.codec_obj is None:
        _add("fsdp", "policy off", "dp reduce_scatter and all_gather are native")
        return
    from .fsdp import CompressedAllGather, CompressedReduceScatter, FSDPCompression

    state = FSDPCompression(rs.codec_obj, ag.codec_obj, rs.error_feedback, rs.min_bytes, rs.warmup_steps)
    theirs = []
    for name, sub in root.named_modules():
        if not isinstance(sub, FSDPModule):
            continue
        name = name or "<root>"
        groups = sub._get_fsdp_state()._fsdp_param_groups
        if not groups:
            continue
        mine = False
        if rs.codec_obj is not None:
            if all(type(g._reduce_scatter_comm) is DefaultReduceScatter for g in groups):
                for g in groups:
                    g._reduce_scatter_comm = CompressedReduceScatter(state, name)
                mine = True
            else:
                theirs.append(f"{name}: {type(groups[0]._reduce_scatter_comm).__name__}")
        if ag.codec_obj is not None and all(type(g._all_gather_comm) is DefaultAllGather for g in groups):
            for g in groups:
                g._all_gather_comm = CompressedAllGather(state, name)
            mine = True
        if mine:
            state.modules.append(name)
    entry = _add("fsdp", "compressing" if state.modules else "user hook", repr(state) if state.modules else
                 "; ".join(theirs), state if state.modules else None)
    if theirs:
        tell("ccoll: FSDP2 model #%d: custom reduce-scatter left alone on %s", entry.index, ", ".join(theirs))


def _release_ddp_models() -> None:
    """At exit, while the interpreter is whole: drop each DDP model's reducer, logger and process group
    reference, so a group the script already destroyed is freed now. Left to interpreter teardown, the
    gloo group is freed from module cleanup while its worker threads still hold requests and tensors,
    which aborts the process ("terminate called without an active exception", status -6) after training
    finished: 14 of 90 runs of a plain DDP script under ccoll-run torchrun, 1 of 90 with this (the last
    60: 0). The models are not used after exit handlers run."""
    for ddp in list(_by_ddp.keys()):
        for name in ("reducer", "logger", "process_group"):
            ddp.__dict__.pop(name, None)
    gc.collect()


def install(policy: Any) -> None:
    """Called by ``ccoll.patch.install``: use ``policy`` for models built from now on (the methods that see
    them are replaced by ccoll/frameworks' adapters)."""
    with _lock:
        if _installed.policy is None and not _installed.exit_hook:
            atexit.register(_release_ddp_models)
            _installed.exit_hook = True
        _installed.policy = policy


def installed() -> bool:
    """Whether models built now are attached (``ccoll.patch`` is installed)."""
    return _installed.policy is not None


def uninstall() -> None:
    """Models built from now on are left alone; models (and Trainers) already attached keep their hooks
    (callbacks)."""
    with _lock:
        _installed.policy = None


def reset() -> None:
    """Forget every model seen (tests; a fresh process starts empty)."""
    with _lock:
        _models.clear()
        _pending.clear()
        _counts.update(ddp=0, fsdp=0)


def state_dict() -> dict:
    """``{"ddp": {index: state}, "fsdp": {index: state}}`` of the models ccoll compresses."""
    with _lock:
        out: dict = {"ddp": {}, "fsdp": {}}
        for e in _models:
            if e.state is not None:
                out[e.kind][e.index] = e.state.state_dict()
        for (kind, index), st in _pending.items():  # loaded, model not built yet: keep it for the next save
            out[kind].setdefault(index, st)
    return out


def load_state_dict(state: dict) -> None:
    """Give each attached model its saved state; keep the rest for models attached later."""
    todo = []
    with _lock:
        for kind in ("ddp", "fsdp"):
            for index, st in (state.get(kind) or {}).items():
                index = int(index)
                entry = next((e for e in _models if e.kind == kind and e.index == index), None)
                if entry is None:
                    _pending[(kind, index)] = st
                elif entry.state is not None:
                    todo.append((entry.state, st))
    for target, st in todo:
        target.load_state_dict(st)

