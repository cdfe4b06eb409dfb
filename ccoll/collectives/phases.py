"""The phases of a compressed call, as the profiler and the bench's breakdown see them.

Every compressed call runs the same few kinds of work: codec calls (``ccoll.encode``,
``ccoll.decode``, ``ccoll.decode_sum``), the issue of each exchange (``ccoll.exchange.<op>``, e.g.
``ccoll.exchange.all_to_all``) and the wait for it (``ccoll.wait.<op>``; a blocking exchange, as the
variable-size path's, is all in its ``ccoll.exchange.<op>`` range). Rather than label each
call site of each algorithm, :func:`labelled` wraps the call's codec and transport in thin proxies
that label every one of those calls, so every algorithm that takes ``(c, tr)`` is labelled by the
one line in :class:`~ccoll.collectives.call.Run` that asks for them.

Cost when nothing listens: :func:`labelled` is one check of ``torch.autograd._profiler_enabled()``
and of the breakdown recorder per call, and returns the codec and transport themselves (no proxy,
no per-phase cost). When a ``torch.profiler`` runs, each phase is a ``record_function`` range on the
thread that runs it (the waits of an async call land on the thread that calls ``wait()``).

The breakdown (:class:`Recorder`, used by ``python -m ccoll.bench --breakdown``) keeps, per phase
and per occurrence within a call (the n-th ``ccoll.exchange.all_to_all`` of a segmented all_reduce
is segment n), the host-clock interval and, for exchanges, the bytes this rank sends.
"""
from __future__ import annotations

import threading
import time
from typing import Any

import torch

#: the breakdown recorder in effect (None: nothing records); set by :func:`recording`
class _Listening:
    """The bench's recorder while ``recording`` is active in this process (None otherwise)."""

    recorder: "Recorder | None" = None


_listening = _Listening()


class Recorder:
    """Phase intervals of the calls made while it is installed: ``calls`` is one list per call of
    ``(label, ordinal, t0, t1, sent_bytes)`` (host clock, seconds)."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, int, float, float, int]]] = []
        self.lock = threading.Lock()

    def new_call(self) -> list:
        events: list = []
        with self.lock:
            self.calls.append(events)
        return events


class recording:
    """``with recording(rec):`` installs ``rec`` for the calls made inside (one recorder at a time)."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec

    def __enter__(self) -> Recorder:
        _listening.recorder = self.rec
        return self.rec

    def __exit__(self, *exc: Any) -> None:
        _listening.recorder = None


def labelled(c: Any, tr: Any) -> tuple[Any, Any]:
    """``(c, tr)`` as they are when no profiler and no recorder listens (the common case: one branch),
    else proxies that label and time each phase of this one call."""
    if _listening.recorder is None and not torch.autograd._profiler_enabled():
        return c, tr
    phases = _Phases(_listening.recorder)
    return _Codec(c, phases), (tr if tr is None else _Transport(tr, phases))


class _Phases:
    """One call's phases: a profiler range each (when the profiler runs) and a recorded interval
    (when a recorder is installed), numbered per label in issue order."""

    __slots__ = ("events", "counts", "profiling", "pending")

    def __init__(self, rec: "Recorder | None") -> None:
        self.events = rec.new_call() if rec is not None else None
        self.counts: dict[str, int] = {}
        self.profiling = torch.autograd._profiler_enabled()
        self.pending: list[_Wait] = []  # recorded exchanges not yet seen complete

    def poll(self) -> None:
        """Record ``ccoll.done.<op>`` for each exchange now complete (checked at every phase boundary,
        so an exchange that finished while this thread encoded is not counted in flight until its
        wait: the breakdown's in-flight time is then within one phase of the truth)."""
        now, still = time.perf_counter(), []
        for w in self.pending:
            try:
                done = w._work.is_completed()
            except Exception:  # noqa: BLE001 - a request that cannot say: its wait() ends its flight
                done = False
            if done:
                self.events.append(("ccoll.done." + w._label[len("ccoll.wait."):], w._n, now, now, 0))
            else:
                still.append(w)
        self.pending = still

    def run(self, label: str, fn: Any, *args: Any, sent: int = 0, quiet: bool = False, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` as the phase ``label``; ``quiet``: with torch's own events off inside
        (an exchange's payload traffic: the patch records the backend event of the caller's call instead,
        ccoll.patch.events)."""
        n = self.counts.get(label, 0)
        self.counts[label] = n + 1
        t0 = time.perf_counter()
        if self.profiling:
            with torch.autograd.profiler.record_function(label):
                if quiet:
                    with torch_events_off():
                        out = fn(*args, **kwargs)
                else:
                    out = fn(*args, **kwargs)
        else:
            out = fn(*args, **kwargs)
        if self.events is not None:
            self.events.append((label, n, t0, time.perf_counter(), sent))
            self.poll()
        return out


class torch_events_off:
    """``with torch_events_off():`` torch's record functions off on this thread inside (the payload traffic
    of a compressed call while a profiler runs: its backend events, ``gloo:all_gather`` of uint8 payloads,
    would stand for the caller's call with the wrong op and shapes; ccoll.patch.events records the right one).
    Only used while a profiler runs, when record functions are on."""

    __slots__ = ()

    def __enter__(self) -> None:
        torch.autograd._enable_record_function(False)

    def __exit__(self, *exc: Any) -> None:
        torch.autograd._enable_record_function(True)


class _Codec:
    """The call's codec with its three batched entry points labelled; everything else passes through."""

    def __init__(self, c: Any, phases: _Phases) -> None:
        self._c, self._phases = c, phases

    def __getattr__(self, name: str) -> Any:
        return getattr(self._c, name)

    def encode_rows(self, *args: Any, **kwargs: Any) -> Any:
        return self._phases.run("ccoll.encode", self._c.encode_rows, *args, **kwargs)

    def decode_rows(self, *args: Any, **kwargs: Any) -> Any:
        return self._phases.run("ccoll.decode", self._c.decode_rows, *args, **kwargs)

    def decode_sum(self, *args: Any, **kwargs: Any) -> Any:
        return self._phases.run("ccoll.decode_sum", self._c.decode_sum, *args, **kwargs)


#: transport calls that issue an exchange -> bytes this rank sends, from (first tensor arg numel, p)
_EXCHANGES = {
    "all_to_all": lambda recv, send, p: send.numel() * send.element_size() * (p - 1) // p,
    "all_gather": lambda out, inp, p: inp.numel() * inp.element_size() * (p - 1),
    "broadcast": lambda buf, root, p: buf.numel() * buf.element_size(),
    "isend": lambda buf, peer, p: buf.numel() * buf.element_size(),
    "irecv": lambda buf, peer, p: 0,
}


def is_labelled(tr: Any) -> bool:
    """Whether ``tr`` is a labelled transport (:func:`labelled` returned a proxy: a profiler or the bench's
    recorder listens). Algorithms that would issue a lone sync call's exchange sync issue it async and wait
    for it then, so the phases read as they always have (``ccoll.wait.<op>`` after ``ccoll.exchange.<op>``)."""
    return type(tr) is _Transport


class _Transport:
    """The call's transport with each exchange labelled (``ccoll.exchange.<op>`` around the issue)
    and the returned request's ``wait()`` labelled ``ccoll.wait.<op>``."""

    def __init__(self, tr: Any, phases: _Phases) -> None:
        self._tr, self._phases = tr, phases
        self.unlabelled = tr  # what per-group state (salt counters) is keyed by

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._tr, name)
        sent_of = _EXCHANGES.get(name)
        if sent_of is None:
            return attr
        phases, p = self._phases, self._tr.world_size

        def issue(*args: Any, **kwargs: Any) -> Any:
            try:
                sent = sent_of(args[0], args[1], p)
            except (IndexError, AttributeError, TypeError):
                sent = 0
            n = phases.counts.get("ccoll.exchange." + name, 0)
            work = phases.run("ccoll.exchange." + name, attr, *args, sent=sent, quiet=True, **kwargs)
            if work is None:
                return None
            w = _Wait(work, phases, "ccoll.wait." + name, n)
            if phases.events is not None:
                phases.pending.append(w)
            return w

        return issue


class _Wait:
    """A transport request whose ``wait()`` is a labelled phase; everything else passes through."""

    def __init__(self, work: Any, phases: _Phases, label: str, n: int) -> None:
        self._work, self._phases, self._label, self._n = work, phases, label, n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        phases = self._phases
        if self in phases.pending:
            phases.pending.remove(self)
        return phases.run(self._label, self._work.wait, *args, **kwargs)


__all__ = ["Recorder", "labelled", "recording", "torch_events_off"]
