"""Logging helpers: the library only ever uses the "ccoll" logger and never configures handlers."""
from __future__ import annotations

import logging
import threading

logger = logging.getLogger("ccoll")

_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(key: str, msg: str, *args) -> None:
    """Warn once per process for a given key, so a per-call condition does not flood the log."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(msg, *args)

