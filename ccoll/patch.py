"""Drop-in integration: route torch.distributed collectives and p2p calls through ccoll by policy.

``install(policy, resolver)`` replaces these ``torch.distributed`` attributes (old and new names in
torch 2.13) with wrappers:

    all_reduce                                                    -> op "all_reduce"
    all_gather_into_tensor, all_gather_single, _all_gather_base   -> op "all_gather"
    reduce_scatter_tensor, reduce_scatter_single, _reduce_scatter_base -> op "reduce_scatter"
    broadcast -> "broadcast"; all_to_all_single -> "all_to_all";
    send, recv, isend, irecv, batch_isend_irecv                   -> "send_recv"

GPT-NeoX's mpu and DeepSpeed's ``deepspeed.comm`` look these attributes up at call time, except the two
functions DeepSpeed's TorchBackend caches at construction (``all_gather_function``,
``reduce_scatter_function``) and the ones Megatron(-core) modules bind at import
(``dist_all_gather_func``, ``dist_reduce_scatter_func``): those are rebound at install and uninstall; a
backend built or a module imported while the patch is installed picks the wrappers up by itself.

Per call: resolver(group, op) -> dimension (None: not ours -> the original, untouched; by default the
automatic resolver, :class:`ccoll.resolvers.AutoResolver`, which never answers None); the policy
gives a codec or None from (dim, op, shape, dtype, step); reduce ops other than SUM/AVG, uneven
all_to_all splits and any-source recv stay native. Native calls on a resolved dimension are
recorded in ``ccoll.stats()`` as codec "native" so users see all traffic; compressed calls go to
``ccoll.collectives`` under ``ccoll.stats.dimension(dim)``, with a thread-local guard so any
torch.distributed call made while ccoll handles a call goes straight to the original.

Policy v2 rule keys: ``transport: mpi`` sends the (dim, op)'s calls, compressed or not, through an MPI
communicator over the group's ranks (``ccoll.transports.mpi_comm_for``, built at the group's first such
call; reduce ops MPI does not have stay on torch, as every rank decides alike); ``hierarchy: node`` is
passed to the collectives as ``hierarchy="node"`` (all_reduce, reduce_scatter, all_gather; see
``ccoll.hierarchy``). Why mixing transports cannot deadlock: ``ccoll.policy``'s docstring.

Calls the patch does not compress reach the original with the same arguments and return its result.
After ``uninstall()`` (or if someone captured a wrapper before), wrappers are plain pass-throughs.

Policy fingerprints are compared across ranks through the default group's key-value store (no
collective, so no device and no ordering constraint): at install when torch.distributed is initialised,
otherwise right after ``torch.distributed.init_process_group`` (wrapped while installed), or at the first
handled call as a last resort. Ranks that disagree raise PolicyError naming the ranks on every rank; a
rank that never installs makes the others fail after ``CCOLL_FINGERPRINT_TIMEOUT_S`` (default 120 s).

Steps (for ``warmup_steps``): by default every ``torch.optim.Optimizer.step()`` in the process counts
one (a global post-step hook); ``install(..., step_counter="manual")`` counts only ``ccoll.patch.step()``
calls. The step count also delimits call keys: the n-th compressed call of a (dim, op, group) within
a step is the same logical tensor as the n-th one of the previous step (DeepSpeed reduces its gradient
buckets in the same order every step); error-feedback residuals are keyed by it and stochastic-rounding
salts derive from (step, call key, rank), so ``state_dict()`` / ``load_state_dict()`` resume a run
bit-identically. A rule with ``weight_delta:`` sends the all_gather's encoded change against a
reconstruction ccoll keeps per call key (:mod:`ccoll.wdelta`); ``state_dict()`` carries those
reconstructions too (a state without them makes the next gather of each call key an exact refresh). DDP reorders its buckets after step 0, so for DDP use ``ccoll.ddp.compress_hook``
(keys by parameter) rather than the patch under torch's own hooks.

Batched point-to-point: ``isend``, ``irecv`` and ``batch_isend_irecv`` are replaced in both
``torch.distributed`` and ``torch.distributed.distributed_c10d`` (torch's ``P2POp`` checks its op
against the latter by identity), so ``P2POp(dist.isend, ...)`` works (Megatron, torch.distributed.
pipelining); a ``dist.isend`` captured before ``install`` is rejected by ``P2POp`` as torch rejects any
other function (P2POps built before ``install`` still batch). Compressed async calls return handles
shaped like torch's ``Work`` (``wait(timeout=)``, ``is_completed()``, ``get_future()`` valued with the
output tensors), so torch's DDP ``default_hooks`` run unchanged while the patch compresses.
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from . import auto as _auto, capture as _capture, report as _report  # zero code: DDP/FSDP2 hooks, user lines
from .errors import PolicyError
from .log import logger, warn_once
from .policy import Policy, load as _load_policy
from .stats import add_flusher, dimension, record

__all__ = ["install", "uninstall", "installed", "is_installed", "current_policy", "set_resolver", "step",
           "steps", "state_dict", "load_state_dict", "WRAPPED"]

_SUM = dist.ReduceOp.SUM
_AVG = dist.ReduceOp.AVG


class _Local(threading.local):
    busy = False  # this thread is inside a call ccoll handles: torch.distributed calls go to torch
    native: dict | None = None  # this thread's pass-through counters, see _native()


_local = _Local()


class _State:
    """Everything one installation decides with; replaced as a whole, read once per call.

    Call keys: the n-th compressed call of a (dim, op, group) within a step is one logical tensor,
    ``(dim, op, group ranks, n)``. This positional scheme is what a generic patch can know (DeepSpeed
    and Megatron reduce their gradient buckets in the same order every step) and it names
    error-feedback residuals and stochastic-rounding salts; it is fragile where the order of calls
    changes between steps (DDP rebuilds its buckets after step 0: use :mod:`ccoll.ddp`'s hook,
    which keys by parameter, instead of patching DDP's hooks). Keys hold group ranks, not object ids,
    so :meth:`state_dict` loads in a fresh process."""

    def __init__(self, policy: Policy, resolver: Callable | None, step_counter: str):
        self.policy = policy
        self.resolver = resolver
        self.step_counter = step_counter
        self.steps = 0
        self.checked = False  # fingerprint compared across ranks
        self.lock = threading.Lock()
        self.ordinals: dict[tuple, int] = {}  # (dim, op, group ranks) -> compressed calls since last step
        # calls per step, learned at the first step: a step the optimizer skips (fp16 overflow) does not
        # reset the ordinals, so the next step's calls are numbered on; modulo the period they map back
        # to the same residuals instead of leaking a new set per skipped step
        self.periods: dict[tuple, int] = {}
        from .feedback import ErrorFeedback

        self.feedback = ErrorFeedback()
        self._wdelta = None  # ccoll.wdelta.WeightDelta, made at the first weight-delta all_gather

    @property
    def wdelta(self):
        """Reconstructions of weight-delta all-gathers (``weight_delta:`` rules), keyed by call key."""
        if self._wdelta is None:
            from .wdelta import WeightDelta

            with self.lock:
                if self._wdelta is None:
                    self._wdelta = WeightDelta()
        return self._wdelta

    def call_key(self, dim: str, op: str, group: Any) -> tuple:
        """The logical name of this call: ``(dim, op, group ranks, n-th call of the step)``."""
        k = (dim, op, _group_key(group))
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
        from .feedback import _tuplify

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


_group_keys: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()


def _group_key(group: Any) -> Any:
    """A name for ``group`` that is the same in every process of a run: its global ranks ("world" for
    the default group)."""
    if group is None:
        return "world"
    try:
        return _group_keys[group]
    except (KeyError, TypeError):
        pass
    c10d = dist.distributed_c10d
    if group is c10d.GroupMember.WORLD or (c10d.is_initialized() and group is c10d._get_default_group()):
        key: Any = "world"
    else:
        try:
            key = tuple(c10d.get_process_group_ranks(group))
        except Exception:  # noqa: BLE001 - not a torch group (e.g. an mpi4py communicator)
            key = type(group).__name__
    try:
        _group_keys[group] = key
    except TypeError:
        pass
    return key


def stable_salt(step: int, key: Any) -> int:
    """A 63-bit salt from (step, key) that every process computes alike (Python's ``hash`` of strings
    is randomised per process, so it cannot be used)."""
    digest = hashlib.blake2b(repr((int(step), key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


_STATE: _State | None = None
_install_lock = threading.RLock()
_ORIGINALS: dict[str, Callable] = {}
_WRAPPERS: dict[str, Callable] = {}
_hook_handle: Any = None
_fingerprint_generation = 0

#: torch.distributed attribute -> policy op
WRAPPED = {
    "all_reduce": "all_reduce",
    "all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather", "_all_gather_base": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_single": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "broadcast": "broadcast",
    "all_to_all_single": "all_to_all",
    "send": "send_recv", "recv": "send_recv", "isend": "send_recv", "irecv": "send_recv",
    "batch_isend_irecv": "send_recv",
}

#: names also replaced in ``torch.distributed.distributed_c10d``: ``P2POp`` checks its op against
#: ``distributed_c10d.isend/irecv`` by identity and ``batch_isend_irecv`` picks the peer keyword by
#: identity, so ``P2POp(dist.isend, ...)`` needs the same object in both modules
C10D_TOO = ("isend", "irecv", "batch_isend_irecv")


# --- per-call helpers ---------------------------------------------------------------------------------
def _reduce_name(op: Any) -> str | None:
    if op is _SUM:  # the common case first: identity is ~20x cheaper than ReduceOp.__eq__
        return "sum"
    if op == _SUM:
        return "sum"
    if op == _AVG:
        return "avg"
    return None


# Pass-through calls on a resolved dimension are counted per thread without a lock, as
# {(dim, op, nbytes): [calls, seconds, calls_flushed, seconds_flushed]}; ccoll.stats() flushes the
# difference into the shared table before it reads it. Only the owning thread writes the first two
# fields and only the (serialised) flusher the last two, so no count is lost or counted twice. This
# keeps the per-call cost of counting at a few dict/list operations instead of a locked table update.
_native_tables: list[dict] = []
_native_lock = threading.Lock()


def _native(dim: str, op: str, nbytes: int, fn: Callable, *args) -> Any:
    t0 = time.perf_counter()
    result = fn(*args)
    _count_native(dim, op, nbytes, time.perf_counter() - t0)
    return result


def _count_native(dim: str, op: str, nbytes: int, dt: float) -> None:
    table = _local.native
    if table is None:
        table = _local.native = {}
        with _native_lock:
            _native_tables.append(table)
    key = (dim, op, nbytes)
    entry = table.get(key)
    if entry is None:
        entry = table[key] = [0, 0.0, 0, 0.0]
    entry[0] += 1
    entry[1] += dt


def _flush_native() -> None:
    with _native_lock:
        for table in _native_tables:
            for (dim, op, nbytes), entry in list(table.items()):
                calls, seconds = entry[0], entry[1]
                n = calls - entry[2]
                if n:
                    record(op, "native", nbytes * n, nbytes * n, seconds - entry[3], dim=dim, calls=n)
                    entry[2], entry[3] = calls, seconds


add_flusher(_flush_native)


class _DimHandle:
    """Async handle whose ``wait()`` (where ccoll decodes and records stats) runs under the call's
    dimension, so async traffic is attributed like sync traffic."""

    __slots__ = ("_handle", "_dim")

    def __init__(self, handle: Any, dim: str):
        self._handle = handle
        self._dim = dim

    def wait(self, timeout: Any = None) -> bool:
        with dimension(self._dim):
            return self._handle.wait(timeout)

    def is_completed(self) -> bool:
        return self._handle.is_completed()

    def get_future(self) -> "torch.futures.Future":
        return self._handle.get_future()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


def _async_result(h: Any, dim: str) -> Any:
    return None if h is None else _DimHandle(h, dim)


def _decide(st: _State, dim: str, op: str, tensor: torch.Tensor):
    """The codec for this call, or None: the policy's choice (``Policy.resolve``, whose passthrough
    rules are the collectives' one ``decide``). A native rule returns at once: most calls the patch
    sees are on native dimensions. The collectives get the rule's ``min_bytes`` with the codec, so
    they reach the same answer rather than being told to skip the check."""
    if _capture.active: _capture.sample(dim, op, tensor, st.steps)  # CCOLL_CAPTURE=DIR: see ccoll.capture
    if not st.policy.rule(dim, op).compresses:
        return None
    return st.policy.resolve(dim, op, tensor, step=st.steps)


def _mpi_comm(rule: Any, group: Any) -> Any:
    """The MPI communicator standing for ``group`` when the rule says ``transport: mpi``, else None.
    A function of the rule alone, so every member of the group picks the same transport (see
    ccoll.policy: why two transports in one job cannot deadlock)."""
    if rule.transport != "mpi":
        return None
    from .transports import mpi_comm_for

    return mpi_comm_for(group)


def _native_mpi(dim: str, op: str, nbytes: int, comm: Any, method: str, *args) -> Any:
    """An uncompressed call through the MPI transport (``transport: mpi``), counted like ``_native``."""
    from .transports import for_group

    return _native(dim, op, nbytes, getattr(for_group(comm), method), *args)


def _mpi_op(op: Any) -> str | None:
    """The MPI transport's name for a torch reduce op, or None (e.g. bitwise ops: kept on torch, which
    every rank decides alike since they all pass the same op)."""
    from .transports import op_name

    try:
        return op_name(op)
    except Exception:  # TransportError: an op the transports do not reduce
        return None


def _hier(rule: Any) -> dict:
    """``hierarchy=`` for the three collectives that have a hierarchical form, only when the rule sets it."""
    return {} if rule.hierarchy is None else {"hierarchy": rule.hierarchy}


def _enter(st: _State) -> None:
    if not st.checked:
        _check_fingerprint(st)
    _local.busy = True


@contextlib.contextmanager
def internal() -> Iterator[None]:
    """Run ccoll's own communication (the DDP / FSDP hooks) with the wrappers passing straight to
    torch, as inside a call the patch handles: the transports' byte traffic is not a user call."""
    was = _local.busy
    _local.busy = True
    try:
        yield
    finally:
        _local.busy = was


def _collectives():
    from . import collectives

    return collectives


# --- wrappers (signatures mirror torch 2.13 so keyword callers keep working) ----------------------------
def _make_all_reduce(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def all_reduce(tensor, op=_SUM, group=None, async_op=False):
        st = _STATE
        if st is None or _local.busy:
            return orig(tensor, op, group, async_op)
        r = st.resolver
        dim = "default" if r is None else r(group, "all_reduce")
        if dim is None:
            return orig(tensor, op, group, async_op)
        red = _reduce_name(op)
        codec = _decide(st, dim, "all_reduce", tensor) if red else None
        rule = st.policy.rule(dim, "all_reduce")
        comm = _mpi_comm(rule, group)
        if codec is None:
            nbytes = tensor.numel() * tensor.element_size()
            mop = _mpi_op(op) if comm is not None else None
            if mop is not None:
                return _native_mpi(dim, "all_reduce", nbytes, comm, "native_all_reduce", tensor, mop, async_op)
            return _native(dim, "all_reduce", nbytes, orig, tensor, op, group, async_op)
        _enter(st)
        try:
            with dimension(dim):
                ef = st.feedback if rule.error_feedback and codec.lossy else None
                key = st.call_key(dim, "all_reduce", group)
                fn = _collectives().all_reduce
                h = fn(tensor, op=red, group=group if comm is None else comm, codec=codec, async_op=async_op,
                       error_feedback=ef, key=key, min_bytes=rule.min_bytes, salt=st.salt(key), **_hier(rule))
        finally:
            _local.busy = False
        return _async_result(h, dim) if async_op else None

    return all_reduce


def _make_all_gather(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def all_gather(output_tensor, input_tensor, group=None, async_op=False):
        st = _STATE
        if st is None or _local.busy:
            return orig(output_tensor, input_tensor, group, async_op)
        r = st.resolver
        dim = "default" if r is None else r(group, "all_gather")
        if dim is None:
            return orig(output_tensor, input_tensor, group, async_op)
        codec = _decide(st, dim, "all_gather", input_tensor)
        rule = st.policy.rule(dim, "all_gather")
        comm = _mpi_comm(rule, group)
        if codec is None or output_tensor.dtype != input_tensor.dtype:
            nbytes = input_tensor.numel() * input_tensor.element_size()
            if comm is not None:
                return _native_mpi(dim, "all_gather", nbytes, comm, "native_all_gather", output_tensor, input_tensor,
                                   async_op)
            return _native(dim, "all_gather", nbytes, orig, output_tensor, input_tensor, group, async_op)
        _enter(st)
        try:
            with dimension(dim):
                key = st.call_key(dim, "all_gather", group)
                if rule.weight_delta:  # weight_delta: send encoded changes against ccoll's reconstruction
                    h = st.wdelta.all_gather_into_tensor(output_tensor, input_tensor, group=group if comm is None else comm,
                                                         codec=codec, async_op=async_op, key=key, step=st.steps,
                                                         refresh_steps=rule.weight_delta, min_bytes=rule.min_bytes, salt=st.salt(key))
                else:
                    fn = _collectives().all_gather_into_tensor
                    h = fn(output_tensor, input_tensor, group=group if comm is None else comm, codec=codec,
                           async_op=async_op, min_bytes=rule.min_bytes, salt=st.salt(key), **_hier(rule))
        finally:
            _local.busy = False
        return _async_result(h, dim) if async_op else None

    return all_gather


def _make_reduce_scatter(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def reduce_scatter(output, input, op=_SUM, group=None, async_op=False):
        st = _STATE
        if st is None or _local.busy:
            return orig(output, input, op, group, async_op)
        r = st.resolver
        dim = "default" if r is None else r(group, "reduce_scatter")
        if dim is None:
            return orig(output, input, op, group, async_op)
        red = _reduce_name(op)
        codec = _decide(st, dim, "reduce_scatter", input) if red else None
        rule = st.policy.rule(dim, "reduce_scatter")
        comm = _mpi_comm(rule, group)
        if codec is None or output.dtype != input.dtype:
            nbytes = input.numel() * input.element_size()
            mop = _mpi_op(op) if comm is not None else None
            if mop is not None:
                return _native_mpi(dim, "reduce_scatter", nbytes, comm, "native_reduce_scatter", output, input, mop,
                                   async_op)
            return _native(dim, "reduce_scatter", nbytes, orig, output, input, op, group, async_op)
        _enter(st)
        try:
            with dimension(dim):
                ef = st.feedback if rule.error_feedback and codec.lossy else None
                key = st.call_key(dim, "reduce_scatter", group)
                fn = _collectives().reduce_scatter_tensor
                h = fn(output, input, op=red, group=group if comm is None else comm, codec=codec, async_op=async_op,
                       error_feedback=ef, key=key, min_bytes=rule.min_bytes, salt=st.salt(key), **_hier(rule))
        finally:
            _local.busy = False
        return _async_result(h, dim) if async_op else None

    return reduce_scatter


def _make_broadcast(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
        st = _STATE
        if st is None or _local.busy:
            return orig(tensor, src, group, async_op, group_src)
        r = st.resolver
        dim = "default" if r is None else r(group, "broadcast")
        if dim is None:
            return orig(tensor, src, group, async_op, group_src)
        codec = _decide(st, dim, "broadcast", tensor)
        comm = _mpi_comm(st.policy.rule(dim, "broadcast"), group)
        if codec is None and comm is None:
            return _native(dim, "broadcast", tensor.numel() * tensor.element_size(), orig,
                           tensor, src, group, async_op, group_src)
        if src is None:
            src = dist.get_global_rank(group if group is not None else dist.group.WORLD, group_src)
        if codec is None:
            from .transports import for_group

            root = for_group(comm).group_rank(src)  # transports take group ranks
            return _native_mpi(dim, "broadcast", tensor.numel() * tensor.element_size(), comm, "native_broadcast",
                               tensor, root, async_op)
        _enter(st)
        try:
            with dimension(dim):
                fn = _collectives().broadcast
                h = fn(tensor, src, group=group if comm is None else comm, codec=codec, async_op=async_op,
                       min_bytes=st.policy.rule(dim, "broadcast").min_bytes, salt=st.salt(st.call_key(dim, "broadcast", group)))
        finally:
            _local.busy = False
        return _async_result(h, dim) if async_op else None

    return broadcast


def _make_all_to_all_single(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                          async_op=False):
        st = _STATE
        if st is None or _local.busy:
            return orig(output, input, output_split_sizes, input_split_sizes, group, async_op)
        r = st.resolver
        dim = "default" if r is None else r(group, "all_to_all")
        if dim is None:
            return orig(output, input, output_split_sizes, input_split_sizes, group, async_op)
        even = output_split_sizes is None and input_split_sizes is None and output.dtype == input.dtype
        codec = _decide(st, dim, "all_to_all", input) if even else None
        comm = _mpi_comm(st.policy.rule(dim, "all_to_all"), group)
        if codec is None:
            nbytes = input.numel() * input.element_size()
            if comm is not None:
                return _native_mpi(dim, "all_to_all", nbytes, comm, "native_all_to_all", output, input,
                                   output_split_sizes, input_split_sizes, async_op)
            return _native(dim, "all_to_all", nbytes, orig,
                           output, input, output_split_sizes, input_split_sizes, group, async_op)
        _enter(st)
        try:
            with dimension(dim):
                fn = _collectives().all_to_all_single
                h = fn(output, input, group=group if comm is None else comm, codec=codec, async_op=async_op,
                       min_bytes=st.policy.rule(dim, "all_to_all").min_bytes, salt=st.salt(st.call_key(dim, "all_to_all", group)))
        finally:
            _local.busy = False
        return _async_result(h, dim) if async_op else None

    return all_to_all_single


def _peer(group: Any, peer: int | None, group_peer: int | None) -> int:
    if peer is not None:
        return peer
    return dist.get_global_rank(group if group is not None else dist.group.WORLD, group_peer)


def _make_p2p(orig: Callable, name: str) -> Callable:
    """send / recv / isend / irecv: both sides decide from (dim, shape, dtype, step) only."""
    sending = name in ("send", "isend")
    is_async = name in ("isend", "irecv")
    stat_op = "send" if sending else "recv"  # the op names ccoll.collectives records

    def to_torch(*args):
        """torch's send/recv call its isend/irecv, which are ccoll's too: they must not decide (and
        count) the same call a second time."""
        if is_async:
            return orig(*args)
        _local.busy = True
        try:
            return orig(*args)
        finally:
            _local.busy = False

    def p2p(tensor, peer=None, group=None, tag=0, group_peer=None):
        st = _STATE
        if st is None or _local.busy:
            return orig(tensor, peer, group, tag, group_peer)
        r = st.resolver
        dim = "default" if r is None else r(group, "send_recv")
        if dim is None:
            return to_torch(tensor, peer, group, tag, group_peer)
        # an any-source recv cannot be decoded: the sender's decision is known, its rank is not
        known = peer is not None or group_peer is not None
        codec = _decide(st, dim, "send_recv", tensor) if known else None
        if codec is None:
            return _native(dim, stat_op, tensor.numel() * tensor.element_size(), to_torch,
                           tensor, peer, group, tag, group_peer)
        global_peer = _peer(group, peer, group_peer)
        _enter(st)
        try:
            with dimension(dim):
                salt = st.salt(st.call_key(dim, stat_op, group))  # decoding needs none: receivers take no salt
                extra = {"salt": salt} if sending else {}
                h = getattr(_collectives(), name)(tensor, global_peer, group=group, codec=codec, tag=tag,
                                                  min_bytes=st.policy.rule(dim, "send_recv").min_bytes, **extra)
        finally:
            _local.busy = False
        if is_async:
            return _async_result(h, dim)
        return None if sending else global_peer

    # keep torch's parameter names (dst/src, group_dst/group_src) for keyword callers
    peer_name, group_peer_name = ("dst", "group_dst") if sending else ("src", "group_src")
    code = (f"def {name}(tensor, {peer_name}=None, group=None, tag=0, {group_peer_name}=None):\n"
            f"    return _p2p(tensor, {peer_name}, group, tag, {group_peer_name})\n")
    ns: dict = {"_p2p": p2p}
    exec(code, ns)  # noqa: S102 - fixed template, no user input
    return functools.wraps(orig)(ns[name])


def _make_batch_isend_irecv(orig: Callable) -> Callable:
    """``batch_isend_irecv(ops)``: compressed ops travel as their payloads inside ONE call of torch's
    own ``batch_isend_irecv`` (so a backend that coalesces, NCCL, still gets one group and its
    deadlock freedom); each returned handle waits for the whole batch, then decodes its receive."""

    @functools.wraps(orig)
    def batch_isend_irecv(p2p_op_list):
        st = _STATE
        if st is None or _local.busy or not isinstance(p2p_op_list, list) or not p2p_op_list:
            return orig(p2p_op_list)
        r = st.resolver
        send_fn, recv_fn = _WRAPPERS.get("isend"), _WRAPPERS.get("irecv")
        plans, stale = [], False
        for op in p2p_op_list:
            sending = op.op is send_fn or op.op is _ORIGINALS.get("isend")
            stale = stale or (op.op is not send_fn and op.op is not recv_fn)  # a P2POp built before install
            dim = "default" if r is None else r(op.group, "send_recv")
            codec = None if dim is None else _decide(st, dim, "send_recv", op.tensor)
            plans.append((op, sending, dim, codec))
        if not stale and all(codec is None for *_, codec in plans):
            return orig(p2p_op_list)  # each op runs through the isend/irecv wrappers: native, counted there
        _enter(st)
        t0 = time.perf_counter()
        try:
            rank = dist.get_rank()
            batch, finish = [], []
            for op, sending, dim, codec in plans:
                # the op torch sends: our isend/irecv (torch picks the peer keyword by identity with them;
                # busy, they go straight to torch) on the payload, or on the tensor itself when native
                carrier = object.__new__(type(op))  # P2POp.__new__ re-checks: copy the checked op as is
                carrier.__dict__.update(op.__dict__)
                carrier.op = send_fn if sending else recv_fn
                batch.append(carrier)
                if codec is None:
                    if dim is not None:
                        finish.append((None, op, sending, dim, None, None))
                    continue
                t = op.tensor
                nbytes = codec.encoded_nbytes(t.numel(), t.dtype)
                payload = torch.empty(1, nbytes, dtype=torch.uint8, device=t.device)
                if sending:
                    key = st.call_key(dim, "send", op.group)
                    flat = t.detach().reshape(-1)
                    codec.encode_rows(flat if flat.is_contiguous() else flat.contiguous(), payload, t.numel(),
                                      salt=stable_salt(st.steps, key + (rank,)))
                carrier.tensor = payload.view(-1)
                finish.append((codec, op, sending, dim, payload, nbytes))
            works = orig(batch)
        finally:
            _local.busy = False
        outputs = [op.tensor for op in p2p_op_list]

        def then() -> None:
            for codec, op, sending, dim, payload, nbytes in finish:
                t = op.tensor
                raw = t.numel() * t.element_size()
                if codec is None:
                    _count_native(dim, "send" if sending else "recv", raw, time.perf_counter() - t0)
                    continue
                if not sending:
                    codec.decode(payload.view(-1), t.numel(), t.dtype, out=t.detach())  # buffers may require grad
                record("send" if sending else "recv", codec.spec, raw, nbytes, time.perf_counter() - t0, dim=dim)

        from .transports import Handle

        done = Handle(works, then, outputs)  # decodes once, whichever op's handle is waited for first
        return [_DimHandle(Handle([done], None, [t]), dim or "default") for t, (_, _, dim, _) in zip(outputs, plans)]

    return batch_isend_irecv


_FACTORIES: dict[str, Callable[[Callable], Callable]] = {
    "batch_isend_irecv": _make_batch_isend_irecv,
    "all_reduce": _make_all_reduce,
    "all_gather_into_tensor": _make_all_gather, "all_gather_single": _make_all_gather,
    "_all_gather_base": _make_all_gather,
    "reduce_scatter_tensor": _make_reduce_scatter, "reduce_scatter_single": _make_reduce_scatter,
    "_reduce_scatter_base": _make_reduce_scatter,
    "broadcast": _make_broadcast,
    "all_to_all_single": _make_all_to_all_single,
    "send": lambda f: _make_p2p(f, "send"), "recv": lambda f: _make_p2p(f, "recv"),
    "isend": lambda f: _make_p2p(f, "isend"), "irecv": lambda f: _make_p2p(f, "irecv"),
}


def _make_init_process_group(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def init_process_group(*args, **kwargs):
        result = orig(*args, **kwargs)
        st = _STATE
        if st is not None and not st.checked:
            _check_fingerprint(st)
        return result

    return init_process_group


# --- fingerprint check ----------------------------------------------------------------------------------
def _check_fingerprint(st: _State) -> None:
    """Every rank publishes its policy fingerprint in the default store and reads everyone's."""
    global _fingerprint_generation
    with st.lock:
        if st.checked:
            return
        st.checked = True
    if not (dist.is_available() and dist.is_initialized()):
        st.checked = False
        return
    world = dist.get_world_size()
    rank = dist.get_rank()
    if world == 1:
        return
    _fingerprint_generation += 1
    prefix = f"ccoll/policy/{_fingerprint_generation}/"
    mine = f"{st.policy.fingerprint()[:16]} {st.policy.source}"
    timeout_s = float(os.environ.get("CCOLL_FINGERPRINT_TIMEOUT_S", "120"))
    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - backends without a store (e.g. some MPI setups): use a collective
        store = None
    if store is not None:
        store.set(prefix + str(rank), mine)
        keys = [prefix + str(r) for r in range(world)]
        try:
            store.wait(keys, datetime.timedelta(seconds=timeout_s))
        except Exception:  # noqa: BLE001 - store timeouts raise backend-specific errors
            missing = [r for r in range(world) if not store.check([prefix + str(r)])]
            raise PolicyError(
                f"ccoll policy check: ranks {missing} did not publish a policy fingerprint within {timeout_s:.0f} s; "
                f"install ccoll.patch with the same policy on every rank (this rank: {st.policy.source})"
            ) from None
        theirs = [store.get(k).decode() for k in keys]
    else:
        theirs = [None] * world
        dist.distributed_c10d.all_gather_object(theirs, mine)
    if len(set(theirs)) > 1:
        by_fp: dict[str, list[int]] = {}
        for r, v in enumerate(theirs):
            by_fp.setdefault(v, []).append(r)
        detail = "; ".join(f"ranks {rs}: {v.split(' ', 1)[0]} ({v.split(' ', 1)[1]})" for v, rs in by_fp.items())
        raise PolicyError(f"ccoll policy mismatch across ranks (rank {rank} has {mine.split(' ', 1)[0]}): {detail}")
    logger.debug("ccoll policy %s agreed on %d ranks", mine, world)


# --- functions frameworks cached at import or init -----------------------------------------------------------
#: module-level names Megatron(-core) binds to torch.distributed functions at import
#: (tensor_parallel/mappings.py, distributed/param_and_grad_buffer.py, ...)
MEGATRON_CACHED = ("dist_all_gather_func", "dist_reduce_scatter_func")


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


# --- public API -----------------------------------------------------------------------------------------
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
    global _STATE, _hook_handle
    if step_counter not in ("optimizer", "manual"):
        raise PolicyError(f"step_counter must be 'optimizer' or 'manual', got {step_counter!r}")
    pol = _load_policy(policy)
    if resolver is None:
        from .resolvers import AutoResolver

        resolver = AutoResolver()
    with _install_lock:
        if not _ORIGINALS:
            for name in list(WRAPPED) + ["init_process_group"]:
                orig = getattr(dist, name, None)
                if orig is None:
                    continue
                factory = _FACTORIES.get(name, _make_init_process_group)
                _ORIGINALS[name] = orig
                _WRAPPERS[name] = factory(orig)
                # what ccoll's own transports call, so moving ccoll's payloads never re-enters the patch
                _WRAPPERS[name].__ccoll_original__ = orig
                _bind(name, _WRAPPERS[name])
            _rebind_cached(_ORIGINALS, _WRAPPERS)
            from .resolvers import track_device_meshes

            track_device_meshes(True)
        st = _State(pol, resolver, step_counter)
        if _STATE is not None:
            st.steps = _STATE.steps
        _STATE = st
        if _hook_handle is not None:
            _hook_handle.remove()
            _hook_handle = None
        if step_counter == "optimizer":
            from torch.optim.optimizer import register_optimizer_step_post_hook

            _hook_handle = register_optimizer_step_post_hook(lambda *_: _advance())
        _auto.install(pol)  # zero code: attach to DDP / FSDP2 models built from now on
        _report.on_install(st)
    logger.info("ccoll patch installed: %s\n%s", pol, pol.describe())
    if dist.is_available() and dist.is_initialized():
        _check_fingerprint(st)
    return pol


def uninstall() -> None:
    """Restore the original torch.distributed functions (and DeepSpeed's cached ones). Idempotent."""
    global _STATE, _hook_handle
    with _install_lock:
        _STATE = None
        _auto.uninstall()  # zero code: models built from now on are left alone
        if _hook_handle is not None:
            _hook_handle.remove()
            _hook_handle = None
        if not _ORIGINALS:
            return
        _rebind_cached(_WRAPPERS, _ORIGINALS)
        from .resolvers import track_device_meshes

        track_device_meshes(False)
        for name, orig in _ORIGINALS.items():
            if getattr(dist, name, None) is _WRAPPERS[name]:
                _bind(name, orig)
            else:  # someone wrapped on top of us: leave theirs; ours is now a plain pass-through
                warn_once(f"ccoll-uninstall-{name}", "ccoll: torch.distributed.%s was replaced after ccoll "
                          "installed; leaving it (ccoll's wrapper below it now passes through)", name)
        _ORIGINALS.clear()
        _WRAPPERS.clear()


@contextlib.contextmanager
def installed(policy: "Policy | str | os.PathLike[str]", resolver: Callable | None = None, *,
              step_counter: str = "optimizer") -> Iterator[Policy]:
    """``with installed(policy, resolver): ...`` — install for the block, then restore what was before."""
    previous = _STATE
    pol = install(policy, resolver, step_counter=step_counter)
    try:
        yield pol
    finally:
        if previous is None:
            uninstall()
        else:
            install(previous.policy, previous.resolver, step_counter=previous.step_counter)


def is_installed() -> bool:
    return _STATE is not None


def current_policy() -> Policy | None:
    st = _STATE
    return None if st is None else st.policy


def set_resolver(resolver: Callable | None) -> None:
    """Attach a resolver to the current installation (e.g. once a framework's groups exist); None: a
    new automatic resolver."""
    st = _STATE
    if st is None:
        raise PolicyError("ccoll.patch.set_resolver: the patch is not installed")
    if resolver is None:
        from .resolvers import AutoResolver

        resolver = AutoResolver()
    st.resolver = resolver


def _advance() -> None:
    st = _STATE
    if st is not None:
        st.advance()
        _report.on_step(st)  # per-dimension line once compressing; the "nothing compressed" warning


def step() -> None:
    """Count one optimizer step (with ``step_counter="manual"``; with the default counter, steps are
    counted by the optimizer hook and calling this as well would count twice)."""
    st = _STATE
    if st is None:
        raise PolicyError("ccoll.patch.step: the patch is not installed")
    if st.step_counter != "manual":
        raise PolicyError("ccoll.patch.step: steps are counted by the optimizer hook; "
                          "install(..., step_counter='manual') to count them yourself")
    st.advance()
    _report.on_step(st)


def steps() -> int:
    """Optimizer steps counted since install (0 when not installed)."""
    st = _STATE
    return 0 if st is None else st.steps


def state_dict() -> dict:
    """What a resumed run needs to continue bit-identically: the step count, the per-step call
    numbering (error-feedback keys and stochastic-rounding salts derive from it) and the
    error-feedback residuals (on CPU). Save it with the model and optimizer (``torch.save``); call
    :func:`load_state_dict` after ``install`` in the resumed process."""
    st = _STATE
    if st is None:
        raise PolicyError("ccoll.patch.state_dict: the patch is not installed")
    state = st.state_dict()
    state["auto"] = _auto.state_dict()  # error feedback of the DDP / FSDP2 models ccoll attached to
    return state


def load_state_dict(state: dict) -> None:
    """Restore :func:`state_dict`'s output into the current installation."""
    st = _STATE
    if st is None:
        raise PolicyError("ccoll.patch.load_state_dict: the patch is not installed; install it first")
    st.load_state_dict(state)
    _auto.load_state_dict(state.get("auto") or {})
