"""tools/sass_estimate.py (`make sass-estimate`), the source of kernels/zfp.cu's roofline estimate: its Python
mirror of the block coder is the real coder (its bytes are libzfp's), its basic-block splitter reads real
nvdisasm output as it should, its budget arithmetic is the header's, and the whole tool runs where NVRTC and
nvdisasm are available."""
from __future__ import annotations

import collections
import contextlib
import io
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from ccoll import kernels
from ccoll.errors import KernelError

sys.path.insert(0, str(Path(kernels.ROOT) / "tools"))
import sass_estimate as se  # noqa: E402

try:
    import zfpy
except ImportError:
    zfpy = None

DATA = Path(__file__).parent / "data"


def gaussian_with_zeros(n: int, seed: int) -> np.ndarray:
    """Gaussian values over 2^-20 .. 2^20, a fifth of them zero (blocks with few significant coefficients):
    lanes with few and with many planes. No tiny or non-finite blocks (libzfp leaves those undefined)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))
    x[rng.random(n) < 0.2] = 0.0
    return x.astype(np.float32)


def zfpy_stream(x: np.ndarray, rate: int, dims: int) -> bytes:
    if zfpy is None:
        pytest.skip("zfpy (libzfp's Python binding) is not installed: the mirror cannot be checked against libzfp")
    return zfpy.compress_numpy(x if dims == 1 else x.reshape(-1, 4), rate=rate, write_header=False)


@pytest.mark.parametrize("dims,rate", [(1, 3), (1, 8), (1, 13), (1, 16), (2, 2), (2, 8), (2, 16), (2, 23)])
def test_mirror_bytes_are_libzfp(dims, rate):
    x = gaussian_with_zeros(2048, seed=dims * 100 + rate)  # 512 dims=1 / 128 dims=2 blocks
    got, events = se.encode(x, rate, dims)
    assert got == zfpy_stream(x, rate, dims)
    # every block had its header and used its whole budget or ran out of planes
    assert sum(e["block"] + e["zero"] for e in events) == len(events)


def test_mirror_events_are_the_coders():
    """The events are those of the bits written: dims=2 writes one bit per group test and one plane's worth of
    verbatim bits per significant coefficient; dims=1 at rate 16 reaches the all-significant tail in most blocks."""
    x = gaussian_with_zeros(4096, seed=7)
    _, ev2 = se.encode(x, 8, 2)
    assert all(e["test"] >= e["found"] + e["limit"] for e in ev2)
    assert all(e["plane"] <= 32 for e in ev2)
    _, ev1 = se.encode(x, 16, 1)
    assert np.mean([e["tail"] for e in ev1]) > 0.5
    assert all(e["chunk"] == 0 or e["tail"] == 1 for e in ev1)


@pytest.mark.parametrize("sabotage", ["skip a plane", "no transform", "identity order"])
def test_mirror_check_can_fail(monkeypatch, sabotage):
    """The byte comparison has teeth: a mirror that skips a plane, leaves out the decorrelating transform or
    codes dims=2 coefficients in natural order does not match libzfp."""
    dims = 1 if sabotage == "no transform" else 2
    x = gaussian_with_zeros(1024, seed=3)
    expect = zfpy_stream(x, 8, dims)
    if sabotage == "skip a plane":
        code = se._code_planes
        monkeypatch.setattr(se, "_code_planes", lambda u, bits, S, out: code([v >> 1 for v in u], bits, S, out))
    elif sabotage == "no transform":
        monkeypatch.setattr(se, "lift", lambda p, i0, stride: None)
    else:
        monkeypatch.setattr(se, "PERM2", tuple(range(16)))
    assert se.encode(x, 8, dims)[0] != expect


def test_warp_events_are_shared_by_the_run():
    """'warp' (the set-up outside the tile loop) is a block's 1 / tiles_per_warp share, 'lane' once per tile."""
    x = np.random.default_rng(1).standard_normal(32 * 4 * 2).astype(np.float32)
    for k in (1, 2, 8):
        evs = se.tile_events(x, 8, 1, tiles_per_warp=k)
        assert all(ev["warp"] == 1 / k and ev["lane"] == 1 for ev in evs)


def test_assembly_events():
    # blocks of whole words take the copy loop: dims=1 rate 8 one word per lane, rate 16 two, dims=2 rate 8 four
    assert se.assemble_events(32, 5) == {"copy": 1}
    assert se.assemble_events(64, 5) == {"copy": 2} and se.assemble_events(128, 31) == {"copy": 4}
    # maxbits 36: a word meets two lane buffers where a block boundary falls inside it
    ev = [se.assemble_events(36, lane) for lane in range(32)]
    assert sum(e["word"] for e in ev) == 36
    # the 31 block boundaries at bits 36k: those at multiples of 32 (k = 8, 16, 24) fall between words
    assert sum(e["piece"] for e in ev) == 36 + 31 - 3


def test_split_blocks_on_real_nvdisasm_output():
    """A cut of real `nvdisasm -c -g` output: blocks end at branches (conditional ones fall through), labels
    start blocks, BRX takes its BRANCH_TARGETS, BSSY/BSYNC/BREAK do not end a block, and a branch with a
    predicate operand (`@!P0 BRA P1, ...`) is conditional."""
    text = (DATA / "nvdisasm_cut.sass").read_text()
    switch = se.split_blocks(text, "switch_cut")
    assert [len(b.ins) for b in switch] == [2, 5, 1, 1, 1, 2, 5, 1, 1, 2, 1, 1]
    assert [b.succ for b in switch] == [[6, 1], [2], [3, 4, 10], [4], [5], [8], [7], [8, 9, 11], [9], [11], [11], []]
    assert switch[2].ins[0][1].startswith("BRX") and switch[10].ins[0][1].startswith("BREAK")
    assert switch[0].ins[0][2] == ("zfp.cu", 457)
    loop = se.split_blocks(text, "loop_cut")
    assert [(b.label, len(b.ins), b.succ) for b in loop] == [
        ("loop_cut", 1, [3, 1]), (None, 1, [2]), (".L_x_2931", 19, [2, 3]), (".L_x_2930", 1, [4]),
        (".L_x_2929", 11, [5]), (".L_x_2928", 1, [6]), (".L_x_2927", 1, [])]
    assert collections.Counter(w[1] for _, _, w in loop[2].ins)[1131] == 6
    assert se.reach(loop, 0, set()) == set(range(7)) and se.reach(loop, 0, {2}) == {0, 1, 3, 4, 5, 6}
    with pytest.raises(ValueError, match="no section"):
        se.split_blocks(text, "no_such_kernel")


def test_regions_found_in_the_source():
    """Every region the mirror counts is located in today's kernels/zfp.cu by the coder's own statements."""
    src = (Path(kernels.ROOT) / "kernels" / "zfp.cu").read_text()
    r = se.Regions.from_source(src)
    lines = src.splitlines()
    assert "if (dims == 2)" in lines[r.dims_line - 1] and "if (!feedback)" in lines[r.feedback_line - 1]
    assert "if (t < lim)" in lines[r.found_if_line - 1]
    assert any("words[widx++] = acc;" in lines[n - 1] for n in r.store)
    assert set(r.line_region.values()) <= set(se.EVENTS) | {"recon"}
    for name in ("block", "plane", "tail", "chunk", "test", "found", "limit", "sig", "finish", "copy", "word", "piece"):
        assert name in r.line_region.values(), name
    with pytest.raises(ValueError, match="no line matching"):
        se.Regions.from_source(src.replace("if (t < lim)", "if (lim > t)"))


def test_budget_is_the_headers():
    """kernels/zfp.cu's header: ~16e12 thread-instructions/s, copy at ~5e11 values/s, so 25% of copy is a
    budget of ~130 instructions per value."""
    assert se.H200.thread_instructions_per_s == pytest.approx(16e12, rel=0.01)
    assert se.H200.copy_values_per_s == pytest.approx(5e11)
    assert se.H200.fraction_of_copy(128.4) == pytest.approx(0.25, rel=0.01)


def test_nvdisasm_missing_names_the_pip_command(monkeypatch, tmp_path):
    monkeypatch.setenv("CCOLL_NVDISASM", str(tmp_path / "none"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(se, "LOCAL_NVDISASM", tmp_path / "none")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    with pytest.raises(se.NvdisasmNotFound, match="pip install --target build/tools/nvdisasm nvidia-cuda-nvdisasm"):
        se.find_nvdisasm()


def test_whole_tool():
    """Compile (NVRTC, the codec's options), disassemble, split, weight, print: the table has every (dims,
    rate) with per-value counts and fractions of copy in sane ranges."""
    try:
        nvdisasm = se.find_nvdisasm()
        kernels.nvrtc()
    except KernelError as e:  # NvdisasmNotFound too
        pytest.skip(f"needs NVRTC and nvdisasm (`make sass-estimate` installs nvdisasm): {e}")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert se.main(["--nvdisasm", nvdisasm, "--tiles", "20"]) == 0
    text = out.getvalue()
    assert "-lineinfo" in text and "--fmad=false" in text and "-ftz=false" in text
    rows = re.findall(r"^\s+(\d+)\s+([12])\s+(8|16) \|\s+(\d+)\s+([\d.]+)\s+(\d+)% \|\s+(\d+)\s+([\d.]+)\s+(\d+)%$",
                      text, re.M)
    runs = se.launch_tiles_per_warp()
    assert runs[0] == 1 and runs[-1] > 1
    assert [(int(k), d, r) for k, d, r, *_ in rows] == [(k, d, r) for k in runs for d in "12" for r in ("8", "16")]
    for k, d, r, block, per_value, frac, slow_block, slow_value, slow_frac in rows:
        assert 20 < float(per_value) < 1000 and 1 <= int(frac) <= 100
        assert int(slow_block) >= int(block) and int(slow_frac) <= int(frac)
    # a longer run of tiles per warp shares the warp's set-up: strictly fewer instructions per block
    one, many = rows[:4], rows[4:]
    assert all(int(b[3]) < int(a[3]) and int(b[6]) < int(a[6]) for a, b in zip(one, many))
    assert re.search(r"^  warp\s+\d+ x\s+0\.12", text, re.M) and re.search(r"^  lane\s+\d+ x\s+1\.00", text, re.M)
    # the dims=1 plane loop and the dims=2 group tests are in the table, with nonzero counts
    assert re.search(r"^  plane\s+\d+ x\s+[1-9]", text, re.M) and re.search(r"^  test\s+-\s+-\s+\d+ x", text, re.M)


def synthetic_sass(r: se.Regions) -> str:
    """A made-up kernel in nvdisasm's format whose instructions sit on real lines of kernels/zfp.cu: a group
    test branching at `if (t < lim)` to a found side and a limit side (a neutral write, then a word store), a
    join, and a word-assembly loop whose first iteration is peeled."""
    line = {name: min(n for n, v in r.line_region.items() if v == name) for name in ("test", "found", "sig")}
    pieces = sorted(n for n, v in r.line_region.items() if v == "piece")[:2]
    neutral, store = min(r.neutral), min(r.store)
    rows = [(None, ".L_x_0:"), (line["test"], "ISETP.NE.AND P0, PT, R7, RZ, PT"),
            (r.found_if_line, "@!P0 BRA `(.L_x_2)"),
            (neutral, "IMAD.MOV.U32 R9, RZ, RZ, R15"), (neutral, "@P1 BRA `(.L_x_4)"),
            (store, "STS [R17], R6"), (store, "BRA `(.L_x_4)"),
            (None, ".L_x_2:"), (line["found"], "VIADD R15, R16, 0x1"), (store, "@P0 STS [R17], R6"),
            (None, ".L_x_4:"), (line["sig"], "IMAD.IADD R5, R5, 0x1, R14"), (line["sig"], "@P0 BRA `(.L_x_0)"),
            (pieces[0], "LDS R10, [R10]"), (pieces[1], "LOP3.LUT R13, R14, R13, RZ, 0xfc, !PT"),
            (None, ".L_x_7:"), (pieces[0], "LDS R10, [R10]"), (pieces[1], "LOP3.LUT R13, R14, R13, RZ, 0xfc, !PT"),
            (pieces[1], "@!P0 BRA P1, `(.L_x_7)"), (None, "EXIT")]
    out, addr = [".text.synth:"], 0
    for n, text in rows:
        if n is None and text.startswith("."):
            out.append(text)
            continue
        if n is not None:
            out.append(f'\t//## File "kernels/zfp.cu", line {n}')
        out.append(f"        /*{addr:04x}*/                   {text} ;")
        addr += 16
    return "\n".join(out) + "\n"


def test_block_regions_rules():
    """The region rules on a made-up kernel: the else side of `if (t < lim)` is 'limit' though its write has no
    line of its own, an unpredicated word store is '<region>.store' (a predicated one is not), and a peeled loop
    is '.first' (once per entry) and '.again' (the further iterations)."""
    r = se.Regions.from_source((Path(kernels.ROOT) / "kernels" / "zfp.cu").read_text())
    blocks = se.split_blocks(synthetic_sass(r), "synth")
    assert [b.succ for b in blocks] == [[3, 1], [4, 2], [4], [4], [0, 5], [6], [6, 7], []]
    names = se.block_regions(blocks, r, set(range(len(blocks))))
    assert [names[i] for i in range(len(blocks))] == [
        "test", "limit", "limit.store", "found", "sig", "piece.first", "piece.again", "piece.first"]
    assert se.region_costs(blocks, r, set(range(len(blocks))))["piece.again"] == 3


# ---- tools/sass_loop.py: kernels/quant.cu's decode_sum counts -------------------------------------------------

_LOOP_SASS = """
//--------------------- .text.k --------------------------
.text.k:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   ISETP.GT.U32.OR P0, PT, R8, 0x72ffffff, P0 ;
        /*0030*/               @P0 BRA `(.L_x_2) ;
        /*0040*/                   FADD R9, R9, R4 ;
        /*0050*/                   BRA `(.L_x_3) ;
.L_x_2:
        /*0060*/                   LOP3.LUT R4, R4, 0x7fffffff, RZ, 0xc0, !PT ;
        /*0070*/                   FADD R9, R9, R4 ;
.L_x_3:
        /*0080*/                   BSYNC B0 ;
        /*0090*/              @!P1 BRA `(.L_x_1) ;
        /*00a0*/                   EXIT ;
//--------------------- .text.other --------------------------
"""


def test_sass_loop_walks_one_turn_along_the_fall_through_or_the_taken_branch():
    """The decode_sum figures in kernels/quant.cu's header come from this walk: the fall-through path skips the
    branch-target block, --take follows it instead, and the walk ends at the branch back to the loop head."""
    import sass_loop

    lines = sass_loop.kernel_lines(_LOOP_SASS, "k")
    fast = sass_loop.loop_turn(lines)
    assert [sass_loop.opcode(t) for t in fast] == ["LDG", "ISETP", "BRA", "FADD", "BRA", "BSYNC", "BRA"]
    slow = sass_loop.loop_turn(lines, {".L_x_2"})
    assert [sass_loop.opcode(t) for t in slow] == ["LDG", "ISETP", "BRA", "LOP3", "FADD", "BSYNC", "BRA"]
    with pytest.raises(ValueError, match="no vector load"):
        sass_loop.loop_turn(sass_loop.kernel_lines(_LOOP_SASS.replace("LDG.E.128", "LDG.E"), "k"))


_ENCODE_SASS = """
//--------------------- .text.e --------------------------
.text.e:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_10:
        /*0010*/                   LDG.E R3, desc[UR4][R8.64] ;
        /*0020*/               @!P2 BRA `(.L_x_10) ;
.L_x_11:
        /*0030*/                   IADD3 R2, R2, 0x1, RZ ;
.L_x_12:
        /*0040*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0050*/               @!P1 BRA `(.L_x_13) ;
        /*0060*/                   IMAD R6, R6, 0x7feb352d, RZ ;
        /*0070*/                   FADD R4, R4, R6 ;
        /*0080*/                   BRA `(.L_x_14) ;
.L_x_13:
        /*0090*/                   FMUL R4, R4, R7 ;
        /*00a0*/                   FRND R4, R4 ;
.L_x_14:
        /*00b0*/                   STG.E [R2.64], R4 ;
        /*00c0*/               @!P0 BRA `(.L_x_12) ;
        /*00d0*/               @!P3 BRA `(.L_x_11) ;
        /*00e0*/                   EXIT ;
//--------------------- .text.other --------------------------
"""


def test_sass_loop_encode_walks_innermost_load_store_loops_along_round_to_nearest():
    """The encode figures in kernels/quant.cu's header come from ``sass_loop.py --encode``: only innermost loops
    that load and store count (not the load-only loop, not the outer loop), and at a conditional branch the
    walk leaves the side that starts the stochastic key's hash (cq_mix32's multiplier)."""
    import sass_loop

    turns = sass_loop.encode_turns(sass_loop.kernel_lines(_ENCODE_SASS, "e"))
    assert [label for label, _ in turns] == [".L_x_12"]
    assert [sass_loop.opcode(t) for t in turns[0][1]] == ["LDG", "BRA", "FMUL", "FRND", "STG", "BRA"]
    # with the hash on the branch's target instead, the walk falls through
    swapped = _ENCODE_SASS.replace("IMAD R6, R6, 0x7feb352d, RZ", "IMAD R6, R6, 0x3, RZ").replace(
        "FRND R4, R4", "IMAD R4, R4, -0x7b935975, RZ")
    turns = sass_loop.encode_turns(sass_loop.kernel_lines(swapped, "e"))
    assert [sass_loop.opcode(t) for t in turns[0][1]] == ["LDG", "BRA", "IMAD", "FADD", "BRA", "STG", "BRA"]
