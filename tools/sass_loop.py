"""Issue slots of one turn of a quant decode kernel's streaming loop, read off its sm_90 SASS: the figures of
kernels/quant.cu's header for decode_sum (``python tools/sass_loop.py ccoll_int8_decode_sum_bf16``).

Why: the header states how many instructions decode_sum spends per value and payload row. No GPU has measured
it, so the figure must at least be re-derivable from the repo. The tool compiles kernels/quant.cu for sm_90
by NVRTC with the codec's options (what a GPU loads), disassembles it (nvdisasm, see tools/sass_estimate.py)
and follows one path through the loop whose body holds the kernel's first vector load (LDG.E.128 or, int4's
decode_sum, LDG.E.64): the
fall-through of every conditional branch (in today's decode_sum, the whole-group path that
F::decodes_normal admits) unless ``--take LABEL`` names a branch target to follow instead, every unconditional
branch taken, until the branch back to the loop's head. Every instruction is one warp issue slot, a
predicated-off one included. A static count at full issue efficiency: not a measurement.

``--encode`` does the same for an encode_rows kernel's pass-1 loops (the header's encode figures, e.g.
``python tools/sass_loop.py --encode ccoll_int8_encode_rows_f32``): every innermost loop that loads and
stores, walked along round-to-nearest -- at a conditional branch, the side that does not start the stochastic
key's hash (cq_mix32's multipliers), else the fall-through. A loop with a 16-byte store is a feedback loop
(its residuals); which loop is encode_whole's and which the general path's is read off the counts (the
whole block's loop has no per-word count test, so it is the shorter of its kind).
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sass_estimate  # noqa: E402  (find_nvdisasm, disassemble, nvdisasm's line format)

_INS = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRA = re.compile(r"^(@!?U?P\w+\s+)?BRA(?:\.\w+)*\s+(?:!?U?P\d+,\s*)?`\((\.L_x_\d+)\)")


def kernel_lines(sass: str, kernel: str) -> list[str]:
    """The instruction and label lines of ``kernel``'s section of ``nvdisasm -c`` output."""
    start = sass.find(f".text.{kernel}:")
    if start < 0:
        raise ValueError(f"no section .text.{kernel} in the disassembly")
    end = sass.find("\n//---", start)
    out = []
    for text in sass[start:end if end > 0 else None].splitlines()[1:]:
        if _LABEL.match(text) or _INS.match(text):
            out.append(text.strip())
    return out


def loop_turn(lines: list[str], take: set[str] = frozenset()) -> list[str]:
    """The instructions of one turn of the loop holding the first vector load, along the path described in the
    module docstring. Raises ValueError when the walk does not come back to the loop's head."""
    ins = [(_INS.match(t).group(1) if _INS.match(t) else None) for t in lines]
    first = next((i for i, t in enumerate(ins) if t and re.search(r"LDG\.E\.(128|64) ", t)), None)
    if first is None:
        raise ValueError("no vector load (LDG.E.128 / LDG.E.64) in the kernel")
    head = next((i for i in range(first, -1, -1) if _LABEL.match(lines[i])), None)
    if head is None:
        raise ValueError("no label before the first vector load")
    return _walk(lines, head, lambda i, target: target + 1 if _LABEL.match(lines[target]).group(1) in take else i + 1)


#: cq_mix32's multipliers as nvdisasm prints them (kernels/quant.cu): an instruction with one starts the
#: stochastic key's hash
_HASH = re.compile(r"\b(?:0x7feb352d|-0x7b935975|0x846ca68b)\b")


def _walk(lines: list[str], head: int, choose) -> list[str]:
    """The instructions from label line ``head`` to the branch back to it: unconditional branches taken, a
    conditional one at line i to target line t followed where ``choose(i, t)`` says (the next line or t)."""
    ins = [(_INS.match(t).group(1) if _INS.match(t) else None) for t in lines]
    label = _LABEL.match(lines[head]).group(1)
    where = {_LABEL.match(t).group(1): i for i, t in enumerate(lines) if _LABEL.match(t)}
    path, i = [], head + 1
    while i < len(lines) and len(path) <= len(lines):
        t = ins[i]
        if t is None:
            i += 1
            continue
        path.append(t)
        m = _BRA.match(t)
        if m and m.group(2) == label:
            return path
        if m:
            target = where[m.group(2)]
            i = target + 1 if m.group(1) is None else choose(i, target)
            continue
        i += 1
    raise ValueError(f"the walk from {label} did not branch back to it")


def encode_turns(lines: list[str]) -> list[tuple[str, list[str]]]:
    """(head label, one turn) of every innermost loop of ``lines`` that loads and stores (LDG, STG), walked
    along round-to-nearest: a conditional branch goes to the side whose first 12 instructions do not hash
    (see ``_HASH``), the fall-through when neither or both do."""
    ins = [(_INS.match(t).group(1) if _INS.match(t) else None) for t in lines]
    where = {_LABEL.match(t).group(1): i for i, t in enumerate(lines) if _LABEL.match(t)}
    loops = []
    for i, t in enumerate(ins):
        m = _BRA.match(t) if t else None
        if m and where[m.group(2)] < i:
            loops.append((where[m.group(2)], i))
    innermost = [(h, e) for h, e in loops if not any(h < h2 and e2 <= e for h2, e2 in loops if (h2, e2) != (h, e))]

    def hashes(i: int) -> bool:
        return any(_HASH.search(t) for t in [t for t in ins[i:] if t][:12])

    def choose(i: int, target: int) -> int:
        return target + 1 if hashes(i + 1) and not hashes(target + 1) else i + 1

    out = []
    for head, end in innermost:
        body = [t for t in ins[head:end + 1] if t]
        if any(opcode(t) == "LDG" for t in body) and any(opcode(t) == "STG" for t in body):
            out.append((_LABEL.match(lines[head]).group(1), _walk(lines, head, choose)))
    return out


def opcode(instruction: str) -> str:
    words = instruction.split()
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kernels", nargs="+", help="e.g. ccoll_int8_decode_sum_bf16")
    ap.add_argument("--take", action="append", default=[], help="follow the conditional branch to this label")
    ap.add_argument("--nvdisasm", help="path to nvdisasm (default: see tools/sass_estimate.py)")
    ap.add_argument("--values", type=int, default=32, help="value-rows per loop turn (decode_sum: 2 rows x 16, int4 4 x 16)")
    ap.add_argument("--encode", action="store_true", help="encode_rows: every pass-1 loop along round-to-nearest")
    args = ap.parse_args(argv)
    from ccoll import kernels

    path = kernels.source(kernels.module_source("quant"))
    _, cubin, _ = kernels.nvrtc().compile(path.read_text(), str(path), kernels.module_options("quant", "sm_90"))
    sass = sass_estimate.disassemble(cubin, sass_estimate.find_nvdisasm(args.nvdisasm))
    for kernel in args.kernels:
        if args.encode:
            for label, turn in encode_turns(kernel_lines(sass, kernel)):
                ops = collections.Counter(opcode(t) for t in turn)
                wide = sum(t.split()[0].startswith("STG.E.128") for t in turn)
                print(f"{kernel} loop {label}: {len(turn)} issue slots per turn (LDG {ops['LDG']}, STG "
                      f"{ops['STG']}{', residual stores: feedback' if wide else ''})")
            continue
        turn = loop_turn(kernel_lines(sass, kernel), set(args.take))
        top = collections.Counter(opcode(t) for t in turn).most_common(8)
        print(f"{kernel}: {len(turn)} issue slots per loop turn = {len(turn) / args.values:.2f} per value "
              f"({args.values} per turn); " + ", ".join(f"{k} {n}" for k, n in top))


if __name__ == "__main__":
    main()
