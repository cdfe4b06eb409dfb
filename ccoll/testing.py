"""Test and measurement helpers that need no process group: :func:`simulated_world`.

``simulated_world(p, fn, *args)`` runs ``fn(rank, group, *args)`` for p ranks as threads of this process
over the in-memory transport (:mod:`ccoll.transports.memory`). The collectives run unchanged (the group
object carries its transport), so CI tests p = 2..64 in seconds and one GPU measures the algorithm at
p = 8..256. Per-thread state behaves per rank: ``ccoll.stats.dimension`` is a context variable (each
thread starts from the default), the patch's state is thread-local. The stats table itself is per
process, so it sums over the simulated ranks.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

import torch

from .errors import TransportError
from .transports.memory import MemoryGroup, MemoryWorld


#: how long after ``timeout_s`` the run itself is abandoned (lets a rank's wait timeout be the error)
_GRACE_S = 5.0


def simulated_world(world_size: int, fn: Callable[..., Any], *args: Any, device: Any = "cpu",
                    timeout_s: float = 120.0) -> list:
    """Run ``fn(rank, group, *args)`` on ``world_size`` threads; return the results in rank order.

    ``device``: "cpu" or one CUDA device; each thread makes it current (``torch.cuda.set_device``), so
    ``fn`` allocates there. The first rank that raises stops the others' waits (they raise
    :class:`~ccoll.errors.TransportError`), and its exception is re-raised here with its rank added to the
    message (the original is chained). After ``timeout_s`` (the whole run, and every wait) a
    TransportError is raised instead of hanging (the run is abandoned a few seconds later still; threads
    left running are daemons, stopped at their next wait)."""
    dev = torch.device(device)
    world = MemoryWorld(world_size, timeout_s)
    results: list = [None] * world.world_size
    errors: list[tuple[int, BaseException]] = []
    lock = threading.Lock()

    def run(rank: int, group: MemoryGroup) -> None:
        try:
            if dev.type == "cuda":
                torch.cuda.set_device(dev)
            results[rank] = fn(rank, group, *args)
        except BaseException as e:  # noqa: BLE001 - reported to the caller below
            with lock:
                errors.append((rank, e))
            world.abort(f"rank {rank} raised {type(e).__name__}: {e}")

    threads = [
        threading.Thread(target=run, args=(r, g), name=f"ccoll-sim-rank{r}", daemon=True)
        for r, g in enumerate(world.groups)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s + _GRACE_S  # a rank's own wait timeout reports first
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    alive = [r for r, t in enumerate(threads) if t.is_alive()]
    if errors:
        # the root cause is the first error that is not another rank's "stopped waiting" echo
        first = next((e for e in errors if not (isinstance(e[1], TransportError) and "stopped waiting" in str(e[1]))), errors[0])
        rank, exc = first
        if _reconstructible(exc):
            raise type(exc)(f"rank {rank}: {exc}") from exc
        raise exc
    if alive:
        world.abort("the simulated world timed out")
        raise TransportError(f"simulated world: ranks {alive} still running after {timeout_s:g} s")
    return results


def _reconstructible(exc: BaseException) -> bool:
    """Whether ``type(exc)(message)`` builds an equivalent exception (so the rank can be added)."""
    try:
        type(exc)("x")
    except Exception:  # noqa: BLE001
        return False
    return True


__all__ = ["simulated_world"]
