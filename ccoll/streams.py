"""Where a compressed collective's codec work runs on a GPU, and how it is ordered.

On CUDA the codec kernels of a collective run on a ccoll side stream (one per device, created lazily),
not on the caller's stream, so ``async_op=True`` overlaps encode/decode with the caller's compute
(otherwise the caller's later kernels would queue behind the network). Ordering is by CUDA events, never
by host synchronisation:

1. at the call, an event recorded on the caller's current stream (its inputs are ready) is waited for
   by the side stream before any codec work;
2. codec work and the communication calls are issued while the side stream is current: NCCL orders
   its own stream after the current stream at issue, and ``work.wait()`` makes the *current* stream wait
   for NCCL, so every wait on a request is done with the side stream current (:meth:`Call.on_side`);
3. the end of decoding records a "done" event on the side stream; the caller's stream waits for it
   only when the handle's ``wait()`` runs (:meth:`Call.join`), so compute issued between the call and
   ``wait()`` runs concurrently. Like torch's ``Work.wait()``, *every* ``wait()`` orders the stream
   current in its thread, also when another thread already finished the call;
4. the current stream is thread-local (a new thread starts on the default stream), so a wait done on
   a ccoll waiter thread (``Handle.wait(timeout=)``, ``Handle.get_future()``) would otherwise order
   the waiter's default stream, not the caller's: a consumer on a non-default stream could read the
   results before decoding finished. The caller's stream is captured when it calls
   (:class:`Caller`) and made current on the waiter thread, so the join, a native request's
   ``wait()`` and the future's completion all land on it; the future carries the device (torch's
   CUDA-aware future, as ``Work.get_future()`` on NCCL): any thread that waits for it, on any stream,
   is ordered after the results, and ``then`` callbacks run on streams ordered after them;
5. tensors written or read on the side stream are ``record_stream``-ed there (:meth:`Call.keep`):
   the caller's tensors and the error-feedback residuals (which may come from another stream: restored
   from a checkpoint, packed by ``ccoll.ddp``) and weight-delta reconstructions, so the caching
   allocator cannot hand their memory to someone else while codec work still reads/writes it, even
   when Python drops them before the allocating stream is ordered after the side stream.

Stats seconds on CUDA are the elapsed time between an event at the call (caller's stream) and the done
event (native calls: :meth:`Call.mark_done` on the stream that waited for the native work), measured lazily when the stats are read (:class:`ccoll.stats` resolves them): no synchronisation
on the hot path. On CPU every method is a no-op and seconds are ``time.perf_counter`` differences.

The ordering logic (:class:`Call`, :class:`Caller`) is written against a tiny device API
(:class:`CudaApi`), so tests drive it on CPU through :func:`_api_for`: a recording fake
(tests/dist/test_collectives_streams.py: which calls, on which stream) and a happens-before model of
streams, events and the caching allocator with per-thread current streams (tests/streamcheck.py,
tests/dist/test_streams_hb.py: every read ordered after its producer, nothing freed while another
stream may use it, on every async path). The real API needs a GPU (python -m ccoll.gpucheck exercises it).
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Iterator

import torch

from .once import once


class CudaApi:
    """The stream/event primitives :class:`Call` uses, on torch.cuda."""

    def __init__(self) -> None:
        self._side: dict[int, Any] = {}
        self._lock = threading.Lock()

    def side_stream(self, device: torch.device) -> Any:
        index = device.index if device.index is not None else torch.cuda.current_device()
        with self._lock:
            s = self._side.get(index)
            if s is None:
                s = self._side[index] = torch.cuda.Stream(device=index)
            return s

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def record(self, stream: Any, timing: bool = False) -> Any:
        ev = torch.cuda.Event(enable_timing=timing)
        ev.record(stream)
        return ev

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def use(self, stream: Any):
        return torch.cuda.stream(stream)

    def keep(self, tensor: torch.Tensor, stream: Any) -> None:
        tensor.record_stream(stream)

    def query(self, event: Any) -> bool:
        return bool(event.query())

    def elapsed_s(self, start: Any, end: Any) -> float:
        end.synchronize()
        return start.elapsed_time(end) / 1000.0

    def future(self, device: torch.device) -> "torch.futures.Future":
        # CUDA-aware: set_result records an event on the completing thread's current stream, and
        # wait()/value()/then() order the waiting thread's current stream (or the callback's) after it
        return torch.futures.Future(devices=[device])

    def complete(self, fut: "torch.futures.Future", value: Any) -> None:
        fut.set_result(value)


class Call:
    """The ordering of one collective call on a device with streams (see the module docstring)."""

    __slots__ = ("api", "device", "caller", "side", "ready", "start", "done", "_waited")

    def __init__(self, api: Any, device: torch.device) -> None:
        self.api, self.device = api, device
        self.caller = api.current_stream(device)
        self.side = api.side_stream(device)
        self.start = api.record(self.caller, timing=True)  # inputs ready; also the stats start time
        self.ready = self.start
        self.done = None
        self._waited = False

    @contextlib.contextmanager
    def on_side(self) -> Iterator[None]:
        """Make the side stream current (after it waited, once, for the caller's inputs)."""
        if not self._waited:
            self.api.wait(self.side, self.ready)
            self._waited = True
        with self.api.use(self.side):
            yield

    def keep(self, *tensors: torch.Tensor) -> None:
        for t in tensors:
            self.api.keep(t, self.side)

    def finish(self) -> None:
        """Record the done event on the side stream (all codec work of the call is enqueued)."""
        self.done = self.api.record(self.side, timing=True)

    def mark_done(self) -> None:
        """The done event of a call without codec work (the native path), on the stream current at
        completion (the caller's, which waited for the native work), so its stats seconds are measured
        like a compressed call's."""
        self.done = self.api.record(self.api.current_stream(self.device), timing=True)

    def join(self) -> None:
        """Make the stream current now (the caller's, at ``wait()``) wait for the done event."""
        if self.done is not None:
            self.api.wait(self.api.current_stream(self.device), self.done)

    def is_done(self) -> bool:
        return self.done is not None and self.api.query(self.done)

    def seconds(self, t0: float) -> "LazySeconds":
        return LazySeconds(self.api, self.start, self.done)

    def wrap(self, work: Any) -> Any:
        return work if work is None else _SideWork(self, work)


class _NoOp:
    """A reusable context manager that does nothing, without running a Python frame: ``__enter__`` is
    ``NoneType`` (called with no arguments it returns None, what ``as`` binds) and ``__exit__`` an empty
    string's ``format`` (takes any arguments, returns a false value, so exceptions go through); as class
    attributes neither is bound to the instance, so ``with`` calls them as they are.
    ``contextlib.nullcontext`` runs two Python frames per ``with``, and every CPU collective enters one or
    two."""

    __slots__ = ()
    __enter__ = type(None)
    __exit__ = "".format


#: the shared no-op context manager (:class:`_NoOp`)
NO_OP = _NoOp()


class _NullCall:
    """CPU: no streams; every method is a no-op (the ones called on every collective are C no-ops, as in
    :class:`_NoOp`: ``keep(*tensors)``, ``finish()``, ``join()``, ``mark_done()`` return "" at once)."""

    __slots__ = ()
    device = None

    def on_side(self) -> _NoOp:
        return NO_OP  # one shared no-op context: nothing built per call (twice per collective)

    keep = finish = join = mark_done = "".format

    def is_done(self) -> bool:
        return True

    def seconds(self, t0: float) -> float:
        return time.perf_counter() - t0

    def wrap(self, work: Any) -> Any:
        return work


NULL = _NullCall()


class LazySeconds:
    """Elapsed seconds between two CUDA events, read only when the stats are (``ready()`` says whether
    reading would block)."""

    __slots__ = ("api", "start", "end")

    def __init__(self, api: Any, start: Any, end: Any) -> None:
        self.api, self.start, self.end = api, start, end

    def ready(self) -> bool:
        return self.end is None or self.api.query(self.end)

    def seconds(self) -> float:
        return 0.0 if self.end is None else self.api.elapsed_s(self.start, self.end)


class _SideWork:
    """A request whose ``wait()`` runs with the side stream current (NCCL: the side stream waits for the
    communication, the caller's stream does not). Everything else is the request's."""

    __slots__ = ("call", "work")

    def __init__(self, call: Call, work: Any) -> None:
        self.call, self.work = call, work

    def wait(self, *args: Any) -> Any:
        with self.call.on_side():
            return self.work.wait(*args)

    def is_completed(self) -> bool:
        return self.work.is_completed()

    def get_future(self) -> Any:
        return self.work.get_future()


_cuda_api = once(lambda: CudaApi())  # made on the first CUDA call: CPU-only runs never touch torch.cuda


_CPU = torch.device("cpu")


def _api_for(device: torch.device) -> Any:
    """The device API for ``device``: :class:`CudaApi` for CUDA tensors, None (no streams) otherwise.
    Tests replace this to drive :class:`Call` with a recording fake on CPU. (The CPU test first: comparing
    devices is a C call, reading ``device.type`` builds a string, ~0.3 us of every call's host path.)"""
    if device == _CPU:
        return None
    return _cuda_api() if device.type == "cuda" else None


class Caller:
    """The stream current in the thread that called ``wait(timeout=)`` or ``get_future()``, captured
    then, so a ccoll waiter thread can finish the call *on it*: inside :meth:`current` the waiter's
    own current stream (thread-local; a new thread starts on the default stream) is the caller's, so
    :meth:`Call.join`, a native request's ``wait()`` and :meth:`complete` all order the caller's
    stream, not the waiter's. No device API (CPU): every method is plain."""

    __slots__ = ("api", "device", "stream")

    def __init__(self, device: torch.device | None) -> None:
        self.device = device
        self.api = None if device is None else _api_for(device)
        self.stream = None if self.api is None else self.api.current_stream(device)

    def current(self):
        return contextlib.nullcontext() if self.api is None else self.api.use(self.stream)

    def future(self) -> "torch.futures.Future":
        """A future that carries the device (CUDA: torch's CUDA-aware future)."""
        return torch.futures.Future() if self.api is None else self.api.future(self.device)

    def complete(self, fut: "torch.futures.Future", value: Any) -> None:
        """Set ``fut``'s result from inside :meth:`current` (CUDA: its event is on the caller's stream,
        after the call's done event, so any stream that waits for the future is ordered after decoding)."""
        if self.api is None:
            fut.set_result(value)
        else:
            self.api.complete(fut, value)


def caller(device: torch.device | None) -> Caller:
    """The calling thread's current stream on ``device`` (None: no device, nothing captured)."""
    return Caller(device)


def begin(device: torch.device) -> Call | _NullCall:
    """The ordering object of one collective call on ``device`` (records "inputs ready" now)."""
    api = _api_for(device)
    return NULL if api is None else Call(api, device)


__all__ = ["Call", "Caller", "CudaApi", "LazySeconds", "NO_OP", "NULL", "begin", "caller"]
