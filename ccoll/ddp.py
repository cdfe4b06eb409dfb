"""A DDP communication hook that averages gradient buckets with a compressed all_reduce.

    state = ccoll.ddp.CompressionState(codec="int8:block=64", model=model)
    ddp_model.register_comm_hook(state, ccoll.ddp.compress_hook)
    ...
    torch.save({"model": ..., "optim": ..., "ccoll": state.state_dict()}, path)

DDP's C++ reducer never calls torch.distributed's Python functions, so ``ccoll.patch`` cannot see its
traffic; a comm hook is DDP's own extension point (torch's PowerSGD hook has the same shape:
``hook(state, bucket) -> Future[Tensor]``). Stats are recorded under dimension ``dp``.

Numerics do not depend on how DDP packs a bucket. DDP packs step 0 in forward order and rebuilds its
buckets in the reverse order gradients became ready, and a resumed run starts from the step-0 packing
again. So each bucket is re-packed canonically: its parameters' gradients in the order of their names
(``model=`` given) or of first sight, each padded to the codec's ``align_numel`` so no codec block
straddles two parameters, and the whole padded to a multiple of ``world_size * align_numel`` so the
collective's per-rank chunks (and its segments) start on block boundaries. Error-feedback residuals
are kept per parameter and phase (``(name, "rs")``, ``(name, "ag")``, ``(name, "whole")``: the phases of
the algorithm the router runs, as :func:`ccoll.collectives.all_reduce_residuals` plans them) as views of one
packed residual tensor per bucket and phase, laid out once and kept with the bucket's packed gradient buffer
from step to step (assembling and scattering them every step cost more than the codec on the CPU), and
stochastic-rounding salts derive from (step, the bucket's parameter names):
the same parameters give the same bytes whatever their order in DDP's bucket, so a run resumed from
:meth:`CompressionState.state_dict` is bit-identical to an uninterrupted one. (If DDP's rebuild moves a
parameter to a bucket with different companions, its blocks and residuals still belong to it alone,
but the salts and chunk ownership of that bucket change: results stay statistically equivalent, not
bit-identical, to the other packing.)

The averaged bucket is ONE compressed ``all_reduce(op="avg")`` over the packed buffer, issued when DDP
calls the hook; the returned future completes (on a ccoll thread) once it is decoded into the bucket.
Warm-up steps, buckets under ``min_bytes``, non-float buckets and a world of one rank run the native
all_reduce.
"""
from __future__ import annotations

from typing import Any, Hashable

import torch
import torch.distributed as dist

from . import collectives
from .codecs import Codec, get_codec
from .errors import PolicyError
from .feedback import ErrorFeedback, parse_residual_key
from .callctx import internal, stable_salt
from .stats import dimension

__all__ = ["CompressionState", "compress_hook"]

#: the stats dimension of DDP gradient traffic
DIM = "dp"


class CompressionState:
    """What :func:`compress_hook` decides with and remembers between steps.

    - ``process_group``: the data-parallel group (None: WORLD), as in torch's hooks;
    - ``codec``: a spec string or Codec (e.g. ``"int8:block=64"``, ``"int4:block=64,round=stochastic"``);
    - ``error_feedback``: carry each parameter's compression error into its next step (EF-SGD);
    - ``min_bytes``: buckets smaller than this are averaged natively (the codec's fixed cost wins);
    - ``warmup_steps``: the first steps run native (early gradients are large and fast-changing);
    - ``model``: the module (or DDP module) whose parameter names key the residuals; without it,
      parameters are numbered in the order the hook first sees them, which is the same in every
      process of a run (DDP's step-0 packing is deterministic) but changes if the model does.
    """

    def __init__(self, process_group: Any = None, codec: "str | Codec" = "int8:block=64", error_feedback: bool = True,
                 min_bytes: int = collectives.DEFAULT_MIN_BYTES, warmup_steps: int = 0, *,
                 model: torch.nn.Module | None = None):
        if int(min_bytes) < 0 or int(warmup_steps) < 0:
            raise PolicyError(f"CompressionState: min_bytes ({min_bytes}) and warmup_steps ({warmup_steps}) must be >= 0")
        self.process_group = process_group
        self.codec = get_codec(codec) if codec is not None else None
        self.error_feedback = bool(error_feedback)
        self.min_bytes = int(min_bytes)
        self.warmup_steps = int(warmup_steps)
        # per-parameter residuals, keyed (parameter name, "rs" | "ag" | "whole")
        self.feedback = ErrorFeedback()
        # backward passes completed (DDP calls the hook once per bucket per backward)
        self.iter = 0
        self._names: dict[int, str] = {}
        # the packing of each bucket seen, by its parameters (id, numel) in DDP's order (:class:`_Bucket`)
        self._buckets: dict[tuple, _Bucket] = {}
        if model is not None:
            module = getattr(model, "module", model)
            self._names = {id(p): name for name, p in module.named_parameters()}
        self._named_by_model = model is not None

    def name_of(self, param: torch.Tensor) -> str:
        name = self._names.get(id(param))
        if name is None:
            if self._named_by_model:
                raise PolicyError("ccoll.ddp: a bucket holds a parameter that is not in the model given to "
                                  "CompressionState(model=...)")
            name = self._names[id(param)] = f"param{len(self._names)}"
        return name

    def state_dict(self) -> dict:
        """Steps and per-parameter residuals (on CPU), for ``torch.save`` next to the model."""
        return {"version": 1, "iter": self.iter, "feedback": self.feedback.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != 1:
            raise PolicyError(f"CompressionState.load_state_dict: unknown state version {state.get('version')!r}")
        self.iter = int(state["iter"])
        self.feedback.load_state_dict(state["feedback"])

    def __repr__(self) -> str:
        spec = self.codec.spec if self.codec is not None else "native"
        return (f"<ccoll.ddp.CompressionState {spec} error_feedback={self.error_feedback} "
                f"min_bytes={self.min_bytes} warmup_steps={self.warmup_steps} iter={self.iter}>")


class _PackedFeedback(ErrorFeedback):
    """The residual buffers one bucket's packed all_reduce asks for: per phase one packed residual tensor,
    each parameter's residual a view of its region.

    The slots come from the router (:func:`ccoll.collectives.all_reduce_residuals`): each is a (phase,
    segment) key of :func:`ccoll.feedback.residual_key` with its span of the packed tensor, by the algorithm
    the call will run; :meth:`buffer` hands out a slot's span. The parameters' residuals move in once
    (:meth:`ErrorFeedback.place`: a checkpoint's or another packing's values, or zeros) and stay views, so
    the encode updates them in place and the state's checkpoint reads them. Nothing here knows which
    algorithm runs or how it segments: a change of the router's rule or of an algorithm's layout changes
    the slots, and the parameters' residuals follow."""

    def __init__(self, state: CompressionState, regions: list, total: int, dtype: torch.dtype, device: Any,
                 codec: Codec, slots: "list[collectives.ResidualSlot]"):
        super().__init__()
        fb_dtype = codec.feedback_dtype(dtype)
        self._slots = {(slot.phase, slot.segment): (slot.start, slot.numel) for slot in slots}
        # a last segment's rows may run past the bucket (zero padding): those residuals are no parameter's,
        # and restart from zero every call (:meth:`zero_tail`) as after a resume
        padded_total = max([total] + [start + numel for start, numel in self._slots.values()])
        self._end = regions[-1][1] + regions[-1][3] if regions else 0
        self._packed: dict[str, torch.Tensor] = {}
        for phase in dict.fromkeys(slot.phase for slot in slots):
            packed = torch.empty(padded_total, dtype=fb_dtype, device=device)
            for name, off, _, padded in regions:
                state.feedback.place((name, phase), packed[off:off + padded], dtype, codec)
            self._packed[phase] = packed
        self.zero_tail()

    def zero_tail(self) -> None:
        for packed in self._packed.values():
            packed[self._end:].zero_()

    def buffer(self, key: Hashable, numel: int, dtype: torch.dtype, device: Any, codec: Codec) -> torch.Tensor:
        try:
            _, phase, segment = parse_residual_key(key)
        except ValueError:
            phase, segment = None, 0
        slot = self._slots.get((phase, segment))
        if slot is None:
            raise PolicyError(f"ccoll.ddp: unexpected error-feedback key {key!r} from the collective "
                              f"(the router planned {sorted(self._slots)})")
        start, expected = slot
        if numel != expected:
            raise PolicyError(f"ccoll.ddp: the collective asked for {numel} residuals at {key!r}, expected {expected}")
        return self._packed[phase][start:start + numel]


class _Bucket:
    """One DDP bucket's canonical packing (module docstring), kept from step to step: the regions, the
    packed gradient buffer and the packed residuals. DDP hands the same buckets every step once it has
    rebuilt them after step 0, so the layout is computed, and its buffers allocated, once per bucket
    rather than once per call."""

    def __init__(self, state: CompressionState, bucket, buf: torch.Tensor, world: int, group: Any, c: Codec):
        params = bucket.parameters()
        names = [state.name_of(p) for p in params]
        align = c.align_numel
        self.order = sorted(range(len(names)), key=names.__getitem__)
        self.regions, off = [], 0
        for i in self.order:
            n = params[i].numel()
            padded = -(-n // align) * align
            self.regions.append((names[i], off, n, padded))
            off += padded
        self.end = off
        total = -(-off // (world * align)) * (world * align)
        self.packed = torch.empty(total, dtype=buf.dtype, device=buf.device)
        self.key = ("ddp",) + tuple(r[0] for r in self.regions)
        self.generation = state.feedback.generation
        self.feedback = None
        if state.error_feedback:
            slots = collectives.all_reduce_residuals(total, buf.dtype, group, c)
            self.feedback = _PackedFeedback(state, self.regions, total, buf.dtype, buf.device, c, slots)

    def pack(self, grads: list) -> torch.Tensor:
        """The gradients copied into the kept buffer, and only its padding zeroed (each region's alignment
        tail, the buffer's tail): the last call's averages are still there."""
        packed = self.packed
        for i, (_, start, n, padded) in zip(self.order, self.regions):
            packed[start:start + n].copy_(grads[i].reshape(-1))
            if padded > n:
                packed[start + n:start + padded].zero_()
        packed[self.end:].zero_()
        if self.feedback is not None:
            self.feedback.zero_tail()
        return packed

    def unpack(self, grads: list) -> None:
        for i, (_, start, n, _) in zip(self.order, self.regions):
            grads[i].view(-1).copy_(self.packed[start:start + n])  # views of the bucket's buffer


def compress_hook(state: CompressionState, bucket: "dist.GradBucket") -> "torch.futures.Future[torch.Tensor]":
    """Average ``bucket`` across ``state.process_group`` with ``state.codec``; returns a future of the
    bucket's flat buffer holding the average (torch's comm-hook contract)."""
    buf = bucket.buffer()
    group = state.process_group
    world = dist.get_world_size(group)
    c = state.codec
    compress = (
        c is not None and world > 1 and state.iter >= state.warmup_steps and buf.dtype in c.dtypes
        and buf.numel() * buf.element_size() >= state.min_bytes
    )
    try:
        with internal(), dimension(DIM):
            if not compress:
                handle = collectives.all_reduce(buf, op="avg", group=group, codec=None, async_op=True)
                return handle.get_future().then(lambda fut: fut.value()[0])
            return _compressed(state, bucket, buf, group, world, c)
    finally:
        if bucket.is_last():
            state.iter += 1


# ``from __future__ import annotations`` leaves annotations as strings, and DDP's register_comm_hook
# compares them with the objects themselves (``_check_comm_hook``): give it the objects.
compress_hook.__annotations__.update(state=CompressionState, bucket=dist.GradBucket,
                                     **{"return": torch.futures.Future[torch.Tensor]})


def _compressed(state: CompressionState, bucket, buf: torch.Tensor, group: Any, world: int, c: Codec):
    grads = bucket.gradients()
    ident = tuple((id(p), p.numel()) for p in bucket.parameters())
    layout = state._buckets.get(ident)
    if (layout is None or layout.generation != state.feedback.generation or layout.packed.dtype != buf.dtype
            or layout.packed.device != buf.device):
        # a new or changed bucket (DDP's rebuild after step 0, a loaded checkpoint): its parameters' residuals
        # move into the new layout, so a kept layout that shares a parameter with it is stale
        mine = {i for i, _ in ident}
        for other in [k for k in state._buckets if any(i in mine for i, _ in k)]:
            del state._buckets[other]
        layout = state._buckets[ident] = _Bucket(state, bucket, buf, world, group, c)
    packed = layout.pack(grads)
    handle = collectives.all_reduce(packed, op="avg", group=group, codec=c, async_op=True,
                                    error_feedback=layout.feedback, key=layout.key, min_bytes=0,
                                    salt=stable_salt(state.iter, layout.key))

    def unpack(fut: torch.futures.Future) -> torch.Tensor:
        fut.value()
        layout.unpack(grads)
        return buf

    return handle.get_future().then(unpack)
