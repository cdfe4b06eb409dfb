"""What asynchronous transport and collective calls return: a :class:`Handle` shaped like torch's
``Work``, whose ``wait()`` finishes the communication and then the caller's completion step once.
Kept in its own module because every layer above the transports hands these back to users.
"""
from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, Callable

import torch

from .. import streams
from ..errors import TransportError


class Handle:
    """What async calls return, shaped like torch's ``Work`` so code written for torch keeps working
    (DDP comm hooks need ``get_future()``; pipelining schedules call ``wait()`` and ``is_completed()``).

    ``wait(timeout=None)`` finishes the communication and then runs ``then`` (decoding, copying back,
    recording stats) exactly once, whichever thread gets there first; ``timeout`` (seconds or a
    ``datetime.timedelta``) raises :class:`~ccoll.errors.TransportError` if the communication is not
    done in time (``then`` has not run; waiting again is allowed). ``is_completed()`` says whether the
    communication is done, so ``wait()`` will not block on the network. ``get_future()`` returns a
    ``torch.futures.Future`` completed with ``outputs`` (the list of result tensors, torch's convention)
    once ``then`` has run, without the caller having to call ``wait()``.

    ``works`` are the underlying requests (torch ``Work`` objects, MPI requests, or other Handles).

    Streams (CUDA; :mod:`ccoll.streams`), as torch's ``Work``: every ``wait()`` leaves the stream
    current in the waiting thread ordered after the results (``join``, called by each ``wait()`` that
    did not run ``then`` itself, which orders its own stream). The waits that run on a ccoll waiter
    thread (``wait(timeout=)``, ``get_future()``) run with the *caller's* stream, captured when it
    called, made current there (a new thread's current stream is the default stream, so joining there
    would order nobody's stream), and the future carries the device: it completes on the caller's
    stream, and a thread that waits for it on any stream is ordered after decoding (torch's CUDA
    future semantics, as ``Work.get_future()`` on NCCL).
    """

    __slots__ = ("_works", "_then", "_done", "_result", "_outputs", "_lock", "_future_lock", "_future", "_join",
                 "_device")

    def __init__(self, works: list | tuple = (), then: Callable[[], Any] | None = None,
                 outputs: list | None = None, join: Callable[[], None] | None = None):
        self._works = [w for w in works if w is not None]
        self._then = then
        self._done = False
        self._result = None
        self._outputs = list(outputs) if outputs is not None else []
        self._lock = threading.RLock()  # held while waiting: finishing runs once
        self._future_lock = threading.Lock()  # never held while waiting
        self._future = None
        self._join = join  # orders the current stream after the results (a finished call's done event)
        self._device = next((t.device for t in self._outputs if isinstance(t, torch.Tensor)), None)

    def wait(self, timeout: Any = None) -> bool:
        if timeout is not None and not self._done:
            # on a ccoll waiter thread: polling is_completed() would never end on gloo's point-to-point
            # works, which complete only inside their own wait()
            seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
            try:
                _submit_wait(self, streams.caller(self._device)).result(timeout=seconds)
            except concurrent.futures.TimeoutError:
                raise TransportError(f"ccoll: communication not complete after {seconds:g} s") from None
            return True
        ran = False
        if not self._done:
            with self._lock:
                if not self._done:
                    for w in self._works:
                        _wait_one(w)
                    # finished requests are dropped now: a gloo work keeps its tensors until destroyed, and
                    # one destroyed during interpreter teardown (a handle kept by a future or a frame)
                    # aborts the process
                    works, self._works = self._works, []
                    then, self._then = self._then, None
                    if then is not None:
                        self._result = then()
                    self._done = ran = True
        if not ran and self._join is not None:
            self._join()  # finished by another wait(): this thread's stream still has to be ordered
        return True

    def is_completed(self) -> bool:
        if self._done:
            return True
        works = self._works
        return all(_completed_one(w) for w in works)

    def is_success(self) -> bool:
        return self.is_completed()

    def result(self) -> Any:
        """Wait, then return what ``then`` returned (e.g. the received tensor of an irecv)."""
        self.wait()
        return self._result

    def value(self) -> list:
        """Wait, then return the output tensors (the future's value)."""
        self.wait()
        return self._outputs

    def get_future(self) -> "torch.futures.Future":
        """A future completed with the output tensors once this handle has finished, waited for on a
        ccoll waiter thread with the stream current here (now) made current there, and completed on
        it; on CUDA the future carries the device (see the class docstring). Why not chain on the c10d
        works' own futures: their callbacks run on the backend's worker thread before the work counts
        as finished (gloo), so finishing a ccoll handle there (waiting for the works, then decoding)
        blocks that thread on itself and a DDP backward never ends."""
        with self._future_lock:
            if self._future is not None:
                return self._future
            who = streams.caller(self._device)
            fut: torch.futures.Future = who.future()
            self._future = fut

        def failed(cf: "concurrent.futures.Future") -> None:
            error = cf.exception()
            if error is not None and not fut.done():
                fut.set_exception(error)

        if self._done:
            self.wait()  # joins this thread's (the caller's) stream
            who.complete(fut, self._outputs)
        else:
            _submit_wait(self, who, lambda: who.complete(fut, self._outputs)).add_done_callback(failed)
        return fut


def _submit_wait(handle: "Handle", who: "streams.Caller",
                 complete: Callable[[], None] | None = None) -> "concurrent.futures.Future":
    """``handle.wait()`` (then ``complete()``) on its own daemon thread, with the caller's stream
    ``who`` current there. Not a bounded pool: a wait may block until other ranks' waits run (the
    in-memory transport of ``simulated_world`` is one rendezvous per collective), so a pool smaller
    than the number of outstanding handles could deadlock."""
    cf: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            with who.current():
                handle.wait()
                if complete is not None:
                    complete()
        except BaseException as e:  # noqa: BLE001 - delivered through the future
            cf.set_exception(e)
        else:
            cf.set_result(None)

    threading.Thread(target=run, name="ccoll-wait", daemon=True).start()
    return cf



def _wait_one(w: Any) -> None:
    if hasattr(w, "Wait"):  # mpi4py Request
        w.Wait()
    else:
        w.wait()


def _completed_one(w: Any) -> bool:
    if hasattr(w, "Test"):  # mpi4py Request: Test() completes it when done, which is what we want
        return bool(w.Test())
    return bool(w.is_completed())


def done_handle(then: Callable[[], Any] | None = None, outputs: list | None = None) -> Handle:
    """A handle for work that already finished (world size 1, or a synchronous fallback)."""
    return Handle((), then, outputs)


__all__ = ["Handle", "done_handle"]
