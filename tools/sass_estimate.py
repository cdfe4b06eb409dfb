"""Roofline estimate of the zfp tile encoder (``ccoll_zfp_encode_tiles_f32``) from its sm_90 SASS, re-derivable
from the repo: ``make sass-estimate`` (or ``python tools/sass_estimate.py``; ``--help`` for the options).

Why: kernels/zfp.cu's header states how many instructions the encoder spends per value and what fraction of
H200 copy bandwidth that allows. No GPU has measured it, so the figure is an estimate, and an estimate nobody
can re-derive cannot be trusted or updated. This tool derives it in four steps:

1. compile kernels/zfp.cu for sm_90 with NVRTC and exactly the codec's options (``module_options``, what a
   GPU loads) plus ``-lineinfo`` (line tables only: the code is the same);
2. disassemble the cubin with ``nvdisasm -c -g`` and split the kernel into basic blocks (``split_blocks``);
3. keep the blocks of one path (dims=1 or dims=2, no error feedback: ``path_blocks``) and give each block a
   region by its source lines (``Regions``): once per block, per plane, per group test, per word stored, ...;
4. weight each region's static instruction count by how often the block coder takes it, counted by a Python
   mirror of the coder (``code_block``) on Gaussian values. The mirror emits the bitstream, and
   tests/unit/test_sass_estimate.py checks its bytes against libzfp (zfpy): its counts are those of the real
   coder, not of a model of it.

What it is not: a measurement. Static counts at full issue efficiency ignore latency, stalls and memory. Every
block of a region counts once per event of the region (a loop whose first iteration the compiler peeled: the
peeled blocks once per entry, the loop block for the other iterations), so where a region holds a branch the
mirror does not count, both sides count: an upper bound (in today's kernel ~25 instructions of 'warp' and
'lane', e.g. the trap, the call to the 64-bit division and the divergent-__syncwarp fallbacks, are such
alternatives). 'warp' is the set-up outside the warp's tile loop, shared by the run of tiles the launch gives a
warp (reported for 1 and for the launch's largest run). A warp is at best as fast as its
slowest lane (lanes diverge in their number of planes), which the table reports next to the lane mean.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python tools/sass_estimate.py` from anywhere
    sys.path.insert(0, str(ROOT))

from ccoll.errors import KernelError  # noqa: E402

KERNEL = "ccoll_zfp_encode_tiles_f32"
ARCH = "sm_90"
PIP_NVDISASM = "pip install --target build/tools/nvdisasm nvidia-cuda-nvdisasm"
#: where `make sass-estimate` installs the nvdisasm wheel (not into the venv: only this tool needs it)
LOCAL_NVDISASM = ROOT / "build" / "tools" / "nvdisasm" / "nvidia" / "cu13" / "bin" / "nvdisasm"


# ---- the budget: the one place for the H200 constants (kernels/zfp.cu's header cites them) ----------------

@dataclass(frozen=True)
class Budget:
    """H200 figures behind "fraction of copy bandwidth": a copy of f32 values moves ``copy_bytes_per_value``
    (4 B read, 4 B written) at ``copy_bytes_per_s``; the encoder is instruction-bound and issues at most
    ``sms * int32_lanes_per_sm * clock_hz`` integer thread-instructions per second."""

    copy_bytes_per_s: float = 4e12  # achievable, not the 4.8 TB/s peak
    copy_bytes_per_value: float = 8.0
    sms: int = 132
    int32_lanes_per_sm: int = 64
    clock_hz: float = 1.9e9

    @property
    def thread_instructions_per_s(self) -> float:
        return self.sms * self.int32_lanes_per_sm * self.clock_hz

    @property
    def copy_values_per_s(self) -> float:
        return self.copy_bytes_per_s / self.copy_bytes_per_value

    def fraction_of_copy(self, instructions_per_value: float) -> float:
        """Encode rate over copy rate at full issue efficiency, for this many instructions per value."""
        return self.thread_instructions_per_s / instructions_per_value / self.copy_values_per_s


H200 = Budget()


# ---- the mirror: the f32 block coder in plain Python ints, emitting bits and counting the kernel's events ----

P = 32  # f32 integer precision
EBITS = 8
M32 = 0xFFFFFFFF
NBMASK = 0xAAAAAAAA
#: dims=2 coefficient order (increasing total sequency): position i of the coded block holds coefficient PERM2[i]
PERM2 = (0, 1, 4, 5, 2, 8, 6, 9, 3, 12, 10, 7, 13, 11, 14, 15)


def s32(v: int) -> int:
    """v wrapped to a signed 32-bit int (the kernel's Int arithmetic wraps as unsigned)."""
    v &= M32
    return v - (1 << 32) if v >> 31 else v


def to_fixed(bits: int, k: int) -> int:
    """The f32 value with IEEE bits ``bits`` times 2^k, truncated toward zero (exact: shifts of the mantissa)."""
    be = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    e = (be - 127 - 23) if be else (1 - 127 - 23)
    if be:
        mant |= 1 << 23
    s = e + k
    q = mant << s if s >= 0 else (0 if -s >= P else mant >> -s)
    return s32(-q if bits >> 31 else q)


def lift(p: list[int], i0: int, stride: int) -> None:
    """zfp's forward decorrelating transform of the 4 values p[i0], p[i0+stride], ... in place."""
    x, y, z, w = (p[i0 + j * stride] for j in range(4))
    x = s32(x + w) >> 1; w = s32(w - x)
    z = s32(z + y) >> 1; y = s32(y - z)
    x = s32(x + z) >> 1; z = s32(z - x)
    w = s32(w + y) >> 1; y = s32(y - w)
    w = s32(w + (y >> 1)); y = s32(y - (w >> 1))
    for j, v in enumerate((x, y, z, w)):
        p[i0 + j * stride] = v


class Bits:
    """A block's bits, least significant first, as the tile kernel's LaneWriter stores them: 32-bit words from
    the block's bit 0. Each write names the kernel region that makes it; ``events[region + '.store']`` counts
    the words the write completes (LaneWriter's store branch)."""

    def __init__(self, events: collections.Counter):
        self.value = 0
        self.pos = 0
        self.events = events

    def write(self, v: int, n: int, region: str) -> None:
        if n <= 0:
            return
        self.value |= (v & ((1 << n) - 1)) << self.pos
        done = (self.pos + n) // 32 - self.pos // 32
        self.pos += n
        if done:
            self.events[region + ".store"] += done


def code_block(vals: list[int], maxbits: int, dims: int) -> tuple[int, collections.Counter]:
    """One f32 block (IEEE bit patterns, 4 values for dims=1, 16 for dims=2) coded in fixed-rate mode with
    ``maxbits`` bits: (the block's bits as an int, bit 0 first; events). The coder is zfp's embedded bit-plane
    coder, written bit by bit (verbatim bits of the significant coefficients, then group tests, each 1 followed
    by a unary scan to the next significant coefficient). The events count the regions the kernel's code for
    the same block takes (see ``Regions``):
      block: once per coded block (header, transform, leading all-zero planes at once);
      plane: each plane the plane loop codes (dims=1: one write of a plane's verbatim bits and group tests);
      tail, chunk (dims=1): once 3 of the 4 coefficients are significant the rest is a nibble stream written 32
        bits (8 planes) per chunk (the last coefficient's group test is its plane bit);
      test / found / limit (dims=2): each group-test bit; each test of 1 whose scan reaches a 1 (found) or stops
        at the budget or the implied last coefficient (limit);
      finish: once per block (the pending word); zerofill: zero words after the coded bits;
      <region>.store: the 32-bit words a region's writes complete."""
    events: collections.Counter = collections.Counter(finish=1)
    out = Bits(events)
    S = 4 if dims == 1 else 16
    maxmag = max(v & 0x7FFFFFFF for v in vals)
    if maxmag >= 0x7F800000:  # non-finite: the kernel's marker header (flag 1, biased exponent 0)
        events["nonfinite"] += 1
        out.write(1, 1 + EBITS, "block")
    elif (maxmag >> 23) <= P - 4:  # zero or tiny: all-zero bits
        events["zero"] += 1
    else:
        events["block"] += 1
        emax = (maxmag >> 23) - 126  # frexp exponent of the block maximum
        out.write(2 * (emax + 127) + 1, 1 + EBITS, "block")
        q = [to_fixed(v, P - 2 - emax) for v in vals]
        if dims == 1:
            lift(q, 0, 1)
        else:
            for j in range(4):
                lift(q, 4 * j, 1)
            for i in range(4):
                lift(q, i, 4)
            q = [q[PERM2[i]] for i in range(16)]
        u = [((c & M32) + NBMASK & M32) ^ NBMASK for c in q]
        _code_planes(u, maxbits - 1 - EBITS, S, out)
    words = (maxbits + 31) // 32
    events["zerofill"] += words - (out.pos + 31) // 32
    return out.value, events


def _code_planes(u: list[int], bits: int, S: int, out: Bits) -> None:
    """The plane loop of ``code_block`` (kmin = 0: f32 fixed-rate codes every plane the budget reaches)."""
    ev = out.events
    nsig = 0
    leading = True
    for k in range(P - 1, -1, -1):
        if bits <= 0:
            break
        x = sum(((u[i] >> k) & 1) << i for i in range(S))
        if leading and x == 0:  # one 0 group test, written with the other leading zero planes at once
            out.write(0, 1, "block")
            bits -= 1
            continue
        leading = False
        if S == 4 and nsig >= S - 1:  # dims=1 tail: every remaining plane's 4 bits verbatim, 32 bits a chunk
            n = min(4 * (k + 1), bits)
            ev["tail"] += 1
            ev["chunk"] += (n + 31) // 32
            stream = sum(((u[i] >> kk) & 1) << (4 * (k - kk) + i) for kk in range(k, -1, -1) for i in range(4))
            out.write(stream, n, "chunk")
            return
        ev["plane"] += 1
        m = min(nsig, bits)  # verbatim bits of the coefficients already significant
        out.write(x, m, "plane")
        x >>= m
        bits -= m
        n = nsig
        while n < S and bits > 0:
            bits -= 1
            test = 1 if x else 0
            out.write(test, 1, "plane" if S == 4 else "test")
            ev["test"] += S != 4
            if not test:
                break
            scan, nscan, found = 0, 0, False
            while n < S - 1 and bits > 0:  # zeros up to the next significant coefficient, then its 1
                bits -= 1
                b = x & 1
                scan |= b << nscan
                nscan += 1
                if b:
                    found = True
                    break
                x >>= 1
                n += 1
            region = "plane" if S == 4 else ("found" if found else "limit")
            out.write(scan, nscan, region)
            if S != 4:
                ev[region] += 1
            x >>= 1
            n += 1
        nsig = n


def encode(x: np.ndarray, rate: int, dims: int) -> tuple[bytes, list[collections.Counter]]:
    """f32 array x (size a multiple of 4 / 16) coded at ``rate`` bits per value: (the stream as zfpy writes
    it with write_header=False: blocks back to back, 64-bit little-endian words; per-block events)."""
    S = 4 if dims == 1 else 16
    vals = np.ascontiguousarray(x, dtype=np.float32).reshape(-1).view(np.uint32).tolist()
    if len(vals) % S:
        raise ValueError(f"{len(vals)} values are not whole dims={dims} blocks of {S}")
    maxbits = S * rate
    stream, evs = 0, []
    for b in range(len(vals) // S):
        bits, ev = code_block(vals[S * b:S * b + S], maxbits, dims)
        stream |= bits << (b * maxbits)
        evs.append(ev)
    nbytes = 8 * ((len(evs) * maxbits + 63) // 64)
    return stream.to_bytes(nbytes, "little"), evs


def assemble_events(maxbits: int, lane: int) -> collections.Counter:
    """What lane ``lane`` does in assemble_tile_lane for a full tile that is not its row's last: one 'word' per
    32-bit output word it stores (words lane, lane+32, ... of the tile's maxbits words), one 'piece' per lane
    buffer a word takes bits from; where a block is whole words (maxbits % 32 == 0), one 'copy' per word instead."""
    ev: collections.Counter = collections.Counter()
    if maxbits % 32 == 0:  # blocks of whole words: each output word copied from one lane-buffer word
        ev["copy"] += len(range(lane, maxbits, 32))
        return ev
    for j in range(lane, maxbits, 32):
        ev["word"] += 1
        p = 32 * j
        blk, off, got = p // maxbits, p % maxbits, 0
        while got < 32 and blk < 32:
            ev["piece"] += 1
            got += min(32 - got, maxbits - off)
            blk, off = blk + 1, 0
    return ev


def tile_events(x: np.ndarray, rate: int, dims: int, tiles_per_warp: int = 1) -> list[collections.Counter]:
    """Per-block (= per-lane) events of the tile encoder coding x (whole tiles of 32 blocks): the coder's
    (``code_block``), the lane's share of the word assembly, 'lane' (once per lane and tile) and 'warp' (once per
    lane and run of ``tiles_per_warp`` tiles: a block's share is 1 / tiles_per_warp)."""
    _, evs = encode(x, rate, dims)
    maxbits = (4 if dims == 1 else 16) * rate
    for b, ev in enumerate(evs):
        ev.update(assemble_events(maxbits, b % 32), lane=1, rare=ev["nonfinite"] + ev["zero"])
        ev["warp"] = 1 / tiles_per_warp
        ev["sig"] = ev["found"] + ev["limit"]
        entries = {"piece": ev["word"], "chunk": ev["tail"], "zerofill": min(1, ev["zerofill"]), "copy": min(1, ev["copy"])}
        for r in PEELED:
            ev[r + ".first"], ev[r + ".again"] = entries[r], ev[r] - entries[r]
    return evs


# ---- SASS: nvdisasm -c -g text -> basic blocks ----------------------------------------------------------------

_INS = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;")
_LINE = re.compile(r'^\s*//## File "([^"]*)", line (\d+)')
_LABEL = re.compile(r"^(\.L_x_\d+):")
_TERMINATORS = ("BRA", "BRX", "JMP", "EXIT", "RET")


@dataclass
class Block:
    """A basic block: its label (None for one that starts after a conditional branch), instructions as
    (address, text, (source file name, line)) and successor block indices. CALL returns, BSSY/BSYNC/WARPSYNC
    fall through: only the terminators (_TERMINATORS) end a block."""

    label: str | None
    ins: list[tuple[int, str, tuple[str, int] | None]] = field(default_factory=list)
    succ: list[int] = field(default_factory=list)
    falls: bool = True  # control may continue into the next block in address order
    targets: list[str] = field(default_factory=list)


def split_blocks(sass: str, kernel: str) -> list[Block]:
    """The basic blocks of ``kernel``'s section of ``nvdisasm -c -g`` output, in address order, with successors
    (branch targets, BRX jump-table targets and the fall-through). NOPs are dropped (padding); the section's
    local subroutines ($__internal..., e.g. 64-bit division) are left out (called on a rare path only)."""
    start = sass.find(f".text.{kernel}:")
    if start < 0:
        raise ValueError(f"no section .text.{kernel} in the disassembly")
    end = sass.find("\n//---", start)
    blocks: list[Block] = [Block(kernel)]
    where = None
    closed = False
    for text in sass[start:end if end > 0 else None].splitlines()[1:]:
        if text.startswith("$"):  # a local subroutine: the kernel's own code ends here
            break
        m = _LINE.match(text)
        if m:
            where = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        m = _LABEL.match(text)
        if m:
            if blocks[-1].ins:
                blocks.append(Block(m.group(1)))
                closed = False
            else:
                blocks[-1].label = m.group(1)
            continue
        m = _INS.match(text)
        if not m or m.group(2).startswith("NOP"):
            continue
        if closed:
            blocks.append(Block(None))
            closed = False
        ins = m.group(2)
        blocks[-1].ins.append((int(m.group(1), 16), ins, where))
        predicated = ins.startswith("@")
        op = ins.split()[1 if predicated else 0]
        if op.startswith(_TERMINATORS):
            b = blocks[-1]
            b.targets = re.findall(r"`\((\.L_x_\d+)\)", ins)
            table = re.search(r'BRANCH_TARGETS ([^"]*)"', ins)
            if table:
                b.targets += [t.strip() for t in table.group(1).split(",")]
            # a guard (@P0 BRA) or a predicate operand (BRA P1, `(...), BRA.DIV UR4, ...): it may fall through
            operands = ins.split("`")[0].split(None, 2 if predicated else 1)[-1] if "`" in ins else ""
            conditional = (predicated and not ins.startswith("@PT ")) or (op.startswith("BRA") and "," in operands)
            b.falls = conditional
            closed = True
    blocks = [b for b in blocks if b.ins]
    index = {b.label: i for i, b in enumerate(blocks) if b.label}
    for i, b in enumerate(blocks):
        b.succ = [index[t] for t in b.targets if t in index]
        if b.falls and i + 1 < len(blocks):
            b.succ.append(i + 1)
    return blocks


def reach(blocks: list[Block], start: int, stop: set[int]) -> set[int]:
    """Blocks reachable from ``start`` without passing through ``stop``."""
    seen, todo = set(), [start]
    while todo:
        i = todo.pop()
        if i in seen or i in stop:
            continue
        seen.add(i)
        todo += blocks[i].succ
    return seen


# ---- regions: which mirror event makes each source line of the encoder run ----------------------------------

#: helpers whose inlined code belongs to whichever region calls them (their blocks take the region of the block
#: before them): bit tricks, the plane gather/nibble packing and LaneWriter's writes (but for the store)
NEUTRAL = ("ctz32", "clz32", "clz64", "popc32", "clz_of", "brev_of", "group_code", "byte_perm", "swap_index_bits",
           "interleave_nibbles", "plane_nibbles", "plane_of", "write_bit", "write_bits", "write_some")

#: helpers the coder calls once per coded block, before the plane loop: region 'block' wherever they are
BLOCK_HELPERS = ("to_fixed", "fwd_lift", "fwd_xform", "delta_swap", "transpose_planes", "put")


def _strip(line: str) -> str:
    return line.split("//")[0]


def function_span(lines: list[str], signature: str, start: int = 1) -> tuple[int, int]:
    """1-based [first, last] lines of the first function from line ``start`` on whose header matches regex
    ``signature`` (by brace depth; comments stripped)."""
    for i in range(start - 1, len(lines)):
        if re.search(signature, lines[i]):
            depth, opened = 0, False
            for j in range(i, len(lines)):
                depth += _strip(lines[j]).count("{") - _strip(lines[j]).count("}")
                opened = opened or "{" in _strip(lines[j])
                if opened and depth <= 0:
                    return i + 1, j + 1
    raise ValueError(f"no function matching {signature!r} in the kernel source")


def find_line(lines: list[str], pattern: str, first: int, last: int) -> int:
    """1-based number of the first line in [first, last] matching regex ``pattern``."""
    for n in range(first, last + 1):
        if re.search(pattern, lines[n - 1]):
            return n
    raise ValueError(f"no line matching {pattern!r} in lines {first}-{last} of the kernel source")


@dataclass
class Regions:
    """Source line -> region of kernels/zfp.cu, found from the code's own statements (so edits that move lines
    keep working; a restructured coder fails loudly in ``find_line``). Regions are the mirror's event names
    (``code_block``, ``tile_events``); ``NEUTRAL`` lines have none; ``store`` lines are LaneWriter's word store,
    counted as '<region>.store' of the region that writes; lines not listed are 'lane' (once per lane and
    tile: the tile loop, loading the block, the word-assembly set-up). 'partial' is the general path of a tile that
    is not whole (encode_tile_lane's else side of `if (whole)`: Span's range checks, load_block, zfp's padding; a
    row's last tile unless the row is whole tiles, the tensor's end, an unaligned source), which the mirror's whole
    tiles never take (``block_regions`` gives it by the branch, not by lines alone)."""

    line_region: dict[int, str]
    neutral: set[int]
    store: set[int]
    dims_line: int  # `if (dims == 2)`: the branch between the two paths
    feedback_line: int  # `if (!feedback)`: the branch to error feedback
    feedback_marker: int  # a line only the error-feedback path runs
    dims2_lines: set[int]  # lines only the dims=2 path runs (delta_swap: the plane transpose)
    found_if_line: int  # `if (t < lim)`: its else side is the 'limit' region
    tile_loop_line: int  # `for (... tile = first; ...)`: the warp's tile loop; 'lane' code outside it is 'warp'
    whole_lines: set[int]  # `if (whole) {` in encode_tile_lane, its then side and load_whole: the branch's lines
    general_marker: set[int]  # lines only that else side runs (Span's, the test for lanes past the row's end)

    def of(self, line: int) -> str:
        if line in self.store:
            return "store"
        if line in self.neutral:
            return "neutral"
        return self.line_region.get(line, "lane")

    @classmethod
    def from_source(cls, text: str) -> "Regions":
        L = text.splitlines()
        region: dict[int, str] = {}

        def mark(first: int, last: int, name: str) -> None:
            for n in range(first, last + 1):
                region[n] = name

        neutral: set[int] = set()
        for fn in NEUTRAL:  # every overload and every writer's
            header = rf"\b{fn}\s*\(.*\)\s*(const\s*)?\{{"
            for n in [n for n in range(1, len(L) + 1) if re.search(header, L[n - 1])]:
                a, b = function_span(L, header, n)
                neutral.update(range(a, b + 1))
        lane_writer = find_line(L, r"^struct LaneWriter \{", 1, len(L))
        a, b = function_span(L, r"void write_some\(", lane_writer)
        store = set(range(find_line(L, r"if \(total >= 32\)", a, b), find_line(L, r"total -= 32", a, b) + 2))
        a, b = function_span(L, r"ccoll_u32 write_bit\(", lane_writer)
        store.add(find_line(L, r"if \(\+\+fill == 32\)", a, b))
        neutral -= store
        for fn in BLOCK_HELPERS:  # called once per coded block, before the plane loop
            header = rf"\b{fn}\s*\(.*\)\s*(const\s*)?\{{"
            for n in [n for n in range(1, len(L) + 1) if re.search(header, L[n - 1])]:
                a, b = function_span(L, header, n)
                mark(a, b, "block")
        for fn in ("pad_run", "pad_block", "load_block"):  # a tile that is not whole only (see below)
            a, b = function_span(L, rf"\b{fn}\s*\(.*\)\s*\{{")
            mark(a, b, "partial")
        a, b = function_span(L, r"^struct Span \{")
        mark(a, b, "partial")
        for n in [n for n in range(1, len(L) + 1) if re.search(r"\bbool vec_ok\(", L[n - 1])]:  # load_block's
            mark(*function_span(L, r"\bbool vec_ok\(", n), "partial")
        a, b = function_span(L, r"void encode_tile_lane\(")  # its general path: a tile that is not whole
        whole_line = find_line(L, r"if \(whole\) \{", a, b)
        general = find_line(L, r"\} else \{", whole_line, b)
        mark(general, find_line(L, r"^  encode_values<", general, b) - 1, "partial")
        feedback_line = find_line(L, r"if \(!feedback\)", general, b)
        general_marker = {find_line(L, r"if \(in_row >= row_numel\)", general, b)}
        whole_lines = set(range(whole_line, general + 1))  # the compiler may give the branch a line of the load
        whole_lines.update(range(*function_span(L, r"void load_whole\(")))
        general_marker.update(range(*function_span(L, r"^struct Span \{")))
        a, b = function_span(L, r"void finish\(\) \{", lane_writer)
        mark(a, b, "finish")
        mark(find_line(L, r"while \(widx < nwords\)", a, b), b, "zerofill")

        a, b = function_span(L, r"void encode_values\(")
        loop = find_line(L, r"while \(bits > 0 && k > kmin\)", a, b)
        mark(a, loop - 1, "block")
        mark(find_line(L, r"if \(maxmag >= EXPMASK\)", a, b), find_line(L, r"int emax = ", a, b) - 1, "rare")
        tail = find_line(L, r"if \(S == 4 && nsig >= S - 1\)", loop, b)
        chunk = find_line(L, r"for \(int done = 0;", tail, b)
        recon_tail = find_line(L, r"if \(RECON\)", chunk, b)
        mark(loop, tail, "plane")  # the tail's test runs on every plane
        mark(tail + 1, chunk - 1, "tail")
        mark(chunk, recon_tail - 1, "chunk")
        plane = find_line(L, r"--k;", recon_tail, b)
        mark(recon_tail, plane - 1, "tail")
        tests = find_line(L, r"while \(bits > 0 && nsig < S\)", plane, b)
        found = find_line(L, r"if \(t < lim\)", tests, b)
        limit = find_line(L, r"\} else \{", found, b)
        sig = find_line(L, r"xr \|= ", limit, b)
        done = find_line(L, r"nsig \+= t \+ 1;", sig, b)
        fin = find_line(L, r"w\.finish\(\);", done, b)
        mark(plane, tests - 1, "plane")
        mark(tests, found, "test")
        mark(found + 1, limit - 1, "found")
        mark(limit, sig - 1, "limit")
        mark(sig, done, "sig")
        mark(done + 1, fin - 1, "plane")  # the loops' closing lines and `if (RECON)`
        mark(fin, fin, "finish")
        mark(fin + 1, b, "recon")  # error feedback only

        a, b = function_span(L, r"void assemble_tile_lane\(")
        copy = find_line(L, r"if \(\(maxbits & 31\) == 0\)", a, b)
        words = find_line(L, r"for \(int j = lane; ", copy, b)
        copy_loop = find_line(L, r"for \(int j = lane; ", words + 1, b)
        mark(words, copy_loop - 1, "copy")
        words = copy_loop
        pieces = find_line(L, r"for \(int got = 0;", words, b)
        pieces_end = find_line(L, r"got \+= take;", pieces, b) + 1
        mark(words, b, "word")
        mark(pieces, pieces_end, "piece")

        a, b = function_span(L, r"void encode_span\(")
        feedback_marker = find_line(L, r"add_rn\(\(Fb\)v\[i\], feedback", a, b)
        a, b = function_span(L, r"void encode_tiles_warp\(")
        dims_line = find_line(L, r"if \(dims == 2\)", a, b)
        a, b = function_span(L, r"void encode_tiles_run\(")
        tile_loop = find_line(L, r"for \(ccoll_u64 left = ", a, b)
        swaps: set[int] = set()
        for n in [n for n in range(1, len(L) + 1) if re.search(r"void delta_swap\(", L[n - 1])]:
            a, b = function_span(L, r"void delta_swap\(", n)
            swaps.update(range(a, b + 1))
        return cls(region, neutral, store, dims_line, feedback_line, feedback_marker, swaps, found, tile_loop,
                   whole_lines, general_marker)


#: the regions the mirror counts (``tile_events``); '<region>.store' exists for those that write bits
EVENTS = ("warp", "lane", "block", "rare", "partial", "plane", "tail", "chunk", "test", "found", "limit", "sig", "finish",
          "zerofill", "copy", "word", "piece")
WRITERS = ("block", "plane", "chunk", "test", "found", "limit")
#: regions whose loop the compiler may peel: the mirror counts their entries ('<region>.first')
PEELED = ("piece", "chunk", "zerofill", "copy")


def _lines(blocks: list[Block], ids: set[int]) -> set[int]:
    return {w[1] for i in ids for _, _, w in blocks[i].ins if w and w[0] == "zfp.cu"}


def _split(blocks: list[Block], ids: set[int], line: int, marker: set[int]) -> tuple[set[int], set[int]]:
    """At the first two-way branch on source ``line`` among ``ids`` (address order): the blocks only its one
    side reaches (the side that runs a ``marker`` line) and those only the other side reaches."""
    for i in sorted(ids):
        b = blocks[i]
        if len(b.succ) == 2 and b.ins[-1][2] == ("zfp.cu", line):
            one, two = (reach(blocks, s, {i}) for s in b.succ)
            one, two = one - two, two - one
            if bool(_lines(blocks, one) & marker) != bool(_lines(blocks, two) & marker):
                return (one, two) if _lines(blocks, one) & marker else (two, one)
    raise ValueError(f"no branch on line {line} of zfp.cu with a side that alone runs lines {sorted(marker)[:3]}...")


def path_blocks(blocks: list[Block], regions: Regions, dims: int) -> set[int]:
    """The blocks the tile encoder runs for ``dims`` without error feedback: those reachable from the entry
    once the other dims' side of `if (dims == 2)` and the feedback side of `if (!feedback)` are cut off."""
    two, one = _split(blocks, set(range(len(blocks))), regions.dims_line, regions.dims2_lines)
    mine, other = (two, one) if dims == 2 else (one, two)
    feedback, _ = _split(blocks, mine, regions.feedback_line, {regions.feedback_marker})
    return reach(blocks, 0, other | feedback)


def _named(regions: Regions, block: Block) -> collections.Counter:
    """Instructions of ``block`` per region of their source line, NEUTRAL and store lines left out."""
    kinds = collections.Counter(regions.of(w[1]) for _, _, w in block.ins if w and w[0] == "zfp.cu")
    return collections.Counter({k: v for k, v in kinds.items() if k not in ("neutral", "store")})


def _stores_word(regions: Regions, block: Block) -> bool:
    """The block is LaneWriter's word-store branch: an unpredicated store on a store line (a predicated one is
    the compiler's if-conversion of that branch into a block that runs on every write)."""
    return any(t.split()[0].startswith("ST") and w and w[0] == "zfp.cu" and w[1] in regions.store
               for _, t, w in block.ins)


def block_regions(blocks: list[Block], regions: Regions, ids: set[int]) -> dict[int, str]:
    """Region of each block of a path. A block's region is its instructions' most frequent one; a block of only
    NEUTRAL lines (an inlined write, a bit trick) takes the region of the block before it in address order, but
    on the `else` side of `if (t < lim)` (the inlined write of the limit case has no line of its own) 'limit';
    a block that stores a word (``_stores_word``) is '<that region>.store'. A loop block (a self-edge) whose first
    iteration the compiler peeled (most of its lines are in another block of the region) is '<region>.again',
    the region's other blocks '<region>.first' (once per entry: mirror events of those names)."""
    limit: set[int] = set()
    for i in sorted(ids):
        b = blocks[i]
        if len(b.succ) == 2 and b.ins[-1][2] == ("zfp.cu", regions.found_if_line):
            one, two = (reach(blocks, s, {i}) - {i} for s in b.succ)
            one, two = one - two, two - one
            limit |= two if any(_named(regions, blocks[j])["found"] for j in one) else one
    out: dict[int, str] = {}
    prev = "lane"
    for i in sorted(ids):
        named = _named(regions, blocks[i])
        if named:
            prev = named.most_common(1)[0][0]
        elif i in limit:
            prev = "limit"
        name = prev
        if _stores_word(regions, blocks[i]):
            if prev not in WRITERS:
                raise ValueError(f"block {i} ({blocks[i].label}) stores a word after region {prev!r}, which "
                                 "writes none")
            name = prev + ".store"
        if name.split(".")[0] not in EVENTS:
            raise ValueError(f"block {i} ({blocks[i].label}) of the path is in region {name!r}: the paths were "
                             "not separated (error feedback code in a plain path?)")
        out[i] = name
    for i, name in list(out.items()):
        if i not in blocks[i].succ:
            continue
        mine = {w[1] for _, _, w in blocks[i].ins if w}
        others = [j for j, n in out.items() if n == name and j != i]
        elsewhere = {w[1] for j in others for _, _, w in blocks[j].ins if w}
        if len(mine & elsewhere) * 2 >= len(mine):
            if name not in PEELED:
                raise ValueError(f"block {i}: a peeled loop in region {name!r}, whose entries the mirror does not "
                                 "count")
            for j in others:
                out[j] = name + ".first"
            out[i] = name + ".again"
    # 'partial' is the blocks only a tile that is not whole runs, whatever their lines: the compiler hoists or shares
    # code across `if (whole)` (e.g. one address for both sides' loads), so a block of mostly 'partial' lines on the
    # way every tile takes is 'lane', and one of other lines on the not-whole side only is 'partial'
    general = not_whole_side(blocks, regions, ids)
    for i, name in out.items():
        if name == "partial" and i not in general:
            out[i] = "lane"
        elif i in general and name in ("lane", "warp"):
            out[i] = "partial"
    loop = tile_loop(blocks, regions, ids) if "lane" in out.values() else set()
    for i, name in out.items():
        if name == "lane" and i not in loop:
            out[i] = "warp"
    return out


def not_whole_side(blocks: list[Block], regions: Regions, ids: set[int]) -> set[int]:
    """The blocks among ``ids`` that only the not-whole side of `if (whole)` reaches: at the first two-way branch (address
    order) on one of its lines (``whole_lines``: the compiler may hoist the load above the branch and give the branch
    the load's line) whose one side alone runs the not-whole side's lines. None where ``ids`` has no such branch, as in
    a made-up kernel."""
    for i in sorted(ids):
        b = blocks[i]
        if len(b.succ) == 2 and b.ins[-1][2] and b.ins[-1][2][0] == "zfp.cu" and b.ins[-1][2][1] in regions.whole_lines:
            one, two = (reach(blocks, s, {i}) for s in b.succ)
            one, two = one - two, two - one
            if bool(_lines(blocks, one) & regions.general_marker) != bool(_lines(blocks, two) & regions.general_marker):
                return one if _lines(blocks, one) & regions.general_marker else two
    return set()


def tile_loop(blocks: list[Block], regions: Regions, ids: set[int]) -> set[int]:
    """The blocks of the warp's tile loop among ``ids``: the natural loop of the back edge on the loop's `for` line
    (its header and every block that reaches the edge without passing the header). The per-lane set-up outside it
    runs once per warp ('warp'), the rest of 'lane' once per tile."""
    for i in sorted(ids):
        b = blocks[i]
        back = [j for j in b.succ if j <= i and j in ids]
        if back and b.ins[-1][2] == ("zfp.cu", regions.tile_loop_line):
            head = back[0]
            preds: dict[int, list[int]] = collections.defaultdict(list)
            for k in ids:
                for j in blocks[k].succ:
                    preds[j].append(k)
            loop, todo = {head}, [i]
            while todo:
                k = todo.pop()
                if k not in loop:
                    loop.add(k)
                    todo += [j for j in preds[k] if j in ids]
            return loop
    raise ValueError(f"no back edge on line {regions.tile_loop_line} of zfp.cu (the tile loop) among the path's blocks")


def region_costs(blocks: list[Block], regions: Regions, ids: set[int]) -> dict[str, int]:
    """Static instructions per region (``block_regions``) over the blocks ``ids``."""
    costs: collections.Counter = collections.Counter()
    for i, name in block_regions(blocks, regions, ids).items():
        costs[name] += len(blocks[i].ins)
    return dict(costs)


# ---- the compile and the disassembly --------------------------------------------------------------------------

class NvdisasmNotFound(KernelError):
    """No nvdisasm: it is not part of the venv (only this tool needs it); the message names the pip command."""


def find_nvdisasm(given: str | None = None) -> str:
    """nvdisasm from ``given`` (--nvdisasm), $CCOLL_NVDISASM, the copy `make sass-estimate` installs under
    build/tools/, PATH, or a nvidia-cuda-nvdisasm wheel on sys.path, in that order."""
    candidates = [given, os.environ.get("CCOLL_NVDISASM"), str(LOCAL_NVDISASM), shutil.which("nvdisasm")]
    candidates += [str(Path(p or ".") / "nvidia" / sub / "bin" / "nvdisasm") for p in sys.path
                   for sub in ("cu13", "cuda_nvdisasm")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    if given:
        raise NvdisasmNotFound(f"--nvdisasm {given}: no such executable")
    local = LOCAL_NVDISASM.relative_to(ROOT) if LOCAL_NVDISASM.is_relative_to(ROOT) else LOCAL_NVDISASM
    raise NvdisasmNotFound(f"nvdisasm not found (--nvdisasm, $CCOLL_NVDISASM, {local}, PATH); install the wheel "
                           f"with: {PIP_NVDISASM}")


def compile_cubin() -> tuple[bytes, tuple[str, ...], str]:
    """kernels/zfp.cu for ARCH by NVRTC with exactly the codec's options (``module_options``: what a GPU loads)
    plus -lineinfo (source lines for nvdisasm -g; no code change): (cubin, options, NVRTC version)."""
    from ccoll import kernels

    options = kernels.module_options("zfp", ARCH) + ("-lineinfo",)
    path = kernels.source("zfp")
    _, cubin, _ = kernels.nvrtc().compile(path.read_text(), str(path), options)
    return cubin, options, ".".join(map(str, kernels.nvrtc().version))


def disassemble(cubin: bytes, nvdisasm: str) -> str:
    """``nvdisasm -c -g`` of a cubin (code only, with the line table's file/line comments)."""
    with tempfile.TemporaryDirectory() as tmp:  # nvdisasm reads a file (it cannot read a pipe)
        path = Path(tmp) / "zfp.cubin"
        path.write_bytes(cubin)
        proc = subprocess.run([nvdisasm, "-c", "-g", str(path)], capture_output=True)
    if proc.returncode != 0:
        raise KernelError(f"{nvdisasm} -c -g failed: {proc.stderr.decode(errors='replace')}")
    return proc.stdout.decode()


# ---- the estimate -----------------------------------------------------------------------------------------

SEED = 0
RATES = (8, 16)
TILES = 100  # warps of 32 blocks per (dims, rate): 3200 blocks


@dataclass
class Estimate:
    """One (dims, rate): thread-instructions per block for the mean lane and for the slowest lane of each warp
    (mean over warps), and the events per block behind them."""

    dims: int
    rate: int
    tiles_per_warp: int
    lane_mean: float
    slowest_lane: float
    events: dict[str, float]

    @property
    def values(self) -> int:
        return 4 if self.dims == 1 else 16


def estimate(costs: dict[str, int], dims: int, rate: int, tiles: int = TILES, seed: int = SEED,
             tiles_per_warp: int = 1) -> Estimate:
    """Weights the static region counts ``costs`` of the dims path by the mirror's events on Gaussian f32 values
    (fixed seed): per lane, sum over regions of instructions x events; the warp's set-up shared by
    ``tiles_per_warp`` tiles."""
    S = 4 if dims == 1 else 16
    x = np.random.default_rng(seed).standard_normal(32 * tiles * S).astype(np.float32)
    evs = tile_events(x, rate, dims, tiles_per_warp)
    lanes = [sum(c * ev[r] for r, c in costs.items()) for ev in evs]
    slowest = [max(lanes[t:t + 32]) for t in range(0, len(lanes), 32)]
    total = sum(evs, collections.Counter())
    return Estimate(dims, rate, tiles_per_warp, float(np.mean(lanes)), float(np.mean(slowest)),
                    {r: total[r] / len(evs) for r in costs})


def launch_tiles_per_warp() -> tuple[int, ...]:
    """The runs of tiles per warp the codec's launch gives (ccoll/codecs/zfp.py ``tiles_per_warp``): 1 for small
    inputs, ``TILES_PER_WARP_MAX`` for large ones."""
    from ccoll.codecs.zfp import TILES_PER_WARP_MAX

    return (1, TILES_PER_WARP_MAX)


def report(sass: str, how: str, budget: Budget = H200, tiles: int = TILES) -> str:
    """The table: static instructions per region, events per block (with the largest run of tiles per warp), and
    the estimate per (tiles per warp, dims, rate)."""
    source = (ROOT / "kernels" / "zfp.cu").read_text()
    regions = Regions.from_source(source)
    blocks = split_blocks(sass, KERNEL)
    lines = source.splitlines()
    entry = find_line(lines, rf"CCOLL_ZFP_TILE_KERNEL\({KERNEL},", 1, len(lines))
    first = next(w for b in blocks for _, _, w in b.ins if w)
    if first != ("zfp.cu", entry):  # a disassembly of another version: its lines would name the wrong regions
        raise ValueError(f"the disassembly's {KERNEL} starts at {first}, the source's at line {entry}: not a "
                         "disassembly of this kernels/zfp.cu (run without --sass to compile it)")
    costs = {d: region_costs(blocks, regions, path_blocks(blocks, regions, d)) for d in (1, 2)}
    runs = launch_tiles_per_warp()
    all_ests = [estimate(costs[d], d, r, tiles, tiles_per_warp=k) for k in runs for d in (1, 2) for r in RATES]
    ests = [e for e in all_ests if e.tiles_per_warp == runs[-1]]
    out = [f"{KERNEL}, {ARCH}: {how}",
           f"{len(blocks)} basic blocks, {sum(len(b.ins) for b in blocks)} instructions; the path without error "
           f"feedback: dims=1 {sum(costs[1].values())}, dims=2 {sum(costs[2].values())}",
           "",
           "static instructions per region (``block_regions``) x events per block "
           f"(Gaussian f32, seed {SEED}, {32 * tiles} blocks; {runs[-1]} tiles per warp: 'warp' is the set-up outside "
           "the tile loop):"]
    order = {r: n for n, r in enumerate(EVENTS)}
    names = sorted(set(costs[1]) | set(costs[2]), key=lambda r: (order[r.split(".")[0]], r))
    out.append(f"  {'region':<12}" + "".join(f"  {'dims=' + str(e.dims) + ' rate ' + str(e.rate):>22}" for e in ests))
    for r in names:
        cells = [f"{costs[e.dims][r]:5d} x {e.events[r]:6.2f} = {costs[e.dims][r] * e.events[r]:5.0f}"
                 if r in costs[e.dims] else "-" for e in ests]
        out.append(f"  {r:<12}" + "".join(f"  {c:>22}" for c in cells))
    out += ["",
            f"estimate (thread-instructions; copy: H200 f32 copy at {budget.copy_bytes_per_s / 1e12:g} TB/s, "
            f"{budget.copy_bytes_per_value:g} B per value, against {budget.sms} SMs x {budget.int32_lanes_per_sm} "
            f"INT32 lanes x {budget.clock_hz / 1e9:g} GHz = {budget.thread_instructions_per_s / 1e12:.1f}e12/s):",
            f"  {'tiles/warp':>10} {'dims':>4} {'rate':>4} | {'mean lane: per block':>20} {'per value':>9} "
            f"{'of copy':>7} | {'slowest lane/warp: per block':>28} {'per value':>9} {'of copy':>7}"]
    for e in all_ests:
        pv, sv = e.lane_mean / e.values, e.slowest_lane / e.values
        out.append(f"  {e.tiles_per_warp:>10} {e.dims:>4} {e.rate:>4} | {e.lane_mean:>20.0f} {pv:>9.1f} "
                   f"{budget.fraction_of_copy(pv):>7.0%} | {e.slowest_lane:>28.0f} {sv:>9.1f} "
                   f"{budget.fraction_of_copy(sv):>7.0%}")
    out.append(f"tiles/warp: the launch's run of tiles per warp, {runs[0]} for small inputs, {runs[-1]} for large "
               "ones (ccoll/codecs/zfp.py tiles_per_warp).")
    out.append("An estimate, not a measurement: static counts at full issue efficiency, no latency or stalls.")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="tools/sass_estimate.py")
    ap.add_argument("--nvdisasm", help="the nvdisasm executable (default: $CCOLL_NVDISASM, build/tools/, PATH)")
    ap.add_argument("--sass", type=Path, help="use this `nvdisasm -c -g` output instead of compiling")
    ap.add_argument("--save-sass", type=Path, help="also write the disassembly here")
    ap.add_argument("--tiles", type=int, default=TILES, help="tiles of 32 blocks the mirror codes per (dims, rate)")
    args = ap.parse_args(argv)
    if args.sass:
        sass, how = args.sass.read_text(), f"from {args.sass}"
    else:
        nvdisasm = find_nvdisasm(args.nvdisasm)
        cubin, options, version = compile_cubin()
        sass = disassemble(cubin, nvdisasm)
        opts = " ".join(o if not o.startswith("-I") else "-Ikernels" for o in options)
        how = f"NVRTC {version} {opts}; {Path(nvdisasm).name} -c -g"
    if args.save_sass:
        args.save_sass.write_text(sass)
    print(report(sass, how, tiles=args.tiles))
    return 0


if __name__ == "__main__":
    sys.exit(main())
