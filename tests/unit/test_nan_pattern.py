"""One NaN pattern per output dtype on every backend, asserted bit for bit (kernels/common.cuh's rule).

A codec writes NaN only for a non-finite block, and what it writes is part of the bytes every backend must
agree on (the GPU check compares bytes; replicas compare bytes):

  decode / decode_rows into fp32   0x7FC00000   (rotate=hadamard too, after its inverse butterflies)
  decode / decode_rows into bf16   0xFFFF       (every NaN)
  decode / decode_rows into fp16   0x7E00       (rotate=hadamard too)
  decode_sum (fp32 out)            0x7FC00000   (always: the canonical quiet NaN, whatever the rows held)

The torch backend writes these by rule (``ccoll.codecs.buffers.narrow_`` / ``canonical_nan_``), not by
torch's cast, whose bf16 NaN depends on the CPU's vector path (AVX-512: 0xFFFF, baseline x86-64: 0x7FC0):
the last test reruns it under the baseline path. Not covered: the cast codecs (bf16, fp16) carry torch's
own narrowing of the caller's NaN on the wire (``Codec.float_bits_on_wire``), one implementation on every
backend, so their NaN bits are torch's cast's on the machine that encoded.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import ccoll
from ccoll.codecs import example_specs
from ccoll.errors import CcollError

#: (output dtype) -> the one NaN pattern of decode / decode_rows, as the unsigned bits of that dtype
DECODE_NAN = {torch.float32: 0x7FC00000, torch.bfloat16: 0xFFFF, torch.float16: 0x7E00}
#: decode_sum's one NaN (fp32 output)
SUM_NAN = 0x7FC00000
BACKENDS = ("torch", "emulated", "simt")
#: the lossy codecs whose NaN a backend writes (the cast codecs carry torch's own cast: see the docstring)
SPECS = [s for s in example_specs() if ccoll.get_codec(s).lossy and not ccoll.get_codec(s).float_bits_on_wire]
N = 300  # rows of 150: a NaN block in row 0, none in row 1


def _bits(t: torch.Tensor) -> list[int]:
    """Unsigned bit patterns of a float tensor's elements (NaN bits as they are)."""
    if t.dtype == torch.float32:
        return [b & 0xFFFFFFFF for b in t.view(torch.int32).tolist()]
    return [b & 0xFFFF for b in t.view(torch.int16).tolist()]


def _outputs(spec: str, dtype: torch.dtype, backend: str) -> dict[str, torch.Tensor]:
    """decode, decode_rows and decode_sum of inputs with NaN at 7 (and -NaN at 200 in the second) on one
    backend: payloads made by the torch backend, so every backend decodes the same bytes."""
    enc = ccoll.get_codec(spec, backend="torch")
    c = ccoll.get_codec(spec, backend=backend)
    x = torch.linspace(-3, 3, N).to(dtype)
    x[7] = float("nan")
    y = torch.linspace(2, -1, N).to(dtype)
    y[200] = -float("nan")
    px, py = enc.encode(x), enc.encode(y)
    row = N // 2
    packed = torch.empty(2, enc.encoded_nbytes(row, dtype), dtype=torch.uint8)
    enc.encode_rows(x, packed, row)
    return {"decode": c.decode(px, N, dtype),
            "decode_rows": c.decode_rows(packed, torch.empty(N, dtype=dtype), row),
            "decode_sum": c.decode_sum(torch.stack([px, py]), N, dtype)}


def _codec_dtypes():
    for spec in SPECS:
        for dtype in DECODE_NAN:
            if dtype in ccoll.get_codec(spec).dtypes:
                yield spec, dtype


def _assert_rule(outs: dict[str, torch.Tensor], spec: str, dtype: torch.dtype, where: str) -> None:
    for op, y in outs.items():
        nan = y.isnan()
        assert bool(nan[7]) and (op != "decode_sum" or bool(nan[200])), (where, spec, op)
        got = {b for b, n in zip(_bits(y), nan.tolist()) if n}
        if op == "decode_sum":
            want = {SUM_NAN}
        else:
            want = {DECODE_NAN[dtype]}  # rotate=hadamard too: its inverse butterflies' NaNs are made canonical
        assert got <= want, f"{where} {spec} {dtype} {op}: NaN bits {sorted(map(hex, got))}, the rule: {sorted(map(hex, want))}"


@pytest.mark.parametrize("spec, dtype", list(_codec_dtypes()), ids=lambda v: str(v).replace("torch.", ""))
def test_given_a_nan_block_expect_the_one_nan_pattern_bit_for_bit_on_every_backend(spec, dtype):
    """Every backend writes the rule's bits, and all of them the same bytes (every element, NaN or not)."""
    got = {}
    for backend in BACKENDS:
        try:
            got[backend] = _outputs(spec, dtype, backend)
        except CcollError as e:  # no host build (no nvcc), no simt build (no g++), no zfpy: compare what runs
            if backend == "torch":
                raise
            pytest.skip(f"{backend}: {str(e).splitlines()[0]}")
    for backend, outs in got.items():
        _assert_rule(outs, spec, dtype, backend)
        for op, y in outs.items():
            assert _bits(y) == _bits(got["torch"][op]), f"{backend} {op} differs from the torch backend: {spec} {dtype}"


_BASELINE_CPU = {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2,-FMA,-AVX512F", "ATEN_CPU_CAPABILITY": "default"}

_TORCH_BITS = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from tests.unit.test_nan_pattern import _bits, _codec_dtypes, _outputs
from tests.unit.test_nan_pattern import _nan_bits
print(json.dumps({f"{s}|{d}": _nan_bits(_outputs(s, d, "torch")) for s, d in _codec_dtypes()}))
"""


def _nan_bits(outs: dict[str, torch.Tensor]) -> dict[str, list[list[int]]]:
    """(position, bits) of every NaN of each output."""
    return {op: [[i, b] for i, (b, n) in enumerate(zip(_bits(y), y.isnan().tolist())) if n] for op, y in outs.items()}


def test_given_the_baseline_cpu_vector_path_expect_the_torch_backend_to_write_the_same_nan_bits():
    """torch's own bf16 cast writes a NaN as 0xFFFF on AVX-512 and 0x7FC0 on the baseline path: the torch
    backend's bytes (decode into bf16; decode_sum through bf16) must not follow it. The same outputs,
    computed in a process on the baseline path: every NaN's position and bits. (Only NaNs: the rotated
    codecs' other values differ in a last bit between the two paths, a separate matter.)"""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", _TORCH_BITS, root], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **_BASELINE_CPU})
    assert proc.returncode == 0, proc.stderr
    there = json.loads(proc.stdout)
    for spec, dtype in _codec_dtypes():
        here = _nan_bits(_outputs(spec, dtype, "torch"))
        assert there[f"{spec}|{dtype}"] == here, f"{spec} {dtype}: the torch backend's NaN bits depend on the CPU path"


def test_given_torch_casts_expect_the_rule_not_to_be_left_to_them():
    """Why the torch backend writes NaN bits itself: on this CPU's vector path and the baseline one torch's
    fp32 -> bf16 cast may write different NaNs; fp16's is the rule on both (quieted, top payload bits)."""
    x = torch.tensor([float("nan"), -float("nan")] * 20)
    x.view(torch.int32)[2] = 0x7FC02001  # a payload
    h = x.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
    assert h[0] == 0x7E00 and h[1] == 0xFE00 and h[2] == 0x7E01
    from ccoll.codecs.buffers import canonical_nan_, narrow_

    b = narrow_(torch.empty(40, dtype=torch.bfloat16), x)
    assert set(_bits(b)) == {0xFFFF}
    assert set(_bits(canonical_nan_(x.clone()))) == {SUM_NAN}
