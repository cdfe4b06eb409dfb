"""Logging helpers: the library only ever uses the "ccoll" logger and never configures handlers."""
from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger("ccoll")

_warned: set[str] = set()
_warned_lock = threading.Lock()


class _LastRank:
    """The rank read from the last live process group: what :func:`rank` answers after the script destroyed
    its group (ccoll's exit report runs then) in a process whose launcher set no RANK variable
    (``init_process_group(init_method=..., rank=...)``), where every rank would otherwise say 0."""

    value: int | None = None


_last_rank = _LastRank()


def rank() -> int:
    """Best-effort global rank without importing anything heavy (for log filtering only): the live process
    group's, else the last group's this process saw, else the launcher's variables, else 0."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        _last_rank.value = r = dist.get_rank()
        return r
    if _last_rank.value is not None:
        return _last_rank.value
    for key in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def warn_once(key: str, msg: str, *args) -> None:
    """Warn once per process for a given key, so a per-call condition does not flood the log."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(msg, *args)


def tell(msg: str, *args) -> None:
    """A line for the user, from rank 0, at INFO, marked so ccoll-run's handler shows it (the zero-code
    path's only channel: the user never called ccoll, so a silent success would look like no effect)."""
    if rank() == 0:
        logger.info(msg, *args, extra={"ccoll_user": True})
