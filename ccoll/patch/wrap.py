"""The one wrapper shape, and the table of torch.distributed functions it wraps.

Every wrapped function runs the same shape (:func:`shape`):

    prologue   not installed / inside ccoll -> torch; resolver(group, op) -> dim (None: torch, untouched)
    short      (dim, op) in ``Policy.passthrough`` (never compresses, torch's transport) -> torch, counted
    decide     :func:`decide`: the policy's codec for (dim, op, tensor, step), or None
    native     no codec -> torch's function (or the MPI transport for ``transport: mpi``), counted
    compress   the row's ``collective``: the one place that calls ``ccoll.collectives``
    epilogue   busy flag cleared; async handles answer under the call's dimension

A :class:`Row` says what differs per function: its torch 2.13 signature (so keyword callers keep
working) and which of its parameters are the tensor, group, reduce op and async flag; what may be
compressed at all (any reduce op but SUM/AVG, uneven all_to_all splits and mixed dtypes stay native;
an any-source recv decides like its sender: :mod:`ccoll.patch.anysource`); the MPI transport's native
call; and the collective. ``batch_isend_irecv`` has its own shape (:mod:`ccoll.patch.batch`).

Rows with ``exact`` set (list forms, rooted, object and barrier calls) never decide: the same shape
resolves their dimension, runs torch's function and counts it as native (``size`` says the bytes).
Every public torch.distributed function and ccoll's verdict on it: docs/TORCH_CONTRACTS.md (a unit test
keeps it equal to these rows).
"""
from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch
import torch.distributed as dist

from .. import capture as _capture, collectives as _coll
from ..callctx import Call as _CallCtx, local as _local, set_current, reduce_name
from ..stats import enter_dimension, leave_dimension
from ..streams import NO_OP
from ..transports import mpi_comm_for
from . import anysource, events as _events, fingerprint, native
from .handles import async_result
from .state import SLOT, State

_SUM = dist.ReduceOp.SUM
c10d = dist.distributed_c10d
#: ``Compressed(...)`` without the named tuple's Python ``__new__`` frame (one per compressed call)
_new_call = tuple.__new__


class Compressed(NamedTuple):
    """What the prologue worked out for a call the patch compresses; a row's ``collective`` reads it."""

    st: State
    dim: str
    rule: Any  # the policy rule of (dim, op)
    codec: Any
    group: Any  # what the collectives get as group: the torch group, or the MPI communicator
    key: tuple  # the call key (State.call_key)
    salt: int  # the stochastic-rounding salt of the call key
    ef: Any  # the ErrorFeedback for reducing rules with error feedback and a lossy codec, else None
    red: str | None  # "sum" / "avg" for reducing ops


@dataclass(frozen=True)
class Row:
    """One wrapped torch.distributed function (see the module docstring)."""

    op: str  # the policy op
    params: str  # torch 2.13's parameter list
    collective: Callable  # (Compressed, *torch args) -> the async handle, or the sync call's return value
    tensor: str = "tensor"  # the parameter the decision and the byte count read
    group: str = "group"
    async_op: str = "async_op"  # a parameter name, or "True" / "False" for functions without one
    reduce: str | None = None  # the reduce-op parameter: only SUM / AVG compress
    compressible: Callable | None = None  # (*torch args) -> may compress at all (before deciding)
    same_dtype: bool = False  # the first two parameters (output, input) must agree in dtype to compress
    mpi: Callable | None = None  # (comm, *torch args) -> (transport method, args) or None; None: no MPI path
    stat_op: str | None = None  # the op native calls and call keys are named by (default: op)
    reenters: bool = False  # torch's function calls another wrapped one (send -> isend): run it busy
    returns: bool = False  # a sync compressed call returns what ``collective`` returned (recv: the peer)
    outputs: Callable | None = None  # (*torch args) -> what an async handle's result() returns; None: [args[0]]
    event: str = ""  # torch's dispatcher event for this call (a compressed call records it, and its backend's: events)
    event_of: Callable | None = None  # (*torch args) -> the dispatcher event, where the arguments pick it
    exact: str = ""  # why ccoll never compresses this function: the row only resolves, runs torch's and counts
    size: Callable | None = None  # (*torch args) -> bytes counted for a native call; None: the tensor's bytes


def decide(st: State, dim: str, op: str, tensor: torch.Tensor):
    """The codec for this call, or None: the policy's choice (``Policy.resolve``, whose passthrough
    rules are the collectives' one ``decide``). A native rule returns at once: most calls the patch
    sees are on native dimensions. The collectives get the rule's ``min_bytes`` with the codec, so
    they reach the same answer rather than being told to skip the check."""
    if _capture.state.active: _capture.sample(dim, op, tensor, st.steps)  # CCOLL_CAPTURE=DIR: see ccoll.capture
    return st.policy.resolve(dim, op, tensor, step=st.steps)  # its first test: the rule compresses at all


def enter(st: State) -> None:
    if not st.checked:
        fingerprint.check(st)
    _local.busy = True


def shape(row: Row, torch_fn: Callable) -> Callable:
    """The one wrapper shape, for one row: ``handle(st, tensor, group, async_op, reduce_op, args)`` with
    ``st`` the installation (the caller, :func:`make`'s wrapper, has already passed not-installed and
    busy calls to torch), ``args`` torch's arguments and the others read from them as the row says. (The
    row's fields are bound here once: the per-call path reads closure variables, not attributes.)

    Pass-through calls (an exact row, or a (dim, op) whose rule never compresses on torch's transport:
    ``Policy.passthrough``) take the short path: one set lookup, torch's call, counted (native.run's timing
    and count written out, with the busy flag set in place of the ``_busy`` wrapper: one frame less). Most
    calls the patch sees are such, and on small tensors every line here is a share of the call's host time
    (``tools/bench_patch_overhead.py`` measures it)."""
    op, stat_op, reduces, compressible = row.op, row.stat_op or row.op, row.reduce is not None, row.compressible
    same_dtype, mpi, collective, returns = row.same_dtype, row.mpi, row.collective, row.returns
    outputs = row.outputs or (lambda first, *_: [first])
    event, event_of, never, size, reenters = row.event, row.event_of, bool(row.exact), row.size, row.reenters
    sending = stat_op == "send" if row.stat_op is not None else None
    run_native, count, perf_counter, capture = native.run, native.count, time.perf_counter, _capture.state
    local = _local
    orig = torch_fn
    if reenters:
        torch_fn = _busy(torch_fn)  # the slow paths below call torch's function as they always did

    def handle(st: State, tensor: torch.Tensor, group: Any, async_op: bool, reduce_op: Any, args: tuple) -> Any:
        # prologue: not ours -> torch, untouched
        r = st.resolver
        dim = "default" if r is None else r(group, op)
        if dim is None:
            return torch_fn(*args)
        # pass-through: torch's function, counted
        if never or ((dim, op) in st.policy.passthrough and not capture.active):
            nbytes = tensor.numel() * tensor.element_size() if size is None else size(*args)  # not .nbytes: sparse tensors refuse it
            t0 = perf_counter()
            if reenters:  # torch's send calls the wrapped isend: busy, so it does not count the call again
                local.busy = True
                try:
                    result = orig(*args)
                finally:
                    local.busy = False
            else:
                result = orig(*args)
            count(dim, stat_op, nbytes, perf_counter() - t0)
            return result
        # decide
        red = None
        if reduces:
            red = "sum" if reduce_op is _SUM else reduce_name(reduce_op)  # torch's default op: no call
            codec = decide(st, dim, op, tensor) if red else None
        elif compressible is None or compressible(*args):
            if sending is not None and capture.active:  # capture samples only what this rank sends
                set_current(_CallCtx(dim, op, st.steps, sending))
            codec = decide(st, dim, op, tensor)
        else:
            codec = None
        if same_dtype and codec is not None and args[0].dtype != args[1].dtype:
            codec = None
        rule = st.policy.rule(dim, op) if mpi is not None or codec is not None else None
        # the MPI communicator standing for the group where the rule says ``transport: mpi``: a function of the rule
        # alone, so every member of the group picks the same transport (ccoll.policy: why two cannot deadlock)
        comm = mpi_comm_for(group) if mpi is not None and rule.transport == "mpi" else None
        # native: torch's function, or the MPI transport's uncompressed call; counted
        if codec is None:
            nbytes = tensor.numel() * tensor.element_size() if size is None else size(*args)  # not .nbytes: sparse tensors refuse it
            if comm is not None:
                via = mpi(comm, *args)
                if via is not None:
                    return run_native(dim, stat_op, nbytes, via[0], via[1])
            return run_native(dim, stat_op, nbytes, torch_fn, args)
        # compress: the row's collective, under the call's dimension, with torch calls passing through
        coalescing = _coalescing(group) if c10d._world._pg_coalesce_state else None
        ev, profiling = None, torch.autograd._profiler_enabled()  # the one check per call when nothing listens
        if not st.checked:  # enter(st), inline: one frame less per compressed call
            fingerprint.check(st)
        local.busy = True
        token = enter_dimension(dim)  # stats.dimension(dim), without a context manager's frames
        try:
            with (_profiled(event if event_of is None else event_of(*args), tensor, group)
                  if profiling else _NOT_PROFILED) as ev:
                ef = st.feedback if red and rule.error_feedback and codec.lossy else None
                key = st.call_key(dim, stat_op, group)
                # a deterministic codec ignores the salt (ccoll.collectives.salts: 0 and the real one alike), so
                # it is not derived (a hash of the call key: ~1 us)
                call = _new_call(Compressed, (st, dim, rule, codec, group if comm is None else comm, key,
                                              0 if codec.deterministic else st.salt(key), ef, red))
                if coalescing is None:
                    h = collective(call, *args)
                else:
                    h = _outside_coalescing(coalescing, collective, call, args)
        except BaseException:
            if ev is not None:
                ev.end()
            raise
        finally:
            leave_dimension(token)
            local.busy = False
        # epilogue
        if async_op and h is not None:
            return async_result(h, dim, outputs(*args), ev)  # its first wait() ends the event
        if ev is not None:
            ev.end()
        return h if returns else None

    return handle


def _coalescing(group: Any) -> "tuple[dict, Any] | None":
    """(torch's coalescing state, the group) when torch's ``_coalescing_manager`` is open on ``group``,
    else None. Megatron-core's DistributedDataParallel reduces its gradient buckets inside one
    (``param_and_grad_buffer.start_grad_sync``); there torch's all_reduce / all_gather_into_tensor /
    reduce_scatter_tensor only record themselves, to be issued together when the block ends."""
    state = dist.distributed_c10d._world._pg_coalesce_state  # the property's own field (the property: a frame)
    if not state:
        return None
    g = dist.distributed_c10d._get_default_group() if group is None else group
    return (state, g) if g in state else None


def _outside_coalescing(coalescing: tuple, collective: Callable, call: Compressed, args: tuple) -> Any:
    """A compressed call made inside torch's ``_coalescing_manager`` on its group: ccoll's own traffic on
    the group must really travel (recorded instead, it would never run: the wait finds no request), so
    the group's record is set aside for the call, which is also finished here (an async handle returned
    inside the block is ignored by its callers, who wait on the manager, which knows nothing of ccoll's
    call). Native calls in the same block are still recorded and issued at its end, on every rank alike."""
    state, g = coalescing
    recorded = state.pop(g)
    try:
        h = collective(call, *args)
        if h is not None and hasattr(h, "wait"):
            h.wait()
    finally:
        state[g] = recorded
    return h


@functools.lru_cache(maxsize=None)
def _names(params: str) -> list[str]:
    return [p.split("=")[0].strip() for p in params.split(",")]


#: what a compressed call enters when no profiler runs (reusable: it holds nothing; C no-ops, no frames)
_NOT_PROFILED = NO_OP


@contextlib.contextmanager
def _profiled(event: str, tensor: Any, group: Any):
    """While a profiler runs: torch's dispatcher event for the call, so a profile of a compressed run shows
    the same operation (its payload traffic records no torch events: events.py), and the backend's event of
    the caller's call, which the caller ends (an async call's at its first wait). Entered only when
    profiling: no generator on the hot path."""
    with torch.autograd.profiler.record_function(event):
        yield _events.begin(event, tensor, group)


def _busy(fn: Callable) -> Callable:
    """``fn`` run as inside a call ccoll handles: torch's send/recv call its isend/irecv, which are
    ccoll's too, and must not decide (and count) the same call a second time."""
    def run(*args):
        was = _local.busy
        _local.busy = True
        try:
            return fn(*args)
        finally:
            _local.busy = was

    return run


def make(name: str, orig: Callable) -> Callable:
    """The wrapper of ``orig`` (torch.distributed.<name>) by its row in :data:`ROWS`, with torch's signature.
    Its first lines pass a call straight to torch when nothing is installed or when the thread is inside
    a call ccoll handles (torch's send calling the wrapped isend, ccoll's own payload traffic): there the
    wrapper costs one function call and two attribute reads."""
    row = ROWS[name]
    names = ", ".join(_names(row.params))
    code = (f"def {name}({row.params}):\n"
            f"    st = _SLOT.current\n"
            f"    if st is None or _local.busy:\n"
            f"        return _torch({names})\n"
            f"    return _handle(st, {row.tensor}, {row.group}, {row.async_op}, {row.reduce}, ({names},))\n")
    ns: dict = {"_handle": shape(row, orig), "_torch": orig, "_SLOT": SLOT, "_local": _local, "_SUM": _SUM}
    exec(code, ns)  # noqa: S102 - fixed template over the rows below, no user input
    return functools.wraps(orig)(ns[name])


# --- the rows: what each wrapped function reads, and the collective it maps to ------------------------------
def _transport(comm: Any) -> Any:
    from ..transports import for_group

    return for_group(comm)


def _mpi_op(op: Any) -> str | None:
    """The MPI transport's name for a torch reduce op, or None (e.g. bitwise ops: kept on torch, which
    every rank decides alike since they all pass the same op)."""
    from ..transports import op_name

    try:
        return op_name(op)
    except Exception:  # TransportError: an op the transports do not reduce
        return None


def _all_reduce(c: Compressed, tensor, op, group, async_op):
    rule = c.rule
    return _coll.all_reduce(tensor, c.red, c.group, c.codec, async_op, error_feedback=c.ef, key=c.key,
                            min_bytes=rule.min_bytes, salt=c.salt, hierarchy=rule.hierarchy)


def _all_reduce_mpi(comm, tensor, op, group, async_op):
    mop = _mpi_op(op)
    return None if mop is None else (_transport(comm).native_all_reduce, (tensor, mop, async_op))


def _all_gather(c: Compressed, output_tensor, input_tensor, group, async_op):
    if c.rule.weight_delta:  # weight_delta: send encoded changes against ccoll's reconstruction
        return c.st.wdelta.all_gather_into_tensor(output_tensor, input_tensor, group=c.group, codec=c.codec,
                                                  async_op=async_op, key=c.key, step=c.st.steps,
                                                  refresh_steps=c.rule.weight_delta, min_bytes=c.rule.min_bytes, salt=c.salt)
    rule = c.rule
    return _coll.all_gather_into_tensor(output_tensor, input_tensor, c.group, c.codec, async_op,
                                        min_bytes=rule.min_bytes, salt=c.salt, hierarchy=rule.hierarchy)


def _all_gather_outputs(output_tensor, input_tensor, group, async_op):
    """torch 2.13's gloo ``Work.result()`` of an all_gather_into_tensor: the output, one view per rank."""
    return list(output_tensor.reshape(-1, *input_tensor.shape).unbind(0))


def _all_gather_mpi(comm, output_tensor, input_tensor, group, async_op):
    return _transport(comm).native_all_gather, (output_tensor, input_tensor, async_op)


def _reduce_scatter(c: Compressed, output, input, op, group, async_op):
    rule = c.rule
    return _coll.reduce_scatter_tensor(output, input, c.red, c.group, c.codec, async_op, error_feedback=c.ef,
                                       key=c.key, min_bytes=rule.min_bytes, salt=c.salt, hierarchy=rule.hierarchy)


def _reduce_scatter_mpi(comm, output, input, op, group, async_op):
    mop = _mpi_op(op)
    return None if mop is None else (_transport(comm).native_reduce_scatter, (output, input, mop, async_op))


def _global_rank(group: Any, rank: int | None, group_rank: int | None) -> int:
    """A global rank from torch's pair of (global, group) rank parameters."""
    if rank is not None:
        return rank
    return dist.get_global_rank(group if group is not None else dist.group.WORLD, group_rank)


def _broadcast(c: Compressed, tensor, src, group, async_op, group_src):
    return _coll.broadcast(tensor, _global_rank(group, src, group_src), group=c.group, codec=c.codec,
                           async_op=async_op, min_bytes=c.rule.min_bytes, salt=c.salt)


def _broadcast_mpi(comm, tensor, src, group, async_op, group_src):
    t = _transport(comm)
    root = t.group_rank(_global_rank(group, src, group_src))  # transports take group ranks
    return t.native_broadcast, (tensor, root, async_op)


def _all_to_all(c: Compressed, output, input, output_split_sizes, input_split_sizes, group, async_op):
    return _coll.all_to_all_single(output, input, group=c.group, codec=c.codec, async_op=async_op,
                                   min_bytes=c.rule.min_bytes, salt=c.salt)


def _all_to_all_even(output, input, output_split_sizes, input_split_sizes, group, async_op):
    """Whether the call may compress: splits left to torch (None, or ``[]``, which torch reads as None)
    on both sides, one dtype. Decided on how the splits are spelled, never on their values: explicit
    sizes are data (MoE routing), and a rank whose sizes happen to come out even must decide as its
    peers whose sizes do not (all exact). Ranks must spell the call alike, as they run the same code."""
    return not output_split_sizes and not input_split_sizes and output.dtype == input.dtype


def _all_to_all_mpi(comm, output, input, output_split_sizes, input_split_sizes, group, async_op):
    return _transport(comm).native_all_to_all, (output, input, output_split_sizes, input_split_sizes, async_op)


def _p2p_row(name: str) -> Row:
    """send / recv / isend / irecv: both sides decide from (dim, shape, dtype, step) only. All four run
    torch's function busy (``reenters``): send / recv call the wrapped isend / irecv, and under any
    ``TorchFunctionMode`` torch's isend / irecv dispatch to ``distributed_c10d.isend`` / ``irecv`` again,
    which are ccoll's wrappers too (:data:`ccoll.patch.install.C10D_TOO`): not busy, they counted the call
    twice (Megatron-core's pipeline sends under a mode, tests/dist/test_patch_megatron_core_dist.py)."""
    sending = name in ("send", "isend")
    is_async = name in ("isend", "irecv")
    peer, group_peer = ("dst", "group_dst") if sending else ("src", "group_src")  # torch's parameter names

    def collective(c: Compressed, tensor, peer, group, tag, group_peer):
        if not sending and peer is None and group_peer is None:  # any source: the payload, then decode
            h, sender = anysource.irecv(tensor, group, c.codec, c.dim, tag)
            return h if is_async else (h.wait(), sender())[1]
        global_peer = _global_rank(group, peer, group_peer)
        extra = {"salt": c.salt} if sending else {}  # decoding needs none: receivers take no salt
        h = getattr(_coll, name)(tensor, global_peer, group=group, codec=c.codec, tag=tag, min_bytes=c.rule.min_bytes,
                                          **extra)
        return h if is_async else (None if sending else global_peer)

    def known_peer(tensor, peer, group, tag, group_peer):  # torch refuses a send without one
        return peer is not None or group_peer is not None

    # a receiver decides as its sender did, whether or not it names the sender (see anysource)
    def recv_event(tensor, peer, group, tag, group_peer):  # torch's receive from any source is its own op
        return "c10d::recv_any_source_" if peer is None and group_peer is None else "c10d::recv_"

    return Row("send_recv", f"tensor, {peer}=None, group=None, tag=0, {group_peer}=None", collective,
               async_op=str(is_async), compressible=known_peer if sending else None,
               stat_op="send" if sending else "recv", reenters=True, returns=True,
               event="c10d::send" if sending else "c10d::recv_", event_of=None if sending else recv_event)


_ALL_GATHER = Row("all_gather", "output_tensor, input_tensor, group=None, async_op=False", _all_gather,
                  tensor="input_tensor", same_dtype=True, mpi=_all_gather_mpi, outputs=_all_gather_outputs,
                  event="c10d::_allgather_base_")
_REDUCE_SCATTER = Row("reduce_scatter", "output, input, op=_SUM, group=None, async_op=False", _reduce_scatter,
                      tensor="input", reduce="op", same_dtype=True, mpi=_reduce_scatter_mpi,
                      event="c10d::_reduce_scatter_base_")

def _bytes(ts: Any) -> int:
    """Bytes of a tensor or of the tensors in a (nested) list: what a native list-form call counts."""
    if isinstance(ts, torch.Tensor):
        return ts.numel() * ts.element_size()
    return sum(_bytes(t) for t in ts) if isinstance(ts, (list, tuple)) else 0


def _exact_row(op: str, stat_op: str, params: str, why: str, size: Callable, async_op: str = "async_op") -> Row:
    """A function ccoll keeps exact: resolved under policy op ``op`` (the resolver's question), run as
    torch's own, counted as ``stat_op`` / "native". ``stat_op`` is torch's name, with ``_list`` where
    that name is a policy op (``all_gather_list``): a policy op's native row keeps meaning "the tensor
    form, not compressed this time" (weight_delta refreshes, warm-up, min_bytes). Run busy
    (``reenters``): torch's object collectives call other wrapped functions (``send_object_list`` ->
    ``send`` -> ``isend``), which must neither count nor compress the same call a second time."""
    return Row(op, params, _never, tensor="None", async_op=async_op, stat_op=stat_op, reenters=True, exact=why,
               size=size)


def _never(c: Compressed, *args):  # an exact row has no compressed path (shape never decides for it)
    raise AssertionError("ccoll: an exact row reached its collective")


_OBJECTS = ("objects are pickled inside torch (their bytes are not known before); a lossy codec would "
            "corrupt the pickle")
_ROOTED = "rooted (one rank's result): ccoll has no rooted algorithm, and the non-roots' buffers must stay as torch leaves them"
_LISTS = ("list form: entries may differ in shape per rank (uneven gathers), and its callers gather "
          "metrics, predictions and objects; the compressed form is the tensor form")


def _no_bytes(*args) -> int:  # objects (pickled inside torch), barriers
    return 0


#: torch.distributed's list-form, rooted, object and synchronising collectives: kept exact, counted
_EXACT_ROWS: dict[str, Row] = {
    "all_gather": _exact_row("all_gather", "all_gather_list", "tensor_list, tensor, group=None, async_op=False", _LISTS,
                             lambda tensor_list, tensor, *_: _bytes(tensor)),
    "all_gather_coalesced": _exact_row("all_gather", "all_gather_coalesced", "output_tensor_lists, input_tensor_list, group=None, "
                                       "async_op=False", _LISTS, lambda out, inp, *_: _bytes(inp)),
    "reduce_scatter": _exact_row("reduce_scatter", "reduce_scatter_list", "output, input_list, op=_SUM, group=None, "
                                 "async_op=False", _LISTS, lambda output, input_list, *_: _bytes(input_list)),
    "all_to_all": _exact_row("all_to_all", "all_to_all_list", "output_tensor_list, input_tensor_list, group=None, "
                             "async_op=False", _LISTS + " (per-peer sizes are uneven in MoE dispatch)",
                             lambda out, inp, *_: _bytes(inp)),
    "all_reduce_coalesced": _exact_row("all_reduce", "all_reduce_coalesced", "tensors, op=_SUM, group=None, async_op=False",
                                       "deprecated in torch; one reduce over several tensors of possibly different "
                                       "dtypes", lambda tensors, *_: _bytes(tensors)),
    "reduce": _exact_row("all_reduce", "reduce", "tensor, dst=None, op=_SUM, group=None, async_op=False, "
                         "group_dst=None", _ROOTED, lambda tensor, *_: _bytes(tensor)),
    "gather": _exact_row("all_gather", "gather", "tensor, gather_list=None, dst=None, group=None, async_op=False, "
                         "group_dst=None", _ROOTED, lambda tensor, *_: _bytes(tensor)),
    "scatter": _exact_row("broadcast", "scatter", "tensor, scatter_list=None, src=None, group=None, async_op=False, "
                          "group_src=None", _ROOTED, lambda tensor, *_: _bytes(tensor)),
    "all_gather_object": _exact_row("all_gather", "all_gather_object", "object_list, obj, group=None", _OBJECTS,
                                    _no_bytes, async_op="False"),
    "gather_object": _exact_row("all_gather", "gather_object", "obj, object_gather_list=None, dst=None, group=None, "
                                "group_dst=None", _OBJECTS, _no_bytes, async_op="False"),
    "broadcast_object_list": _exact_row("broadcast", "broadcast_object_list", "object_list, src=None, group=None, "
                                        "device=None, group_src=None", _OBJECTS, _no_bytes, async_op="False"),
    "scatter_object_list": _exact_row("broadcast", "scatter_object_list", "scatter_object_output_list, "
                                      "scatter_object_input_list=None, src=None, group=None, group_src=None",
                                      _OBJECTS, _no_bytes, async_op="False"),
    "send_object_list": _exact_row("send_recv", "send_object_list", "object_list, dst=None, group=None, device=None, "
                                   "group_dst=None, use_batch=False", _OBJECTS, _no_bytes, async_op="False"),
    "recv_object_list": _exact_row("send_recv", "recv_object_list", "object_list, src=None, group=None, device=None, "
                                   "group_src=None, use_batch=False", _OBJECTS, _no_bytes, async_op="False"),
    "barrier": _exact_row("all_reduce", "barrier", "group=None, async_op=False, device_ids=None, timeout=None",
                          "no data", _no_bytes),
    "monitored_barrier": _exact_row("all_reduce", "barrier", "group=None, timeout=None, wait_all_ranks=False", "no data",
                                    _no_bytes, async_op="False"),
}

#: torch.distributed attribute -> its row (torch 2.13's old and new names)
ROWS: dict[str, Row] = {
    "all_reduce": Row("all_reduce", "tensor, op=_SUM, group=None, async_op=False", _all_reduce, reduce="op",
                      mpi=_all_reduce_mpi, event="c10d::allreduce_"),
    "all_gather_into_tensor": _ALL_GATHER, "all_gather_single": _ALL_GATHER, "_all_gather_base": _ALL_GATHER,
    "reduce_scatter_tensor": _REDUCE_SCATTER, "reduce_scatter_single": _REDUCE_SCATTER,
    "_reduce_scatter_base": _REDUCE_SCATTER,
    "broadcast": Row("broadcast", "tensor, src=None, group=None, async_op=False, group_src=None", _broadcast,
                     mpi=_broadcast_mpi, event="c10d::broadcast_"),
    "all_to_all_single": Row("all_to_all", "output, input, output_split_sizes=None, input_split_sizes=None, "
                             "group=None, async_op=False", _all_to_all, tensor="input",
                             compressible=_all_to_all_even, mpi=_all_to_all_mpi, event="c10d::alltoall_base_"),
    **{name: _p2p_row(name) for name in ("send", "recv", "isend", "irecv")},
    **_EXACT_ROWS,
}
