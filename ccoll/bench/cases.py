"""The collectives table of ``python -m ccoll.bench``: per collective, how a size maps to per-rank buffers,
its busbw factor, how to build inputs and the float64 uncompressed reference, and how to run one call
(see :mod:`ccoll.bench.harness` for the conventions)."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from .worlds import World


@dataclasses.dataclass
class Case:
    """One size of one collective on this rank: buffers, the reference, and what bounds the error."""

    inp: torch.Tensor
    out: torch.Tensor
    in_place: bool  # the op writes into ``out`` which must start as a copy of ``inp``
    ref: torch.Tensor | None  # float64 expected output; None: this rank takes no part (odd sendrecv)
    scale: torch.Tensor | None  # float64 per-element magnitude for accumulation rounding
    absmax_encoded: float  # sum over the encodes on an element's path of the encoded values' absmax
    absmax_reencoded: float | None  # all_reduce: absmax of the exact result, encoded a second time
    window: list[torch.Tensor] = dataclasses.field(default_factory=list)  # sendrecv_bw's extra receive buffers
    timed: bool | None = None  # counts in time_us; default: when it has a reference (takes part)

    @property
    def participates(self) -> bool:
        return self.ref is not None if self.timed is None else self.timed


def _data(rank: int, numel: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rank ``rank``'s input: standard normal, reproducible on every rank (so each can build the
    reference locally, as nccl-tests does)."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + rank * 7919 + numel) % (2**63))
    return torch.randn(numel, generator=g, dtype=torch.float32).to(dtype)


def _absmax(t: torch.Tensor) -> float:
    return float(t.abs().max()) if t.numel() else 0.0


def _reduction(w: World, count: int, dtype: torch.dtype, seed: int, part: slice):
    """(this rank's input, float64 sum over ranks of ``part`` of every input, the sum of its magnitudes, the
    sum of the inputs' absmax): the exact reference of a reduction and the scale its error is judged by."""
    inp, ref, scale, absmax_sum = None, 0.0, 0.0, 0.0
    for r in range(w.size):
        x = _data(r, count, dtype, seed)
        if r == w.rank:
            inp = x
        x64 = x[part].to(torch.float64)
        ref, scale, absmax_sum = ref + x64, scale + x64.abs(), absmax_sum + _absmax(x)
    return inp, ref, scale, absmax_sum


def _build_all_reduce(w: World, count: int, dtype: torch.dtype, seed: int) -> Case:
    inp, ref, scale, absmax_sum = _reduction(w, count, dtype, seed, slice(None))
    return Case(inp, inp.clone(), True, ref, scale, absmax_sum, _absmax(ref))


def _build_reduce_scatter(w: World, count: int, dtype: torch.dtype, seed: int) -> Case:
    chunk = count // w.size
    inp, ref, scale, absmax_sum = _reduction(w, count, dtype, seed, slice(w.rank * chunk, (w.rank + 1) * chunk))
    return Case(inp, torch.empty(chunk, dtype=dtype), False, ref, scale, absmax_sum, None)


def _build_all_gather(w: World, count: int, dtype: torch.dtype, seed: int) -> Case:
    chunk = count // w.size
    xs = [_data(r, chunk, dtype, seed) for r in range(w.size)]
    ref = torch.cat(xs).to(torch.float64)
    return Case(xs[w.rank], torch.empty(count, dtype=dtype), False, ref, ref.abs(), max(map(_absmax, xs)), None)


def _build_broadcast(w: World, count: int, dtype: torch.dtype, seed: int) -> Case:
    inp = _data(w.rank, count, dtype, seed)  # non-root ranks start with other data, so a no-op fails
    src = inp if w.rank == 0 else _data(0, count, dtype, seed)
    ref = src.to(torch.float64)
    return Case(inp, inp.clone(), True, ref, ref.abs(), _absmax(src), None)


def _build_all_to_all(w: World, count: int, dtype: torch.dtype, seed: int) -> Case:
    chunk = count // w.size
    mine = slice(w.rank * chunk, (w.rank + 1) * chunk)
    xs = [_data(r, count, dtype, seed) for r in range(w.size)]
    ref = torch.cat([x[mine] for x in xs]).to(torch.float64)
    return Case(xs[w.rank], torch.empty(count, dtype=dtype), False, ref, ref.abs(), max(map(_absmax, xs)), None)


def _sendrecv_peer(w: World) -> int | None:
    peer = w.rank ^ 1
    return peer if peer < w.size else None


def _build_sendrecv(w: World, count: int, dtype: torch.dtype, seed: int) -> Case:
    inp = _data(w.rank, count, dtype, seed)
    peer = _sendrecv_peer(w)
    if peer is None:
        return Case(inp, torch.empty_like(inp), False, None, None, 0.0, None)
    src = _data(peer, count, dtype, seed)
    ref = src.to(torch.float64)
    return Case(inp, torch.empty_like(inp), False, ref, ref.abs(), _absmax(src), None)


#: sendrecv_bw keeps this many bytes in flight per window (OSU osu_bw: 64 messages, at most 4 MB each)
BW_WINDOW_BYTES = 64 << 20
BW_WINDOW_MAX = 64


def _bw_window(nbytes: int) -> int:
    return max(1, min(BW_WINDOW_MAX, BW_WINDOW_BYTES // max(1, nbytes)))


def _build_sendrecv_bw(w: World, count: int, dtype: torch.dtype, seed: int) -> Case:
    """Even ranks send, odd ranks receive (into ``window`` buffers; ``out`` is the last one)."""
    inp = _data(w.rank, count, dtype, seed)
    peer = _sendrecv_peer(w)
    if peer is None or w.rank % 2 == 0:
        return Case(inp, torch.empty(0, dtype=dtype), False, None, None, 0.0, None, timed=peer is not None)
    src = _data(peer, count, dtype, seed)
    ref = src.to(torch.float64)
    bufs = [torch.empty_like(inp) for _ in range(_bw_window(count * dtype.itemsize) - 1)]
    return Case(inp, torch.empty_like(inp), False, ref, ref.abs(), _absmax(src), None, bufs)


def _cc():
    from .. import collectives

    return collectives


def _run_all_reduce(w: World, case: Case, codec, min_bytes: int) -> None:
    if codec is None:
        w.native("all_reduce")(case.out)
    else:
        _cc().all_reduce(case.out, group=w.group, codec=codec, min_bytes=min_bytes)


def _run_reduce_scatter(w: World, case: Case, codec, min_bytes: int) -> None:
    if codec is None:
        w.native("reduce_scatter")(case.out, case.inp)
    else:
        _cc().reduce_scatter_tensor(case.out, case.inp, group=w.group, codec=codec, min_bytes=min_bytes)


def _run_all_gather(w: World, case: Case, codec, min_bytes: int) -> None:
    if codec is None:
        w.native("all_gather")(case.out, case.inp)
    else:
        _cc().all_gather_into_tensor(case.out, case.inp, group=w.group, codec=codec, min_bytes=min_bytes)


def _run_broadcast(w: World, case: Case, codec, min_bytes: int) -> None:
    if codec is None:
        w.native("broadcast")(case.out)
    else:
        _cc().broadcast(case.out, 0, group=w.group, codec=codec, min_bytes=min_bytes)


def _run_all_to_all(w: World, case: Case, codec, min_bytes: int) -> None:
    if codec is None:
        w.native("all_to_all")(case.out, case.inp)
    else:
        _cc().all_to_all_single(case.out, case.inp, group=w.group, codec=codec, min_bytes=min_bytes)


def _p2p(w: World, codec, min_bytes: int, *names: str) -> list:
    """The point-to-point functions ``names`` as ``fn(tensor, peer)``: the backend's own (native) or ccoll's
    with ``codec``."""
    if codec is None:
        return [w.native(name) for name in names]
    cc = _cc()
    return [lambda t, p, fn=getattr(cc, name): fn(t, p, group=w.group, codec=codec, min_bytes=min_bytes)
            for name in names]


def _run_sendrecv(w: World, case: Case, codec, min_bytes: int) -> None:
    """Ping-pong between ranks 2k and 2k+1 (an odd last rank idles): even ranks send first."""
    peer = _sendrecv_peer(w)
    if peer is None:
        return
    send, recv = _p2p(w, codec, min_bytes, "send", "recv")
    if w.rank % 2 == 0:
        send(case.inp, peer)
        recv(case.out, peer)
    else:
        recv(case.out, peer)
        send(case.inp, peer)


def _run_sendrecv_bw(w: World, case: Case, codec, min_bytes: int) -> None:
    """OSU osu_bw: a window of non-blocking sends from rank 2k to 2k+1 back to back, then a 1-element
    native acknowledgement, so the time covers the receiver having every message decoded."""
    peer = _sendrecv_peer(w)
    if peer is None:
        return
    isend, irecv = _p2p(w, codec, min_bytes, "isend", "irecv")
    ack = torch.zeros(1, dtype=torch.float32, device=w.device)
    n = _bw_window(case.inp.numel() * case.inp.element_size())
    if w.rank % 2 == 0:
        handles = [isend(case.inp, peer) for _ in range(n)]
        for h in handles:
            if h is not None:
                h.wait()
        w.native("recv")(ack, peer)
    else:
        handles = [irecv(buf, peer) for buf in (*case.window, case.out)]
        for h in handles:
            if h is not None:
                h.wait()
        w.native("send")(ack, peer)


@dataclasses.dataclass(frozen=True)
class Collective:
    name: str
    busbw_factor: Callable[[int], float]
    factor_doc: str
    granularity: Callable[[int], int]  # elements of ``size`` must be a multiple of this for n ranks
    identical: bool  # every rank must end with bit-identical output
    build: Callable[[World, int, torch.dtype, int], Case]
    run: Callable[[World, Case, Any, int], None]
    time_divisor: Callable[[int], int] = lambda nbytes: 1  # time reported per message (of a call's several)
    min_world: int = 1


COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in (
        Collective("all_reduce", lambda n: 2 * (n - 1) / n, "2(n-1)/n", lambda n: 1, True,
                   _build_all_reduce, _run_all_reduce),
        Collective("all_gather", lambda n: (n - 1) / n, "(n-1)/n", lambda n: n, True,
                   _build_all_gather, _run_all_gather),
        Collective("reduce_scatter", lambda n: (n - 1) / n, "(n-1)/n", lambda n: n, False,
                   _build_reduce_scatter, _run_reduce_scatter),
        Collective("broadcast", lambda n: 1.0, "1", lambda n: 1, True, _build_broadcast, _run_broadcast),
        Collective("all_to_all", lambda n: (n - 1) / n, "(n-1)/n", lambda n: n, False,
                   _build_all_to_all, _run_all_to_all),
        Collective("sendrecv", lambda n: 1.0, "1", lambda n: 1, False, _build_sendrecv, _run_sendrecv,
                   time_divisor=lambda nbytes: 2, min_world=2),
        Collective("sendrecv_bw", lambda n: 1.0, "1", lambda n: 1, False, _build_sendrecv_bw, _run_sendrecv_bw,
                   time_divisor=_bw_window, min_world=2),
    )
}
