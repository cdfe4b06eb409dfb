"""``once(make)``: a process-wide value made on first use, exactly once even when threads race.

Why: several facts are expensive or must be unique per process — the CUDA stream API (one side stream
per device), whether the MPI library takes CUDA buffers (probed and logged once) — and must not be
touched at import (CPU-only runs never load torch.cuda or libmpi)."""
from __future__ import annotations

import functools
import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def once(make: Callable[[], T]) -> Callable[[], T]:
    lock = threading.Lock()
    made: list = []

    @functools.wraps(make)
    def get() -> T:
        if not made:
            with lock:
                if not made:
                    made.append(make())
        return made[0]

    return get
