"""The expected bytes of the GPU check, computed on the CPU and carried as digests (`make gpu-expected`:
``python -m ccoll.gpucheck.expected``, written to ``EXPECTED``, committed and shipped with the package).

A GPU machine's stock python3 has no zfpy and no nvcc, so it cannot compute a reference itself. Instead the
reference backend (``torch``: libzfp through zfpy for zfp, the torch implementations for the rest) runs here
over a fixed, seeded matrix -- every spec of ``matrix.check_specs()`` (the codec registry's examples plus
the kernel-geometry cases) x every dtype the codec takes x every input kind x its sizes -- and each case
keeps one short sha256 digest per output, in this order (``OPS``):

  encode       payload bytes of ``encode(x)``
  decode       values of ``decode(payload)`` (NaNs written as one pattern: payload bits may differ)
  decode_sum   values of ``decode_sum`` of x's payload and two other inputs' payloads
  encode_rows  payload bytes of ``encode_rows`` over ROWS rows (the last one partly padding)
  rows_fb      the same with error feedback: payload bytes
  residuals    ... and the residuals it leaves in the feedback buffer
  decode_rows  values of ``decode_rows`` of the encode_rows payload

For codecs whose payload carries float bits as they are (``Codec.float_bits_on_wire``: casts, lossless) and
non-finite inputs, the three payload digests (encode, encode_rows, rows_fb) are of the payloads decoded,
NaNs as one pattern: which NaN payload bits a narrowing writes is up to the torch kernel (AVX-512, scalar
x86 and CUDA differ), not part of ccoll's contract.

plus, under "collectives", each rank's result of an all_reduce / all_gather of every registry codec on a
simulated world (``ccoll.testing.simulated_world``). ccoll/gpucheck/expected.json is what this writes; the unit
test test_gpu_expected.py recomputes a sample of it on the CPU and checks that its cases are exactly the
current matrix, so it cannot go stale silently. A case missing from the file is a failure on the GPU machine.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from . import matrix

#: the committed digests: package data beside this module, so an installed ccoll carries them
EXPECTED = Path(__file__).resolve().with_name("expected.json")
FORMAT = 1
OPS = ("encode", "decode", "decode_sum", "encode_rows", "rows_fb", "residuals", "decode_rows")
DIGEST_HEX = 12  # 48 bits per output: plenty to see a wrong byte, small enough to commit
REFERENCE_BACKEND = "torch"

#: the collectives phase: world size, elements per rank, the ops (each rank's result digested)
COLL_WORLD = 4
COLL_NUMEL = 4099
COLL_OPS = ("all_reduce", "all_gather")
COLL_SALT = 0x5EED_0002


def digest(torch, t) -> str:
    """sha256 of a tensor's bytes (on any device), NaNs first written as one pattern."""
    t = t.detach().cpu().contiguous()
    if t.is_floating_point():
        t = t.clone()
        t[torch.isnan(t)] = float("nan")
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()[:DIGEST_HEX]


def case_id(spec: str, dtype, kind: str, n: int) -> str:
    return f"{spec}|{str(dtype).replace('torch.', '')}|{kind}|{n}"


def cases(torch, specs=None):
    """(spec, dtype, kind, n) of the matrix, in a fixed order."""
    import ccoll

    for spec in matrix.check_specs() if specs is None else specs:
        probe = ccoll.get_codec(spec, backend=REFERENCE_BACKEND)
        for dtype in matrix._dtypes(torch):
            if dtype not in probe.dtypes:
                continue
            for kind in matrix.INPUTS:
                for n in matrix.QUICK_SIZES if kind == "normal" else matrix.SPECIAL_SIZES:
                    yield spec, dtype, kind, n


def row_numel_for(codec, n: int) -> int:
    """Rows of whole codec blocks such that matrix.ROWS of them cover n (the last row partly padding)."""
    per_row = -(-n // matrix.ROWS)
    return -(-per_row // codec.align_numel) * codec.align_numel


def case_digests(torch, spec: str, dtype, kind: str, n: int, backend: str, device) -> str:
    """The ``OPS`` digests of one case on ``backend`` with its tensors on ``device``, space-separated; or
    ``"refused: <reason>"`` when the codec refuses the case (e.g. a rate below float64's minimum), which the
    device must refuse alike. The inputs are made on the CPU (seeded) and copied, so every machine sees
    the same values; a misaligned input stays misaligned on the device."""
    import ccoll
    from ccoll.errors import CcollError, KernelError

    codec = ccoll.get_codec(spec, backend=backend)
    x = matrix.make_input(torch, kind, n, dtype, seed=n)
    others = [matrix.make_input(torch, kind, n, dtype, seed=n + 1 + i) for i in range(2)]
    if device.type == "cpu":
        xd = x
    else:
        base = torch.zeros(n + (kind == "misaligned"), dtype=dtype, device=device)
        base[int(kind == "misaligned"):] = x
        xd = base[int(kind == "misaligned"):]
    row_numel = row_numel_for(codec, n)
    try:
        payload = codec.encode(xd)
    except KernelError:
        raise  # a failed build or launch is a finding, never a refusal
    except CcollError as e:
        return "refused: " + str(e).splitlines()[0]
    # a payload holding float bits as they are (Codec.float_bits_on_wire) carries its NaNs' payload bits,
    # which the torch kernel that narrowed them chose (different on AVX-512, scalar x86 and CUDA): with
    # NaNs in the input such payloads are compared decoded, NaN as NaN (identical bytes otherwise)
    as_values = kind == "nonfinite" and codec.float_bits_on_wire

    def wire(rows2d):
        if not as_values:
            return digest(torch, rows2d)
        back = torch.empty(rows2d.shape[0] * row_numel, dtype=dtype, device=device)
        return digest(torch, codec.decode_rows(rows2d, back, row_numel))

    decoded = digest(torch, codec.decode(payload, n, dtype))
    out = [decoded if as_values else digest(torch, payload), decoded]
    rows = torch.stack([payload, *(codec.encode(o.to(device)) for o in others)])
    out.append(digest(torch, codec.decode_sum(rows, n, dtype)))
    nbytes_row = codec.encoded_nbytes(row_numel, dtype)
    packed = torch.empty(matrix.ROWS, nbytes_row, dtype=torch.uint8, device=device)
    codec.encode_rows(xd.contiguous(), packed, row_numel, salt=matrix.FEEDBACK_SALT)
    out.append(wire(packed))
    fb = feedback_input(torch, matrix.ROWS * row_numel, n, codec.feedback_dtype(dtype))
    fb[n:] = 0
    fb = fb.to(device)
    packed_fb = torch.empty_like(packed)
    codec.encode_rows(xd.contiguous(), packed_fb, row_numel, feedback=fb, salt=matrix.FEEDBACK_SALT)
    out += [wire(packed_fb), digest(torch, fb)]
    back = torch.empty(n, dtype=dtype, device=device)
    codec.decode_rows(packed, back, row_numel)
    out.append(digest(torch, back))
    return " ".join(out)


def collective_input(torch, rank: int):
    """Rank ``rank``'s float32 input of the collective checks, made on the CPU with the same bits on
    every machine (matrix.portable_randn)."""

    g = torch.Generator().manual_seed(7000 + rank)
    x = matrix.portable_randn(torch, COLL_NUMEL, g) * matrix.pow2(torch, torch.randint(-4, 5, (COLL_NUMEL,), generator=g))
    return x.to(torch.float32)


def feedback_input(torch, numel: int, seed: int, dtype):
    """The error-feedback buffer the ``rows_fb`` case starts from: small values, machine-independent."""

    return (matrix.portable_randn(torch, numel, torch.Generator().manual_seed(seed)) * 1e-3).to(dtype)


def collective_digests(torch, spec: str, device) -> dict:
    """op -> the ranks' result digests, space-separated, of each ``COLL_OPS`` op of ``spec`` on a simulated
    world of COLL_WORLD ranks with tensors on ``device`` (its default backend: torch on CPU, cupy on CUDA)."""
    import ccoll
    from ccoll.testing import simulated_world

    def inputs(rank):
        return collective_input(torch, rank).to(device)

    def reduce(rank, group):
        x = inputs(rank)
        ccoll.all_reduce(x, group=group, codec=spec, min_bytes=0, salt=COLL_SALT)
        return digest(torch, x)

    def gather(rank, group):
        x = inputs(rank)
        out = torch.empty(COLL_WORLD * COLL_NUMEL, dtype=x.dtype, device=device)
        ccoll.all_gather_into_tensor(out, x, group=group, codec=spec, min_bytes=0, salt=COLL_SALT)
        return digest(torch, out)

    fns = {"all_reduce": reduce, "all_gather": gather}
    return {op: " ".join(simulated_world(COLL_WORLD, fns[op], device=device, timeout_s=120)) for op in COLL_OPS}


def compute(torch, specs=None, log=None) -> dict:
    """The whole expected-digest document, on the CPU with the reference backend."""

    cpu = torch.device("cpu")
    doc = {"format": FORMAT, "reference_backend": REFERENCE_BACKEND, "ops": list(OPS),
           "digest": f"sha256, first {DIGEST_HEX} hex digits; NaNs as one pattern", "cases": {},
           "collectives": {"world": COLL_WORLD, "numel": COLL_NUMEL, "specs": {}}}
    for spec, dtype, kind, n in cases(torch, specs):
        doc["cases"][case_id(spec, dtype, kind, n)] = case_digests(torch, spec, dtype, kind, n, REFERENCE_BACKEND, cpu)
        if log and kind == "misaligned":
            log(f"{spec} {dtype}")
    for spec in matrix._registry_specs() if specs is None else [s for s in specs if s in matrix._registry_specs()]:
        doc["collectives"]["specs"][spec] = collective_digests(torch, spec, cpu)
    return doc


def load(path=EXPECTED) -> dict:
    return json.loads(Path(path).read_text())


def main(argv=None) -> int:
    import argparse

    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(EXPECTED))
    args = ap.parse_args(argv)
    doc = compute(torch, log=lambda line: print(line, flush=True))
    Path(args.out).write_text(json.dumps(doc, indent=0, sort_keys=True) + "\n")
    print(f"# gpu-expected: {len(doc['cases'])} cases, {len(doc['collectives']['specs'])} collective specs -> "
          f"{args.out} ({Path(args.out).stat().st_size} B)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
