"""Where a compressed collective's time goes: ``python -m ccoll.bench ... --breakdown [--link-rate 1gbit]``
and ``--trace DIR``.

``--breakdown`` runs a few extra (untimed by the main table) calls per row with the phase recorder of
:mod:`ccoll.collectives.phases` installed and prints, per phase and occurrence (the n-th
``ccoll.exchange.all_to_all`` of a segmented all_reduce is segment n), when it started after the call
began and how long it took on this rank's host clock, and for exchanges the bytes this rank sends and
their time at the link rate. Then one line splits the call's wall time:

    wall = idle_codec + idle_host + in_flight
    in_flight = wire (bytes sent / link rate: the ideal) + slow (exchanges in flight longer than that)

``in_flight`` is the union of the intervals from each exchange's issue to when it was first seen
complete (polled at every phase boundary, else the end of its wait: an upper bound within a phase);
``idle_codec`` / ``idle_host`` are the times when no exchange was in flight and this rank's calling
thread was in codec calls / anything else (Python, copies, allocation). ``% of ideal`` = wire / wall.
Without ``--link-rate`` the wire and slow columns are n/a.

``--trace DIR`` writes one Chrome trace per rank and row (``torch.profiler``'s ``export_chrome_trace``)
of one extra call, where ccoll's phase labels show as ranges on the threads that ran them.
"""
from __future__ import annotations

import os
from collections import defaultdict

import torch

from ..collectives.phases import Recorder, recording
from .cases import Case, Collective
from .measure import timed_call
from .worlds import World

CODEC_LABELS = ("ccoll.encode", "ccoll.decode", "ccoll.decode_sum")

#: extra calls per row for the breakdown (means over them)
BREAKDOWN_CALLS = 3


def parse_rate(text: str) -> float:
    """A link rate as tc writes it (``1gbit``, ``100mbit``, ``800kbit``, ``125MBps``) -> bits/s."""
    s = text.strip().lower()
    units = (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("gbps", 8e9), ("mbps", 8e6), ("kbps", 8e3), ("bit", 1.0))
    for suffix, mult in units:
        if s.endswith(suffix):
            return float(s[: -len(suffix)]) * mult
    return float(s)


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -float("inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _overlap(a: float, b: float, busy: list[tuple[float, float]]) -> float:
    """Length of [a, b) not covered by ``busy`` (sorted, disjoint)."""
    free = b - a
    for x, y in busy:
        free -= max(0.0, min(b, y) - max(a, x))
    return free


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def decompose(events: list, t0: float, t1: float, link_bps: float | None) -> dict:
    """One call's split (seconds) from its recorded phases (see the module docstring)."""
    wall = t1 - t0
    flights, pending = [], {}
    sent = 0
    for label, n, a, b, nbytes in events:
        if label.startswith("ccoll.exchange."):
            pending[(label[len("ccoll.exchange."):], n)] = a
            sent += nbytes
        elif label.startswith("ccoll.done.") or label.startswith("ccoll.wait."):
            start = pending.pop((label.split(".", 2)[2], n), None)  # the first of done / wait ends it
            if start is not None:
                flights.append((start, b))
    for (op, n), start in pending.items():  # never waited inside the call: in flight to its end
        flights.append((start, t1))
    busy = _merge(flights)
    in_flight = _union(flights)
    codec_free = sum(_overlap(a, b, busy) for label, n, a, b, _ in events if label in CODEC_LABELS)
    codec = sum(b - a for label, n, a, b, _ in events if label in CODEC_LABELS)
    wire = sent * 8 / link_bps if link_bps else None
    return {"wall": wall, "codec": codec, "idle_codec": codec_free, "idle_host": wall - in_flight - codec_free,
            "in_flight": in_flight, "wire": wire, "slow": None if wire is None else in_flight - wire,
            "sent_bytes": sent,
            "wait": sum(b - a for label, n, a, b, _ in events if label.startswith("ccoll.wait."))}


def measure_breakdown(w: World, coll: Collective, case: Case, codec, min_bytes: int, link_bps: float | None,
                      calls: int = BREAKDOWN_CALLS) -> dict:
    """Run ``calls`` extra calls with the recorder installed; means of :func:`decompose` and of each
    phase occurrence over them (this rank)."""
    rec = Recorder()
    spans = []
    with recording(rec):
        for _ in range(calls):
            spans.append(timed_call(w, coll, case, codec, min_bytes))
    per_call = [c for c in rec.calls if c]
    parts: dict[str, float] = defaultdict(float)
    phases: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0.0, 0, 0])
    k = 0
    for (t0, t1) in spans:
        events = [e for call in per_call for e in call if t0 <= e[2] <= t1]
        if not events:
            continue
        k += 1
        for name, v in decompose(events, t0, t1, link_bps).items():
            parts[name] += v if v is not None else float("nan")
        for label, n, a, b, nbytes in events:
            row = phases[(label, n)]
            row[0] += a - t0
            row[1] += b - a
            row[2] += nbytes
            row[3] += 1
    k = max(k, 1)
    return {"calls": k, "split": {name: v / k for name, v in parts.items()},
            "phases": [(label, n, row[0] / row[3], row[1] / row[3], row[2] // row[3])
                       for (label, n), row in sorted(phases.items(), key=lambda kv: kv[1][0] / kv[1][3])]}


def format_breakdown(row: dict, bd: dict, link_bps: float | None) -> list[str]:
    """Lines for rank 0's report of one row."""
    ms = 1e3
    s = bd["split"]

    def g(v):
        return "n/a" if v is None or v != v else f"{v * ms:.1f}"

    lines = [f"# breakdown {row['collective']} {row['size_bytes']} B {row['codec']} (rank 0, mean of {bd['calls']} calls)",
             "#   phase                       #  start(ms)  host(ms)  sent(B)  wire(ms)"]
    for label, n, start, dur, nbytes in bd["phases"]:
        if label.startswith("ccoll.done."):
            continue
        wire = f"{nbytes * 8 / link_bps * ms:.1f}" if link_bps and nbytes else ""
        lines.append(f"#   {label:<26} {n:>2} {start * ms:>10.1f} {dur * ms:>9.1f} {nbytes if nbytes else '':>8} {wire:>9}")
    pct = (s["wire"] / s["wall"] * 100) if s.get("wire") and s["wall"] > 0 else None
    lines.append(f"#   wall {g(s['wall'])} ms = idle_codec {g(s['idle_codec'])} + idle_host {g(s['idle_host'])} + "
                 f"in_flight {g(s['in_flight'])} (= wire {g(s['wire'])} + slow {g(s['slow'])}); codec total "
                 f"{g(s['codec'])}, waiting {g(s['wait'])}; % of ideal "
                 f"{'n/a' if pct is None else f'{pct:.0f}%'}")
    return lines


def write_trace(w: World, coll: Collective, case: Case, codec, min_bytes: int, directory: str, name: str) -> str:
    """One extra call under ``torch.profiler``; its Chrome trace written to ``directory``."""
    from torch.profiler import ProfilerActivity, profile

    os.makedirs(directory, exist_ok=True)
    if case.in_place:
        case.out.copy_(case.inp)
    w.barrier()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if w.device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        coll.run(w, case, codec, min_bytes)
        w.sync()
    path = os.path.join(directory, f"{name}.rank{w.rank}.json")
    prof.export_chrome_trace(path)
    return path


__all__ = ["decompose", "format_breakdown", "measure_breakdown", "parse_rate", "write_trace"]
