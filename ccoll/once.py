"""``once(make)``: a process-wide value made on first use, exactly once even when threads race.

Why: several facts are expensive or must be unique per process — the CUDA stream API (one side stream
per device), whether the MPI library takes CUDA buffers (probed and logged once) — and must not be
touched at import (CPU-only runs never load torch.cuda or libmpi).

``remake_after_fork=True``: a forked child makes its own value on its first use (a thread pool, whose
threads a child does not inherit: a task submitted to the parent's pool there would never run)."""
from __future__ import annotations

import functools
import os
import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def once(make: Callable[[], T], remake_after_fork: bool = False) -> Callable[[], T]:
    lock = threading.Lock()
    made: list = []
    if remake_after_fork:
        os.register_at_fork(after_in_child=made.clear)

    @functools.wraps(make)
    def get() -> T:
        if not made:
            with lock:
                if not made:
                    made.append(make())
        return made[0]

    return get
