"""Logging helpers: the library only ever uses the "ccoll" logger and never configures handlers."""
from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger("ccoll")

_warned: set[str] = set()
_warned_lock = threading.Lock()


def rank() -> int:
    """Best-effort global rank without importing anything heavy (for log filtering only)."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
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
