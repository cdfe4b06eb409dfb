"""Compressed gradient reduce-scatter (and optionally parameter all-gather) for FSDP2 (``fully_shard``).

    model = ...; for layer in model.layers: fully_shard(layer); fully_shard(model)
    comp = ccoll.fsdp.compress(model, codec="int8:block=64")
    ...
    torch.save({..., "ccoll": comp.state_dict()}, path)

FSDP2 calls its reduce-scatter / all-gather through replaceable ``Comm`` objects
(``FSDPModule.set_custom_reduce_scatter`` / ``set_custom_all_gather``, torch >= 2.7); :func:`compress`
installs ccoll's on every FSDP module under ``module``. The reduce-scatter input FSDP builds is the
same flat layout every step (each parameter's padded shard, in a fixed order), so the error-feedback
residuals of one module's reduce-scatter are keyed by the module's name and carry over step to step;
stochastic-rounding salts derive from (that module's reduce-scatter count, its name). Stats are
recorded under dimension ``dp``.

What stays native: reduce ops other than SUM / AVG (FSDP's PREMUL_SUM for a custom gradient divide
factor), the first ``warmup_steps`` reduce-scatters of each module, inputs under ``min_bytes``, and,
with HSDP, the all-reduce across replicas (FSDP issues it with ``torch.distributed.all_reduce``: install
``ccoll.patch`` with a resolver if it should be compressed too). The custom collectives run
synchronously: FSDP only waits on ``torch.distributed.Work`` objects it gets back, so an async ccoll
handle would never be finished.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from . import collectives
from .codecs import Codec, get_codec
from .errors import PolicyError
from .feedback import ErrorFeedback
from .callctx import internal, reduce_name as _reduce_name, stable_salt
from .stats import dimension

__all__ = ["FSDPCompression", "compress"]

#: the stats dimension of FSDP traffic
DIM = "dp"


class FSDPCompression:
    """The state :func:`compress` installs: codecs, per-module error feedback and call counts."""

    def __init__(self, codec: "str | Codec", all_gather_codec: "str | Codec | None", error_feedback: bool,
                 min_bytes: int, warmup_steps: int):
        if int(min_bytes) < 0 or int(warmup_steps) < 0:
            raise PolicyError(f"ccoll.fsdp: min_bytes ({min_bytes}) and warmup_steps ({warmup_steps}) must be >= 0")
        self.codec = get_codec(codec) if codec is not None else None
        self.all_gather_codec = get_codec(all_gather_codec) if all_gather_codec is not None else None
        self.error_feedback = bool(error_feedback)
        self.min_bytes = int(min_bytes)
        self.warmup_steps = int(warmup_steps)
        self.feedback = ErrorFeedback()  # keyed by module name (the collective derives one key per chunk)
        self.calls: dict[str, int] = {}  # module name -> reduce-scatters done
        self.ag_calls: dict[str, int] = {}  # module name -> parameter all-gathers done (their salts)
        self.modules: list[str] = []

    def state_dict(self) -> dict:
        return {"version": 1, "calls": dict(self.calls), "ag_calls": dict(self.ag_calls),
                "feedback": self.feedback.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != 1:
            raise PolicyError(f"FSDPCompression.load_state_dict: unknown state version {state.get('version')!r}")
        self.calls = {str(k): int(v) for k, v in state["calls"].items()}
        self.ag_calls = {str(k): int(v) for k, v in state.get("ag_calls", {}).items()}
        self.feedback.load_state_dict(state["feedback"])

    def __repr__(self) -> str:
        rs = self.codec.spec if self.codec is not None else "native"
        ag = self.all_gather_codec.spec if self.all_gather_codec is not None else "native"
        return f"<ccoll.fsdp.FSDPCompression reduce_scatter={rs} all_gather={ag} modules={len(self.modules)}>"


class _Alloc:
    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class CompressedReduceScatter(_Alloc, ReduceScatter):
    """FSDP2's reduce-scatter Comm over :func:`ccoll.collectives.reduce_scatter_tensor`."""

    def __init__(self, owner: FSDPCompression, name: str):
        self.owner, self.name = owner, name

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: Any, async_op: bool = False) -> None:
        o = self.owner
        red = _reduce_name(op)
        if red is None:  # PREMUL_SUM and friends: torch's own call, untouched
            work = dist.distributed_c10d.reduce_scatter_single(output_tensor, input_tensor, op=op, group=group,
                                                                async_op=async_op)
            if work is not None:
                work.wait()
            return None
        n = o.calls.get(self.name, 0)
        o.calls[self.name] = n + 1
        codec = o.codec if n >= o.warmup_steps else None
        key = self.name
        fn = collectives.reduce_scatter_tensor
        with internal(), dimension(DIM):
            fn(output_tensor, input_tensor, op=red, group=group, codec=codec,
               error_feedback=o.feedback if o.error_feedback and codec is not None else None, key=key,
               min_bytes=o.min_bytes, salt=stable_salt(n, key))
        return None


class CompressedAllGather(_Alloc, AllGather):
    """FSDP2's parameter all-gather Comm over :func:`ccoll.collectives.all_gather_into_tensor`."""

    def __init__(self, owner: FSDPCompression, name: str):
        self.owner, self.name = owner, name

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> None:
        n = self.owner.ag_calls.get(self.name, 0)
        self.owner.ag_calls[self.name] = n + 1
        fn = collectives.all_gather_into_tensor
        with internal(), dimension(DIM):
            fn(output_tensor, input_tensor, group=group, codec=self.owner.all_gather_codec,
               min_bytes=self.owner.min_bytes, salt=stable_salt(n, (self.name, "ag")))
        return None


def compress(module: torch.nn.Module, codec: "str | Codec" = "int8:block=64", *,
             all_gather_codec: "str | Codec | None" = None, error_feedback: bool = True,
             min_bytes: int = collectives.DEFAULT_MIN_BYTES, warmup_steps: int = 0) -> FSDPCompression:
    """Install ccoll's reduce-scatter (``codec``) and, if ``all_gather_codec`` is given, all-gather on
    every FSDP2 module in ``module`` (itself included). Returns the state (``state_dict()`` /
    ``load_state_dict()`` for checkpoints). Raises PolicyError when ``module`` holds no FSDP module."""
    state = FSDPCompression(codec, all_gather_codec, error_feedback, min_bytes, warmup_steps)
    for name, sub in module.named_modules():
        if not isinstance(sub, FSDPModule):
            continue
        name = name or "<root>"
        sub.set_custom_reduce_scatter(CompressedReduceScatter(state, name))
        if state.all_gather_codec is not None:
            sub.set_custom_all_gather(CompressedAllGather(state, name))
        state.modules.append(name)
    if not state.modules:
        raise PolicyError("ccoll.fsdp.compress: no FSDP module found; call torch.distributed.fsdp.fully_shard first")
    return state
