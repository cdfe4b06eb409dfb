"""The installation state: policy, resolver, step count, call keys, salts, error-feedback residuals;
and the public functions that read or advance it (``step``, ``steps``, ``state_dict``, ...).

Call keys: the n-th compressed call of a (dim, op, group) within a step is one logical tensor,
``(dim, op, group ranks, n)``. This positional scheme is what a generic patch can know (DeepSpeed and
Megatron reduce their gradient buckets in the same order every step) and it names error-feedback
residuals and stochastic-rounding salts; it is fragile where the order of calls changes between steps
(DDP rebuilds its buckets after step 0: use :mod:`ccoll.ddp`'s hook, which keys by parameter, instead of
patching DDP's hooks). Keys hold group ranks, not object ids, so :meth:`State.state_dict` loads in a
fresh process.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

import torch.distributed as dist

from ..callctx import stable_salt
from ..errors import PolicyError
from .. import auto as _auto, report as _report  # zero code: DDP/FSDP2 hooks, user lines
from ..log import warn_once
from ..policy import Policy


class State:
    """Everything one installation decides with; replaced as a whole, read once per call."""

    def __init__(self, policy: Policy, resolver: Callable | None, step_counter: str):
        self.policy = policy
        self.resolver = resolver
        self.step_counter = step_counter
        self.steps = 0
        self.training_steps = _TrainingSteps()  # which optimizer steps begin a training step
        self.checked = False  # fingerprint compared across ranks
        self.lock = threading.Lock()
        self.ordinals: dict[tuple, int] = {}  # (dim, op, group ranks) -> compressed calls since last step
        # calls per step, learned at the first step: a step the optimizer skips (fp16 overflow) does not
        # reset the ordinals, so the next step's calls are numbered on; modulo the period they map back
        # to the same residuals instead of leaking a new set per skipped step
        self.periods: dict[tuple, int] = {}
        from ..feedback import ErrorFeedback

        self.feedback = ErrorFeedback()
        self._wdelta = None  # ccoll.wdelta.WeightDelta, made at the first weight-delta all_gather

    @property
    def wdelta(self):
        """Reconstructions of weight-delta all-gathers (``weight_delta:`` rules), keyed by call key."""
        if self._wdelta is None:
            from ..wdelta import WeightDelta

            with self.lock:
                if self._wdelta is None:
                    self._wdelta = WeightDelta()
        return self._wdelta

    def call_key(self, dim: str, op: str, group: Any) -> tuple:
        """The logical name of this call: ``(dim, op, group ranks, n-th call of the step)``."""
        known = None if group is None else _group_keys.get(id(group))  # group_key's first lines, inline
        k = (dim, op, known[1] if known is not None and known[0]() is group else group_key(group))
        with self.lock:
            n = self.ordinals.get(k, 0)
            self.ordinals[k] = n + 1
            period = self.periods.get(k)
        if period:
            n %= period
        elif n == 10_000:
            warn_once("ccoll-ef-no-steps", "ccoll: 10000 compressed calls on %s/%s without an optimizer step "
                      "(one error-feedback residual each); with step_counter='manual', call ccoll.patch.step() "
                      "once per step", dim, op)
        return k + (n,)

    ef_key = call_key

    def salt(self, key: tuple) -> int:
        """Stochastic-rounding salt of one call: from (step, call key); the collectives mix in the rank."""
        return stable_salt(self.steps, key)

    def advance(self) -> None:
        with self.lock:
            self.steps += 1
            for k, n in self.ordinals.items():
                self.periods.setdefault(k, n)
            self.ordinals.clear()

    def state_dict(self) -> dict:
        with self.lock:
            state = {"version": 1, "steps": self.steps, "ordinals": list(self.ordinals.items()),
                     "periods": list(self.periods.items()), "feedback": self.feedback.state_dict()}
        if self._wdelta is not None:
            state["weight_delta"] = self._wdelta.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != 1:
            raise PolicyError(f"ccoll.patch.load_state_dict: unknown state version {state.get('version')!r}")
        from ..feedback import _tuplify

        with self.lock:
            self.steps = int(state["steps"])
            self.ordinals = {_tuplify(k): int(n) for k, n in state["ordinals"]}
            self.periods = {_tuplify(k): int(n) for k, n in state["periods"]}
        self.feedback.load_state_dict(state["feedback"])
        # without saved reconstructions every weight-delta call site starts with an exact refresh
        if "weight_delta" in state:
            self.wdelta.load_state_dict(state["weight_delta"])
        elif self._wdelta is not None:
            self._wdelta.reset()


class Installed:
    """The process's one installation slot (what ``install`` replaces and every wrapper reads)."""

    def __init__(self) -> None:
        self.current: State | None = None  # None: not installed, every wrapper passes through
        self.lock = threading.RLock()  # serialises install / uninstall
        self.originals: dict[str, Callable] = {}  # torch.distributed name -> torch's function
        self.wrappers: dict[str, Callable] = {}  # torch.distributed name -> ccoll's wrapper
        self.step_hook: Any = None  # the optimizer post-step hook's handle (step_counter="optimizer")


#: read by every wrapper on every call (``SLOT.current``)
SLOT = Installed()

#: id(group) -> (weak reference, key): one dict read per compressed call (a WeakKeyDictionary read builds a
#: weak reference each time); the reference proves the entry is this group's, not a dead one's whose address
#: was reused
_group_keys: dict[int, tuple[Any, Any]] = {}


def group_key(group: Any) -> Any:
    """A name for ``group`` that is the same in every process of a run: its global ranks ("world" for
    the default group)."""
    if group is None:
        return "world"
    entry = _group_keys.get(id(group))
    if entry is not None and entry[0]() is group:
        return entry[1]
    c10d = dist.distributed_c10d
    if group is c10d.GroupMember.WORLD or (c10d.is_initialized() and group is c10d._get_default_group()):
        key: Any = "world"
    else:
        try:
            key = tuple(c10d.get_process_group_ranks(group))
        except Exception:  # noqa: BLE001 - not a torch group (e.g. an mpi4py communicator)
            key = type(group).__name__
    try:
        _group_keys[id(group)] = (weakref.ref(group), key)
    except TypeError:  # not weak-referenceable: computed each time
        pass
    return key


def _installed(what: str, hint: str = "") -> State:
    st = SLOT.current
    if st is None:
        raise PolicyError(f"ccoll.patch.{what}: the patch is not installed{hint}")
    return st


# --- public API: steps and resumable state -----------------------------------------------------------------
class _TrainingSteps:
    """Which optimizer steps begin a training step (``step_counter="optimizer"``).

    Why not one count per ``Optimizer.step()``: frameworks step one torch optimizer several times per
    training step. DeepSpeed ZeRO-1/2/3 steps its inner optimizer once per parameter group, with
    ``param_groups`` narrowed to that group (``stage_1_and_2.py`` ``_optimizer_step(i)``), so a Hugging Face
    Trainer run with its two groups (decay / no decay) counted every step twice. The rule: a training step
    is a pass over the parameters; an optimizer step whose parameter groups include one that already
    stepped in the current training step begins the next one, and a step of groups not yet stepped
    (another group of the same pass, or a second optimizer over other parameters) belongs to the current
    one. A group is named by its first parameter's id: one set lookup per group, whatever the model size.
    """

    def __init__(self) -> None:
        self.stepped: set[int] = set()

    def begins_step(self, optimizer: Any) -> bool:
        groups = {id(g["params"][0]) for g in getattr(optimizer, "param_groups", ()) if g.get("params")}
        if not self.stepped or not groups or not groups.isdisjoint(self.stepped):
            self.stepped = groups
            return True
        self.stepped |= groups
        return False


def advance(optimizer: Any = None) -> None:
    """The optimizer post-step hook (``step_counter="optimizer"``): counts a step when ``optimizer``'s step
    begins a training step (:class:`_TrainingSteps`)."""
    st = SLOT.current
    if st is not None and (optimizer is None or st.training_steps.begins_step(optimizer)):
        st.advance()
        _report.on_step(st)  # per-dimension line once compressing; the "nothing compressed" warning


def step() -> None:
    """Count one optimizer step (with ``step_counter="manual"``; with the default counter, steps are
    counted by the optimizer hook and calling this as well would count twice)."""
    st = _installed("step")
    if st.step_counter != "manual":
        raise PolicyError("ccoll.patch.step: steps are counted by the optimizer hook; "
                          "install(..., step_counter='manual') to count them yourself")
    st.advance()
    _report.on_step(st)


def steps() -> int:
    """Optimizer steps counted since install (0 when not installed)."""
    st = SLOT.current
    return 0 if st is None else st.steps


def state_dict() -> dict:
    """What a resumed run needs to continue bit-identically: the step count, the per-step call
    numbering (error-feedback keys and stochastic-rounding salts derive from it) and the
    error-feedback residuals (on CPU). Save it with the model and optimizer (``torch.save``); call
    :func:`load_state_dict` after ``install`` in the resumed process."""
    state = _installed("state_dict").state_dict()
    state["auto"] = _auto.state_dict()  # error feedback of the DDP / FSDP2 models ccoll attached to
    return state


def load_state_dict(state: dict) -> None:
    """Restore :func:`state_dict`'s output into the current installation."""
    _installed("load_state_dict", "; install it first").load_state_dict(state)
    _auto.load_state_dict(state.get("auto") or {})
