"""The per-call cost of a compressed collective segment must not grow with the world size (issue 8).

On the simulated world (threads over the in-memory transport; no GPU needed), each rank counts, for one
single-segment call: the batched codec calls (encode_rows / decode_rows / decode_sum), the torch ops
executed inside them (a TorchDispatchMode entered around each codec call, per thread), and for the
emulated backend the host-kernel calls made through ``ccoll.kernels.host_library`` (the kernels built
for the host; on a GPU each would be one launch). The per-rank chunk is the same at every p, so any
difference between p = 4, 16 and 64 is a per-rank loop. The cast codecs' batched methods live in
ccoll/codecs/cast.py; int8's are the quant helper's work: until a codec class has its own
``_encode_rows_<backend>`` (etc.) the reference loop in base.py serves and that case is skipped.

all_reduce has two algorithms and the size rule (``ccoll.collectives.small.one_exchange``) would pick
one exchange at some of these p and two at others, so each is forced in turn: ``all_reduce`` /
``all_reduce_ef`` measure flat's two exchanges, ``all_reduce_whole`` the one-exchange path (one encode,
one decode_sum of the p gathered rows of CHUNK elements: one call whatever p, and its torch op count
must not grow either).
"""
from __future__ import annotations

import threading
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ccoll
import ccoll.kernels as kernels
from ccoll.collectives import small
from ccoll.testing import simulated_world

CHUNK = 1024  # elements per rank and segment, the same at every p
WORLD_SIZES = (4, 16, 64)
_CODEC_METHODS = ("encode_rows", "decode_rows", "decode_sum")

_tls = threading.local()


class _OpCounter(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        _tls.counts["torch_ops"] += 1
        return func(*args, **(kwargs or {}))


def _counting(codec: ccoll.Codec) -> ccoll.Codec:
    """``codec`` with its batched methods counting into the calling thread's ``_tls.counts``."""
    for name in _CODEC_METHODS:
        inner = getattr(codec, name)

        def wrapper(*args, _inner=inner, _name=name, **kwargs):
            counts = getattr(_tls, "counts", None)
            if counts is None or getattr(_tls, "inside", False):
                return _inner(*args, **kwargs)
            counts[_name] += 1
            _tls.inside = True
            try:
                with _OpCounter():
                    return _inner(*args, **kwargs)
            finally:
                _tls.inside = False

        setattr(codec, name, wrapper)
    return codec


class _CountingLibrary:
    """A host library whose functions count their calls (for the emulated backend)."""

    def __init__(self, lib) -> None:
        self._lib = lib

    def __getattr__(self, name):
        return _CountingFunction(getattr(self._lib, name))


class _CountingFunction:
    def __init__(self, fn) -> None:
        object.__setattr__(self, "_fn", fn)

    def __getattr__(self, name):
        return getattr(self._fn, name)

    def __setattr__(self, name, value):
        setattr(self._fn, name, value)

    def __call__(self, *args):
        counts = getattr(_tls, "counts", None)
        if counts is not None:
            counts["host_calls"] += 1
        return self._fn(*args)


def _one_segment(rank: int, group, codec: ccoll.Codec, op: str) -> dict:
    p = group.size()
    ef = ccoll.ErrorFeedback()
    x = torch.randn(p * CHUNK, generator=torch.Generator().manual_seed(rank))
    out_rs, out_ag = torch.empty(CHUNK), torch.empty(p * CHUNK)
    # warm-up call (lazy builds, EF buffers), then the counted one
    for counted in (False, True):
        _tls.counts = Counter() if counted else None
        if op == "all_reduce":
            ccoll.all_reduce(x.clone(), "sum", group, codec, min_bytes=0)
        elif op == "all_reduce_whole":  # the whole tensor is one row: CHUNK elements at every p
            ccoll.all_reduce(x[:CHUNK].clone(), "avg", group, codec, min_bytes=0, error_feedback=ef, key="w")
        elif op == "all_reduce_ef":
            ccoll.all_reduce(x.clone(), "avg", group, codec, min_bytes=0, error_feedback=ef, key="g")
        elif op == "reduce_scatter":
            ccoll.reduce_scatter_tensor(out_rs, x, "sum", group, codec, min_bytes=0, error_feedback=ef, key="r")
        else:
            ccoll.all_gather_into_tensor(out_ag, x[:CHUNK], group, codec, min_bytes=0)
    counts = dict(_tls.counts)
    _tls.counts = None
    return counts


def _batched(codec: ccoll.Codec, backend: str) -> bool:
    return all(hasattr(type(codec), f"_{m}_{backend}") for m in ("encode_rows", "decode_rows", "decode_sum"))


EXPECTED_CALLS = {
    "all_reduce": {"encode_rows": 2, "decode_sum": 1, "decode_rows": 1},
    "all_reduce_ef": {"encode_rows": 2, "decode_sum": 1, "decode_rows": 1},
    "all_reduce_whole": {"encode_rows": 1, "decode_sum": 1, "decode_rows": None},
    "reduce_scatter": {"encode_rows": 1, "decode_sum": 1},
    "all_gather": {"encode_rows": 1, "decode_rows": 1},
}


def measure(spec: str, backend: str, op: str, world_sizes=WORLD_SIZES) -> dict[int, dict]:
    """Per-rank counts of one segment at each p (rank 0's; every rank's must agree)."""
    figures = {}
    for p in world_sizes:
        codec = _counting(ccoll.get_codec(spec, backend=backend))
        per_rank = simulated_world(p, _one_segment, codec, op, timeout_s=300)
        assert all(r == per_rank[0] for r in per_rank), f"{spec} {op} p={p}: ranks differ: {per_rank[:3]}"
        figures[p] = per_rank[0]
    return figures


@pytest.mark.parametrize("spec,backend", [
    ("none", "torch"), ("bf16", "torch"), ("int8:block=256", "torch"), ("int8:block=256", "emulated"),
])
@pytest.mark.parametrize("op", list(EXPECTED_CALLS))
def test_given_world_sizes_4_16_64_when_one_compressed_segment_expect_same_codec_calls_and_ops_per_rank(
    spec, backend, op, monkeypatch,
):
    codec = ccoll.get_codec(spec, backend=backend)
    if not _batched(codec, backend):
        pytest.skip(f"{spec} has no batched {backend} specialisation yet (the reference loop in base.py serves)")
    if backend == "emulated":
        real = kernels.host_library
        monkeypatch.setattr(kernels, "host_library", lambda name: _CountingLibrary(real(name)))
    whole = op == "all_reduce_whole"
    monkeypatch.setattr(small, "one_exchange", lambda c, p, numel, dtype: whole)
    figures = measure(spec, backend, op)
    first = figures[WORLD_SIZES[0]]
    for name, calls in EXPECTED_CALLS[op].items():
        assert first.get(name) == calls, f"{name}: {first}"
    assert first.get("torch_ops", 0) + first.get("host_calls", 0) > 0, f"nothing counted: {first}"
    if backend == "emulated":
        assert first.get("host_calls", 0) > 0, "the emulated backend made no calls through kernels.host_library"
    for p, counts in figures.items():
        assert counts == first, f"{spec}/{backend} {op}: p={WORLD_SIZES[0]} {first} but p={p} {counts}"
