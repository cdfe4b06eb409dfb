"""``CCOLL_CAPTURE=DIR``: keep samples of the tensors that actually travel, for rate–distortion studies.

Why: codec choices made on Gaussian or Student-t data do not tell which codec wins on real gradients and
activations. With capture on, ``ccoll.patch`` hands every call it sees on a resolved dimension to
:func:`sample` (one line in ``ccoll.patch.wrap.decide``, before any policy decision, so the baseline policy
captures everything while training stays exact), and this module writes a bounded sample to disk:

    DIR/rank<R>/<dim>_<op>_step<S>_<n>.pt     torch.save({"tensor": fp32 CPU copy, "meta": {...}})

``meta``: dim, op, step (optimizer steps so far), rank, call index n within (dim, op, step) on this rank,
shape, dtype, numel of the full tensor, offset of the sample in the flat tensor, ``in_backward`` (the call
came from inside autograd's backward: TP activation *gradients*, as opposed to forward activations), plus
whatever the program put in :data:`context` (the convergence runner adds its pipeline stage, so PP sends
of the first stage are activations and of the last stage gradients).

Bounds (environment, read once at import):
``CCOLL_CAPTURE_STEPS`` optimizer steps to capture at (comma list, default "0,10,100,1000");
``CCOLL_CAPTURE_PER_KEY`` tensors per (dim, op, step) per rank (default 6): the calls numbered 0, 1, 2,
4, 8, ... within the step, so a step's later calls (e.g. TP backward all-reduces after the forward ones,
the second micro-batch) are sampled too;
``CCOLL_CAPTURE_MAX_NUMEL`` values per tensor (default 1048576: a longer tensor is sampled as a contiguous
window from its middle, so a gradient bucket is not represented by its first layer only);
``CCOLL_CAPTURE_MAX_BYTES`` bytes written per rank (default 256 MiB);
``CCOLL_CAPTURE_MIN_NUMEL`` skip tensors shorter than this (default 1024: scalars, flags, metadata).

Receive buffers are not captured: before a recv they hold stale data. The patch's ``send_recv`` op covers
both directions, so for it the sending side is recognised from the call context the patch's point-to-point
wrappers set (:func:`ccoll.callctx.current`, only while capturing).
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

from . import callctx

#: extra metadata stored with every sample (e.g. {"pp_stage": 0, "pp_size": 2}); set by the program
context: dict = {}


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return default if not raw else int(raw)


def _env_steps() -> frozenset[int]:
    raw = os.environ.get("CCOLL_CAPTURE_STEPS", "0,10,100,1000")
    return frozenset(int(s) for s in raw.split(",") if s.strip())


class _Capture:
    """Where samples go, the bounds, and what was written so far in this process."""

    def __init__(self, directory: str | None):
        self.lock = threading.Lock()
        self.set(directory)

    def set(self, directory: str | None, steps=None, per_key=None, max_numel=None, max_bytes=None,
            min_numel=None) -> None:
        self.directory = directory
        #: read by ccoll.patch on every call: an attribute test is all capture costs when it is off
        self.active = directory is not None
        self.steps = _env_steps() if steps is None else frozenset(int(s) for s in steps)
        self.per_key = _env_int("CCOLL_CAPTURE_PER_KEY", 6) if per_key is None else per_key
        self.max_numel = _env_int("CCOLL_CAPTURE_MAX_NUMEL", 1 << 20) if max_numel is None else max_numel
        self.max_bytes = _env_int("CCOLL_CAPTURE_MAX_BYTES", 256 << 20) if max_bytes is None else max_bytes
        self.min_numel = _env_int("CCOLL_CAPTURE_MIN_NUMEL", 1024) if min_numel is None else min_numel
        self.counts: dict[tuple, int] = {}  # (dim, op, step) -> calls seen
        self.written_bytes = 0


#: this process's capture settings and counters (reset by :func:`configure`)
state = _Capture(os.environ.get("CCOLL_CAPTURE") or None)


def configure(directory: str | None, *, steps=None, per_key: int | None = None, max_numel: int | None = None,
              max_bytes: int | None = None, min_numel: int | None = None) -> None:
    """Turn capture on (``directory``) or off (None) in this process; bounds not given come from the
    environment (or the defaults). Resets the counters."""
    with state.lock:
        state.set(directory, steps, per_key, max_numel, max_bytes, min_numel)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Capture nothing inside the block (e.g. evaluation traffic)."""
    was, state.active = state.active, False
    try:
        yield
    finally:
        state.active = was


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _is_receive(op: str) -> bool:
    if op != "send_recv":
        return False
    call = callctx.current()  # set by the patch's point-to-point wrappers while capture is on
    return call is None or call.sending is not True


def sample(dim: str, op: str, tensor, step: int) -> None:
    """Write ``tensor`` (or a window of it) if (dim, op, step) still has room; never raises into training."""
    cap = state
    if step not in cap.steps or not tensor.is_floating_point() or tensor.numel() < cap.min_numel:
        return
    if _is_receive(op):
        return
    import torch

    key = (dim, op, step)
    numel = tensor.numel()
    take = min(numel, cap.max_numel)
    with cap.lock:
        call = cap.counts.get(key, 0)  # calls of (dim, op) seen in this step
        cap.counts[key] = call + 1
        n = call.bit_length()  # sample number: calls 0, 1, 2, 4, 8, ... are samples 0, 1, 2, 3, 4, ...
        if (call & (call - 1) or n >= cap.per_key or cap.written_bytes + 4 * take > cap.max_bytes
                or cap.directory is None):
            return
        cap.written_bytes += 4 * take
        directory = cap.directory
    offset = (numel - take) // 2
    flat = tensor.detach().reshape(-1)[offset:offset + take].to("cpu", torch.float32, copy=True)
    rank = _rank()
    meta = dict(context, dim=dim, op=op, step=step, rank=rank, index=n, call=call, shape=list(tensor.shape),
                dtype=str(tensor.dtype).replace("torch.", ""), numel=numel, offset=offset,
                in_backward=torch._C._current_graph_task_id() != -1)
    out = os.path.join(directory, f"rank{rank}")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{dim}_{op}_step{step}_{n}.pt")
    torch.save({"tensor": flat, "meta": meta}, path + ".tmp")
    os.replace(path + ".tmp", path)


def load(directory: str) -> list[dict]:
    """Every sample under ``directory`` as {"tensor", "meta", "path"}, in a stable (sorted) order."""
    import torch

    found = []
    for root, _, files in os.walk(directory):
        for name in files:
            if name.endswith(".pt"):
                found.append(os.path.join(root, name))
    out = []
    for path in sorted(found):
        doc = torch.load(path, map_location="cpu", weights_only=True)
        out.append(dict(doc, path=path))
    return out
