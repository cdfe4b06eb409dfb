"""``CCOLL_CAPTURE=DIR``: keep samples of the tensors that actually travel, for rate–distortion studies.

Why: codec choices made on Gaussian or Student-t data do not tell which codec wins on real gradients and
activations. With capture on, ``ccoll.patch`` hands every call it sees on a resolved dimension to
:func:`sample` (one line in ``ccoll.patch._decide``, before any policy decision, so the baseline policy
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
both directions, so for it the sending side is recognised from the patch wrapper's ``sending`` flag in the
caller's frame (only while capturing).
"""
from __future__ import annotations

import os
import sys
import threading

_DIR = os.environ.get("CCOLL_CAPTURE") or None
#: read by ccoll.patch on every call: a module attribute test is all capture costs when it is off
active = _DIR is not None
#: extra metadata stored with every sample (e.g. {"pp_stage": 0, "pp_size": 2}); set by the program
context: dict = {}

_lock = threading.Lock()
_counts: dict[tuple, int] = {}
_written_bytes = 0


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return default if not raw else int(raw)


def _env_steps() -> frozenset[int]:
    raw = os.environ.get("CCOLL_CAPTURE_STEPS", "0,10,100,1000")
    return frozenset(int(s) for s in raw.split(",") if s.strip())


_STEPS = _env_steps()
_PER_KEY = _env_int("CCOLL_CAPTURE_PER_KEY", 6)
_MAX_NUMEL = _env_int("CCOLL_CAPTURE_MAX_NUMEL", 1 << 20)
_MAX_BYTES = _env_int("CCOLL_CAPTURE_MAX_BYTES", 256 << 20)
_MIN_NUMEL = _env_int("CCOLL_CAPTURE_MIN_NUMEL", 1024)


def configure(directory: str | None, *, steps=None, per_key: int | None = None, max_numel: int | None = None,
              max_bytes: int | None = None, min_numel: int | None = None) -> None:
    """Turn capture on (``directory``) or off (None) in this process; bounds not given come from the
    environment (or the defaults). Resets the counters."""
    global _DIR, active, _STEPS, _PER_KEY, _MAX_NUMEL, _MAX_BYTES, _MIN_NUMEL, _written_bytes
    with _lock:
        _DIR = directory
        _STEPS = _env_steps() if steps is None else frozenset(int(s) for s in steps)
        _PER_KEY = _env_int("CCOLL_CAPTURE_PER_KEY", 6) if per_key is None else per_key
        _MAX_NUMEL = _env_int("CCOLL_CAPTURE_MAX_NUMEL", 1 << 20) if max_numel is None else max_numel
        _MAX_BYTES = _env_int("CCOLL_CAPTURE_MAX_BYTES", 256 << 20) if max_bytes is None else max_bytes
        _MIN_NUMEL = _env_int("CCOLL_CAPTURE_MIN_NUMEL", 1024) if min_numel is None else min_numel
        _counts.clear()
        _written_bytes = 0
        active = directory is not None


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _is_receive(op: str) -> bool:
    if op != "send_recv":
        return False
    frame = sys._getframe(3)  # sample <- ccoll.patch._decide <- the p2p wrapper
    sending = frame.f_locals.get("sending")
    return sending is not True


def sample(dim: str, op: str, tensor, step: int) -> None:
    """Write ``tensor`` (or a window of it) if (dim, op, step) still has room; never raises into training."""
    global _written_bytes
    if step not in _STEPS or not tensor.is_floating_point() or tensor.numel() < _MIN_NUMEL:
        return
    if _is_receive(op):
        return
    import torch

    key = (dim, op, step)
    numel = tensor.numel()
    take = min(numel, _MAX_NUMEL)
    with _lock:
        call = _counts.get(key, 0)  # calls of (dim, op) seen in this step
        _counts[key] = call + 1
        n = call.bit_length()  # sample number: calls 0, 1, 2, 4, 8, ... are samples 0, 1, 2, 3, 4, ...
        if call & (call - 1) or n >= _PER_KEY or _written_bytes + 4 * take > _MAX_BYTES or _DIR is None:
            return
        _written_bytes += 4 * take
        directory = _DIR
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
