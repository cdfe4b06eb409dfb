"""What the user is told about what ccoll did: one line per dimension at its first compressed call, one
warning when a compressing policy compressed nothing (with every likely cause), one table of the traffic
at exit, and a why in the stats file.

Lines for the user go to ``logging.getLogger("ccoll")`` from rank 0 at INFO, marked ``ccoll_user=True`` in
the record (``ccoll-run`` shows those and warnings on stderr, ``CCOLL_LOG=off`` silences them; see
ccoll/_activate/sitecustomize.py). Why each one exists: under ``ccoll-run`` the user never called ccoll,
so a silent success would look like no effect and a silent miss like success.

- At the first compressed call of each dimension, whoever made it (the patch, ccoll's DDP hook, FSDP2's
  comms, the explicit API): :mod:`ccoll.stats` calls :func:`_on_row` when it creates a row, so this costs
  nothing on the calls after the first::

      ccoll: dp compressing: all_reduce int4:block=64,round=nearest,seed=0 (first call: 1.05 MB -> 0.15 MB, 7.11x)

- ``ccoll.patch`` calls :func:`on_install` at install and :func:`on_step` after every counted step; at
  ``NOTHING_WARNING_STEPS`` steps after the longest warm-up, a compressing policy that compressed nothing
  gets one warning from rank 0 naming every cause found (:func:`diagnose`). A run with no optimizer steps
  (a plain torch script) gets it at exit instead.
- At exit, rank 0 prints :func:`summary`'s table -- its own traffic, per dimension, op and codec (the other
  ranks' are in their ``CCOLL_STATS`` files; gathering them at exit would need a collective every rank is
  sure to reach, which exit does not promise) -- when the process recorded a call on a parallel or the
  default dimension: not in a launcher (torchrun's, deepspeed's) that never joined a group, nor in a
  process that only made explicit ``ccoll.all_reduce`` calls outside any dimension.

With ``CCOLL_STATS`` set, every rank that joined a process group writes its file at exit, also when nothing
was compressed; the file's ``"summary"`` (:func:`outcome`) says whether anything was and, if not, why.
"""
from __future__ import annotations

import atexit
import functools
import sys
import threading
import weakref
from typing import Any

from . import stats as _stats
from .log import logger, rank, tell, warn_once

__all__ = ["tell", "on_install", "on_step", "diagnose", "warn_if_nothing", "outcome", "summary", "Summary",
           "NOTHING_WARNING_STEPS"]

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


def _joined_now() -> bool:
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def _compressed_calls(rows: list[dict]) -> int:
    return sum(r["calls"] for r in rows if r["codec"] != "native")


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


def _ratio(raw: float, wire: float) -> float:
    """raw / wire; 1.0 for calls that carried no bytes (a barrier counted as native)."""
    if wire:
        return raw / wire
    return 1.0 if not raw else float("inf")


def _on_row(dim: str, op: str, codec: str, raw_bytes: int, wire_bytes: int, calls: int) -> None:
    """A new stats row (ccoll.stats calls this on row creation only): remember that a group was joined and
    the rank (the exit report may run after the script destroyed its group), and announce the dimension's
    first compressed call."""
    if not _seen.joined and _joined_now():
        _seen.joined = True
    if codec == "native" or dim in _announced:
        rank()  # remembers the live group's rank (ccoll.log)
        return
    with _lock:
        if dim in _announced:
            return
        _announced.add(dim)
    tell("ccoll: %s compressing: %s %s (first call: %s -> %s, %.2fx)", dim, op, codec, _mb(raw_bytes),
         _mb(wire_bytes), _ratio(raw_bytes, wire_bytes))


_stats.add_row_hook(_on_row)


def on_install(st: Any) -> None:
    with _lock:
        _baseline[st] = _compressed_calls(_stats.stats())
        _current[:] = [weakref.ref(st)]


@functools.lru_cache(maxsize=8)
def _max_warmup(policy: Any) -> int:
    from .policy import DIMENSIONS, OPS

    return max((policy.rule(d, o).warmup_steps for d in DIMENSIONS for o in OPS if policy.rule(d, o).compresses),
               default=0)


def on_step(st: Any) -> None:
    """After step ``st.steps``: at the warning step, warn if nothing was compressed."""
    if not _seen.joined and _joined_now():
        _seen.joined = True
    if st.steps == _max_warmup(st.policy) + NOTHING_WARNING_STEPS:
        warn_if_nothing(st)


def _default_ops(rows: list[dict]) -> list[str]:
    """The policy ops called on unplaced groups (not the kinds ccoll always keeps exact: list-form
    all_gather, barrier, ..., whose stats op names no policy op)."""
    from .policy import OPS

    return sorted({r["op"] for r in rows if r["dim"] == "default" and r["op"] in OPS})


def _unplaced(st: Any, rows: list[dict]) -> str | None:
    """The cause when the resolver placed no group: every call ran under the ``default:`` rule. None when
    some group was placed, or when the default rule compresses every op that was called."""
    found = getattr(st.resolver, "found", None)
    if found is None or found:
        return None
    ops = _default_ops(rows)
    native = [op for op in ops if not st.policy.rule("default", op).compresses] if ops else ["any op"]
    if not native:
        return None
    return (f"no process group was placed on a parallel dimension (looked for: {st.resolver.tried()}), so every "
            f"call ran under the policy's `default:` rule, and the policy has no `default:` rule that compresses "
            f"{', '.join(native)} (none, or `default: {{codec: native}}`). Either add one, e.g. "
            f"`default: {{codec: int4:block=64}}`, to compress every group ccoll cannot place (WORLD included), "
            f"or name the groups: ccoll.patch.install(policy, resolver=...) (ccoll.resolvers.TopologyResolver / "
            f"RankSetResolver)")


def diagnose(st: Any) -> str | None:
    """Why this installation compressed nothing (None if it compressed something): every cause found,
    joined by "; " -- the models ccoll left alone, groups it could not place with no compressing
    ``default:`` rule, calls the rules keep exact -- or, when none applies, that no collective reached ccoll."""
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
    unplaced = _unplaced(st, rows)
    # the groups were not placed: that matters where calls ran on them, or where nothing else explains it
    if unplaced is not None and (not causes or _default_ops(rows)):
        causes.append(unplaced)
    # calls the rules let through exact (on the unplaced groups: only where the default rule compresses)
    kept = [r for r in rows if r["codec"] == "native" and r["dim"] not in ("default", "direct")]
    kept += [r for r in rows if r["codec"] == "native" and r["dim"] == "default" and r["op"] in _default_ops(rows)
             and st.policy.rule("default", r["op"]).compresses]
    if kept:
        causes.append("every call on " + "/".join(sorted({r["dim"] for r in kept})) + " was under min_bytes, of "
                      "an integer dtype or reduce op kept exact, in warm-up, on an op the policy keeps native, or of "
                      "a kind ccoll always keeps exact (list-form, rooted and object collectives, barrier: see "
                      "docs/TORCH_CONTRACTS.md)")
    if not causes:
        causes.append("no collective reached torch.distributed's Python functions and no DDP / FSDP2 model "
                      "was built while ccoll was installed")
    return "; ".join(causes)


def warn_if_nothing(st: Any, at_exit: bool = False) -> None:
    """A compressing policy that compressed nothing: say so once, from rank 0, with every likely cause
    (every rank runs the same script, so the other ranks' copies would only repeat it)."""
    from .policy import DIMENSIONS, OPS

    if rank() != 0:
        return
    compressing = sorted({dim for dim in DIMENSIONS for op in OPS if st.policy.rule(dim, op).compresses})
    if not compressing:
        return
    why = diagnose(st)
    if why is None:
        return
    when = (f"by the end of the run ({st.steps} optimizer steps)" if at_exit
            else f"after {st.steps} optimizer steps")
    warn_once("ccoll-unresolved", "ccoll: policy %s compresses %s, but %s nothing was compressed: %s.",
              st.policy.source, "/".join(compressing), when, why)


def outcome() -> dict | None:
    """The stats file's ``"summary"``: whether anything was compressed, the DDP / FSDP2 models seen and,
    if nothing was, why. None for a process that never joined a process group and recorded nothing (a
    launcher: it writes no file)."""
    from . import auto

    joined = _seen.joined or bool(auto.attached()) or _joined_now()
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


# --- the table ------------------------------------------------------------------------------------------
_COLUMNS = ("dim", "op", "codec", "calls", "raw", "wire", "ratio", "time")


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _cells(dim: str, op: str, codec: str, calls: int, raw: int, wire: int, seconds: float) -> tuple:
    ratio = _ratio(raw, wire)
    return (dim, op, codec, str(calls), _size(raw), _size(wire), "-" if ratio == float("inf") else f"{ratio:.2f}x",
            f"{seconds:.3f} s")


class Summary(list):
    """This process's traffic, one dict per (dim, op, codec): ``dim, op, codec, calls, raw_bytes, wire_bytes,
    ratio, seconds`` (raw: the uncompressed bytes this rank contributed; wire: the bytes it sent for them;
    seconds: the calls' time as ccoll.stats measured it). A list, so code reads the rows as they are; its
    ``str()`` is the table ccoll prints at exit (a total line per dimension with several rows)."""

    def __init__(self, rows: list[dict], rank: int):
        super().__init__(rows)
        self.rank = rank

    def __str__(self) -> str:
        lines = [_COLUMNS]
        for dim, total in _stats.by_dimension(self).items():
            mine = [r for r in self if r["dim"] == dim]
            lines += [_cells(r["dim"], r["op"], r["codec"], r["calls"], r["raw_bytes"], r["wire_bytes"],
                             r["seconds"]) for r in mine]
            if len(mine) > 1:
                lines.append(_cells(dim, "total", "", total["calls"], total["raw_bytes"], total["wire_bytes"],
                                    total["seconds"]))
        width = [max(len(line[i]) for line in lines) for i in range(len(_COLUMNS))]
        left = {"dim", "op", "codec"}
        body = ["  ".join(c.ljust(w) if name in left else c.rjust(w) for c, w, name in zip(line, width, _COLUMNS))
                .rstrip() for line in lines]
        return (f"ccoll: traffic of rank {self.rank} (its own calls; raw: bytes given to the collectives, wire: "
                f"bytes sent for them)\n" + "\n".join(body))


def summary() -> Summary:
    """This rank's traffic as a :class:`Summary`: rows to read, ``str()`` to print (what ccoll prints at exit
    on rank 0). ``ccoll.summary()``."""
    rows = [{"dim": r["dim"], "op": r["op"], "codec": r["codec"], "calls": r["calls"], "raw_bytes": r["raw_bytes"],
             "wire_bytes": r["wire_bytes"], "ratio": _ratio(r["raw_bytes"], r["wire_bytes"]),
             "seconds": r["seconds"]} for r in _stats.stats()]
    return Summary(rows, rank())


def _exit_note() -> dict | None:
    s = outcome()
    return None if s is None else {"summary": s}


_stats.add_exit_note(_exit_note)


def _at_exit() -> None:
    """Rank 0, at exit: the "nothing compressed" warning if it has not been given (a run with no optimizer
    steps), then the table. Local only: no collective runs here (the other ranks may be gone already)."""
    if rank() != 0:
        return
    st = _current[0]() if _current else None
    if st is not None and outcome() is not None:
        warn_if_nothing(st, at_exit=True)
    table = summary()
    if any(r["dim"] != "direct" for r in table):
        tell("%s", table)
    elif table:
        logger.debug("%s", table)


# registered after ccoll.stats' file writer, so it runs before it (atexit runs last-in first-out); ccoll.auto's
# release of DDP models, registered at install, runs before this one: neither changes what the table reads
atexit.register(_at_exit)
