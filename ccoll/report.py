"""What the user is told about what ccoll did: one log line per dimension once it compresses, one warning
when a compressing policy compressed nothing (with the likely cause), and a why in the stats file.

``ccoll.patch`` calls :func:`on_install` at install and :func:`on_step` after every counted step. Lines
for the user go to ``logging.getLogger("ccoll")`` from rank 0 at INFO, marked ``ccoll_user=True`` in the
record (``ccoll-run`` shows those and warnings; see ccoll/_activate/sitecustomize.py):

    ccoll: dp compressing after step 1: all_reduce int4:block=64 x2 calls; dp so far 1.05 MB -> 0.15 MB on the wire (7.11x)

With ``CCOLL_STATS`` set, every rank that joined a process group writes its file at exit, also when nothing
was compressed; the file's ``"summary"`` says whether anything was and, if not, why.
"""
from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

from . import stats as _stats
from .log import logger, tell, warn_once

__all__ = ["tell", "on_install", "on_step", "diagnose", "summary", "REPORT_STEPS", "NOTHING_WARNING_STEPS"]

#: steps (after warm-up) during which newly compressing dimensions are announced
REPORT_STEPS = 100
#: steps after which a compressing policy that compressed nothing is reported (plus its largest warm-up)
NOTHING_WARNING_STEPS = 2

_lock = threading.Lock()
_announced: set[str] = set()
# per installation: compressed calls recorded before it (so an earlier installation's traffic does not hide
# that this one compresses nothing) and whether a process group was seen
_baseline: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
_current: list = []  # [the latest _State] (weakly: a replaced installation is forgotten)
class _Seen:
    """Whether this process joined a process group (then its stats file is written, also when empty)."""

    joined = False


_seen = _Seen()


def _compressed_calls(rows: list[dict]) -> int:
    return sum(r["calls"] for r in rows if r["codec"] != "native")


def on_install(st: Any) -> None:
    with _lock:
        _baseline[st] = _compressed_calls(_stats.stats())
        _current[:] = [weakref.ref(st)]


@functools.lru_cache(maxsize=8)
def _max_warmup(policy: Any) -> int:
    from .policy import DIMENSIONS, OPS

    return max((policy.rule(d, o).warmup_steps for d in DIMENSIONS for o in OPS if policy.rule(d, o).compresses),
               default=0)


def _mib(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def on_step(st: Any) -> None:
    """After step ``st.steps``: announce dimensions that started compressing; at the warning step, warn if
    nothing was compressed."""
    import torch.distributed as dist

    if not _seen.joined and dist.is_available() and dist.is_initialized():
        _seen.joined = True
    warmup = _max_warmup(st.policy)
    if st.steps <= warmup + REPORT_STEPS:
        _announce(st.steps)
    if st.steps == warmup + NOTHING_WARNING_STEPS:
        warn_if_nothing(st)


def _announce(step: int) -> None:
    rows = _stats.stats()
    new = sorted({r["dim"] for r in rows if r["codec"] != "native"} - _announced)
    for dim in new:
        mine = [r for r in rows if r["dim"] == dim]
        raw, wire = sum(r["raw_bytes"] for r in mine), sum(r["wire_bytes"] for r in mine)
        parts = ", ".join(f"{r['op']} {r['codec']} x{r['calls']} calls" for r in mine if r["codec"] != "native")
        tell("ccoll: %s compressing after step %d: %s; %s so far %s -> %s on the wire (%.2fx)", dim, step, parts,
             dim, _mib(raw), _mib(wire), raw / wire if wire else float("inf"))
        _announced.add(dim)


def diagnose(st: Any) -> str | None:
    """Why this installation compressed nothing (None if it compressed something)."""
    rows = _stats.stats()
    with _lock:
        before = _baseline.get(st, 0)
    if _compressed_calls(rows) > before:
        return None
    from . import auto

    causes = []
    for m in auto.attached():
        what = f"{'DDP' if m.kind == 'ddp' else 'FSDP2'} model #{m.index}"
        if m.status == "user hook":
            causes.append(f"{what} uses your own comm hook ({m.detail}), which ccoll leaves alone")
        elif m.status == "opted out":
            causes.append(f"{what} is not attached: the policy says {m.detail}")
        elif m.status == "policy off":
            causes.append(f"{what} is not attached: {m.detail} in the policy")
        elif m.status == "pending":
            causes.append(f"{what} never ran forward (ccoll attaches at the first forward)")
        else:
            causes.append(f"{what} has ccoll's hook ({m.detail}) but every call was in warm-up or under min_bytes")
    if not causes:
        found = getattr(st.resolver, "found", None)
        if found is not None and not found:
            causes.append(f"no process group was placed on a parallel dimension, so only its 'default' rules "
                          f"applied. Looked for: {st.resolver.tried()}. Pass ccoll.patch.install(policy, "
                          f"resolver=...) (ccoll.resolvers.TopologyResolver / RankSetResolver) for groups built "
                          f"another way")
        elif any(r["codec"] == "native" for r in rows):
            causes.append("every call was under min_bytes, of an integer dtype or reduce op kept exact, on a "
                          "dimension/op the policy keeps native, or of a kind ccoll always keeps exact (list-form, "
                          "rooted and object collectives, barrier: see docs/TORCH_CONTRACTS.md)")
        else:
            causes.append("no collective reached torch.distributed's Python functions and no DDP / FSDP2 model "
                          "was built while ccoll was installed")
    return "; ".join(causes)


def warn_if_nothing(st: Any) -> None:
    """A compressing policy that compressed nothing: say so once, with the likely cause."""
    from .policy import OPS

    compressing = sorted({dim for dim in ("dp", "tp", "pp", "ep") for op in OPS
                          if st.policy.rule(dim, op).compresses})
    if not compressing:
        return
    why = diagnose(st)
    if why is not None:
        warn_once("ccoll-unresolved", "ccoll: policy %s compresses %s, but after %d optimizer steps nothing was "
                  "compressed: %s.", st.policy.source, "/".join(compressing), st.steps, why)


def summary() -> dict | None:
    """The stats file's ``"summary"``: None for a process that never joined a process group and
    recorded nothing (a launcher: it writes no file)."""
    import sys

    from . import auto

    dist = sys.modules.get("torch.distributed")
    joined = _seen.joined or bool(auto.attached()) or (dist is not None and dist.is_available() and dist.is_initialized())
    rows = _stats.stats()
    if not joined and not rows:
        return None
    st = _current[0]() if _current else None
    compressed = _compressed_calls(rows) > 0
    out: dict = {"compressed": compressed,
                 "models": [{"kind": m.kind, "index": m.index, "status": m.status, "detail": m.detail}
                            for m in auto.attached()]}
    if not compressed:
        out["why"] = diagnose(st) if st is not None else "ccoll.patch was not installed"
    return out


def _exit_note() -> dict | None:
    s = summary()
    return None if s is None else {"summary": s}


_stats.add_exit_note(_exit_note)
