"""The simt backend (ccoll/simt.py, kernels/simt/): the real ``__global__`` kernels of kernels/*.cu, launched
with each codec's own cupy launch geometry (grid, block, arguments) on CPU fibers, give the same bytes as the
host build ("emulated") and the torch backend -- in forward and in reverse CTA / warp / lane order, with
buffers that end at a guard page and misaligned inputs. Negative controls (tests/unit/simt_faults.cu) show
the runtime catches what it claims to: bad shuffle masks, a lane exiting before a team shuffle, divergent
shuffles, a shuffle against a barrier, a misaligned 16-byte vector access, out-of-bounds writes."""
import itertools
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import ccoll
import ccoll.errors
from ccoll import simt
from ccoll.errors import KernelError
from ccoll.kernels import call as kernel_call
from ccoll.kernels.call import ROT_WORDS

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simt backend needs g++")

FAULTS = Path(__file__).with_name("simt_faults.cu")
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
QUANT = {"int8": "int8:block={b}", "int4": "int4:block={b}", "fp8e4m3": "fp8:format=e4m3,block={b}",
         "fp8e5m2": "fp8:format=e5m2,block={b}"}
BLOCKS = (8, 16, 24, 32, 64, 128, 256, 512, 1024, 2048, 4096)
ORDERS = ("forward", "reverse")
#: simt kernel launches per test, summed in the session summary line (tests/unit/test_simt.py::test_zz_counts)
CALLS: dict[str, int] = {}


def _values(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Gradient-like values with all-zero, subnormal, huge and a few non-finite blocks."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp(2 * torch.randn(n, generator=g))
    kind = torch.randint(0, 16, (n // 8 + 1,), generator=g).repeat_interleave(8)[:n]
    x = torch.where(kind == 0, torch.zeros(()), x)
    x = torch.where(kind == 1, x * 1e-41, x)
    x = torch.where(kind == 2, x.clamp(-1, 1) * 3e38, x)
    special = torch.rand(n, generator=g)
    x = torch.where(special < 0.001, torch.tensor(math.nan), x)
    x = torch.where(special > 0.999, torch.tensor(math.inf) * x.sign(), x)
    return x.to(dtype)


def _guarded_copy(t: torch.Tensor, misalign_elems: int = 0) -> torch.Tensor:
    """``t`` copied into a guarded buffer (its end against a PROT_NONE page), starting ``misalign_elems``
    elements past a 64-byte boundary."""
    g = simt.guarded_empty(t.numel() + misalign_elems, t.dtype)[misalign_elems:] if misalign_elems else \
        simt.guarded_empty(t.numel(), t.dtype)
    g.copy_(t.reshape(-1))
    return g.view(t.shape)


def _guarded_like(t: torch.Tensor, fill: int | float | None = None) -> torch.Tensor:
    g = simt.guarded_empty(t.numel(), t.dtype).view(t.shape)
    if fill is not None:
        g.fill_(fill)
    return g


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where NaN (which NaN bits a decode produces is not part of the torch backend's
    contract; simt vs emulated is compared bit for bit)."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a[~a.isnan()], b[~b.isnan()])


def _simt_rows(codec, op: str, *args, order: str, record: list) -> None:
    with kernel_call.cupy_on_simt(order=order, record=record):
        getattr(codec, f"_{op}_cupy")(*args)


def _check_codec(codec_spec: str, dtype: torch.dtype, rows: int, row_numel: int, feedback: bool, misalign: int,
                 salt: int, seed: int, record: list, numel: int | None = None) -> None:
    """encode_rows, decode_rows and decode_sum: simt (both orders, the codec's cupy launch geometry) ==
    emulated == torch, payloads, residuals and outputs byte for byte. ``numel``: the tensor's values (default:
    the last of several rows a third padding)."""
    em = ccoll.get_codec(codec_spec, backend="emulated")
    tc = ccoll.get_codec(codec_spec, backend="torch")
    if numel is None:
        numel = rows * row_numel - (row_numel // 3 if rows > 1 else 0)  # the last row partly padding
    x = _values(numel, dtype, seed)
    nbytes = em.encoded_nbytes(row_numel, dtype)
    fb0 = (torch.randn(rows * row_numel, generator=torch.Generator().manual_seed(seed + 1)) * 0.1) if feedback else None

    refs = {}
    for name, codec in (("emulated", em), ("torch", tc)):
        out = torch.full((rows, nbytes), 0x5A, dtype=torch.uint8)
        fb = None if fb0 is None else fb0.clone()
        codec.encode_rows(x, out, row_numel, feedback=fb, salt=salt)
        refs[name] = (out, fb)
    assert torch.equal(refs["emulated"][0], refs["torch"][0]), f"{codec_spec} {dtype}: emulated != torch payload"
    payloads, fb_ref = refs["emulated"]
    for order in ORDERS:
        src = _guarded_copy(x, misalign)
        out = _guarded_like(payloads, 0x5A)
        fb = None if fb0 is None else _guarded_copy(fb0)
        _simt_rows(em, "encode_rows", src, out, row_numel, fb, salt, order=order, record=record)
        assert torch.equal(out, payloads), f"{codec_spec} {dtype} {order}: simt payload differs"
        if fb is not None:
            assert torch.equal(fb.view(torch.int32), fb_ref.view(torch.int32)), f"{codec_spec} {order}: residuals"

    y_ref = torch.empty(numel, dtype=dtype)
    em.decode_rows(payloads, y_ref, row_numel)
    y_torch = torch.empty(numel, dtype=dtype)
    tc.decode_rows(payloads, y_torch, row_numel)
    assert _same_values(y_ref, y_torch)
    s_ref = em.decode_sum(payloads, row_numel, dtype)
    assert _same_values(s_ref, tc.decode_sum(payloads, row_numel, dtype))
    for order in ORDERS:
        y = _guarded_like(y_ref, 0)
        if misalign:  # a misaligned output pointer: the scalar store path
            y = simt.guarded_empty(numel + 1, dtype)[1:]
        _simt_rows(em, "decode_rows", _guarded_copy(payloads), y, row_numel, order=order, record=record)
        assert torch.equal(y.view(torch.uint8), y_ref.view(torch.uint8)), f"{codec_spec} {dtype} {order}: decode_rows"
        s = _guarded_like(s_ref, 0.0)
        _simt_rows(em, "decode_sum", _guarded_copy(payloads), row_numel, dtype, s, order=order, record=record)
        assert torch.equal(s.view(torch.int32), s_ref.view(torch.int32)), f"{codec_spec} {dtype} {order}: decode_sum"


def _quant_spec(fmt: str, block: int, rnd: str, rot: str, seed: int) -> str:
    spec = QUANT[fmt].format(b=block)
    if not fmt.startswith("fp8"):  # fp8 rounds to nearest only
        spec += f",round={rnd},seed={seed}"
    return spec + (f",rotate=hadamard,rotate_seed={seed % 5}" if rot != "none" else "")


def _quant_cases(fmt: str):
    """(spec, rows, row_numel, feedback, misalign elements) for one format: every rounding (fp8: nearest
    only) x rotation x feedback combination, blocks 8..4096 spread over them, 1, 3 and 5 rows, word-aligned
    rows (vector loads) and odd ones, aligned and misaligned inputs."""
    rounds = ("nearest",) if fmt.startswith("fp8") else ("nearest", "stochastic")
    combos = list(itertools.product(rounds, ("none", "hadamard"), (False, True)))
    cases = []
    for k, block in enumerate(BLOCKS):
        rnd, rot, fb = combos[k % len(combos)]
        if rot == "hadamard" and (block & (block - 1) or block > 1024):
            rot = "none"
        row_numel = 2 * block + (block // 2 if block <= 256 else 0) + (3 if k // 2 % 2 else 8)
        cases.append((_quant_spec(fmt, block, rnd, rot, 1000 + k), 1 + 2 * (k % 2 == 0), row_numel, fb, k % 3 == 1))
    for rnd, rot, fb in combos:  # every combination once more at the MX/default block sizes, 5 rows: decode_sum
        block = 32 if fmt.startswith("fp8") else 256  # takes rows in batches of 2 (int4: 4) and then the rest
        cases.append((_quant_spec(fmt, block, rnd, rot, 99), 5, 3 * block + 5, fb, rot == "none"))
    # rotate=hadamard at the largest block, with feedback: the most words per lane (8, int4 4)
    cases.append((_quant_spec(fmt, 1024, rounds[-1], "hadamard", 77), 1, 2 * 1024 + 3, True, False))
    return cases


@pytest.mark.parametrize("fmt", sorted(QUANT))
@pytest.mark.parametrize("dname", sorted(DTYPES))
def test_quant_kernels_match_emulated_and_torch(fmt, dname):
    record: list = []
    for i, (spec, rows, row_numel, fb, misalign) in enumerate(_quant_cases(fmt)):
        _check_codec(spec, DTYPES[dname], rows, row_numel, fb, int(misalign), salt=i * 7919, seed=i, record=record)
    ops = ("encode_rows", "decode_rows", "decode_sum")  # plain and every rotate=hadamard instantiation
    rot = ("",) + tuple(f"_rot_w{w}" for w in ROT_WORDS[fmt])
    assert {k for _, k, _, _ in record} == {f"ccoll_{fmt}_{op}{r}_{dname}" for op in ops for r in rot}
    CALLS[f"quant {fmt} {dname}"] = len(record)


ZFP = [("zfp:rate={r},dims={d}", r, d) for r, d in ((4, 1), (8, 1), (16, 1), (2.5, 1), (2, 2), (8, 2), (12, 2), (1, 2))]


@pytest.mark.parametrize("dname", ["f32", "bf16", "f16", "f64"])
def test_zfp_kernels_match_emulated_and_torch(dname):
    dtype = DTYPES.get(dname, torch.float64)
    record: list = []
    for i, (tmpl, rate, dims) in enumerate(ZFP):
        spec = tmpl.format(r=rate, d=dims)
        try:
            ccoll.get_codec(spec).encoded_nbytes(64, dtype)
        except ccoll.errors.CcollError:
            continue  # a rate below the dtype's minimum
        rows, row_numel = (3, 4 * 37 + (i % 4)) if i % 2 else (1, 256 + 16 * i + 3)
        em = ccoll.get_codec(spec, backend="emulated")
        if dtype == torch.float64:  # no feedback pass for fp64 (its residuals are fp64) in this matrix
            _check_codec_zfp64(em, rows, row_numel, i, record)
            continue
        _check_codec(spec, dtype, rows, row_numel, bool(i % 3 == 0), int(i % 2 == 1), salt=0, seed=100 + i,
                     record=record)
    CALLS[f"zfp {dname}"] = len(record)
    assert record


def _check_codec_zfp64(em, rows, row_numel, seed, record):
    numel = rows * row_numel - 1
    x = torch.randn(numel, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    nbytes = em.encoded_nbytes(row_numel, x.dtype)
    ref = em.encode_rows(x, torch.zeros(rows, nbytes, dtype=torch.uint8), row_numel)
    y_ref = em.decode_rows(ref, torch.empty(numel, dtype=x.dtype), row_numel)
    for order in ORDERS:
        out = _guarded_like(ref, 0)
        _simt_rows(em, "encode_rows", _guarded_copy(x), out, row_numel, None, 0, order=order, record=record)
        assert torch.equal(out, ref)
        y = _guarded_like(y_ref, 0)
        _simt_rows(em, "decode_rows", _guarded_copy(ref), y, row_numel, order=order, record=record)
        assert torch.equal(y.view(torch.uint8), y_ref.view(torch.uint8))


#: (rate, dims, row_numel, rows): maxbits 9..1024 (odd, even, multiples of 32), rows of 1, 31, 32, 33 and 97
#: blocks (a tile boundary inside, at and just past a row's end; a 64-bit row end one 32-bit word past the
#: last tile), 1..3 rows
ZFP_TILES = [(2.25, 1, 128, 3), (2.25, 1, 4 * 97 + 2, 2), (8, 1, 4 * 31 + 1, 3), (12.25, 1, 4 * 33, 2),
             (16, 1, 1, 3), (0.6, 2, 16 * 32, 3), (3.3, 2, 16 * 33 - 5, 2), (8, 2, 16 * 97, 1),
             (64, 2, 16 * 31 + 7, 2), (64, 1, 4 * 64, 1), (2.9, 1, 4 * 35, 2), (0.75, 2, 16 * 65, 2),
             (4, 1, 4 * 32 * 2 + 4, 5)]


@pytest.mark.parametrize("dname", ["f32", "bf16", "f16", "f64"])
def test_zfp_tile_encoder_equals_per_block_encoder_and_host(dname):
    """encode_tiles (one warp per 32 blocks, each output word stored once into an unzeroed buffer) and
    encode_rows (one thread per block, boundary words OR-ed into a zeroed buffer) on simt, forward and
    reverse thread order, with the codec's own launch geometry: the emulated backend's bytes (its host
    twin of encode_tiles is checked against zfpy in tests/unit/test_zfp*.py) and residuals, byte for byte;
    the tile kernel also with a 1-CTA grid (each of the 4 warps codes a run of consecutive tiles, across row ends,
    reusing its lane buffers; the last case's 15 tiles are runs of 4, 4, 4 and 3, another's 6 tiles runs of 2 and a
    warp with none)."""
    dtype = DTYPES.get(dname, torch.float64)
    record: list = []
    cases = 0
    for i, (rate, dims, row_numel, rows) in enumerate(ZFP_TILES):
        spec = f"zfp:rate={rate},dims={dims}"
        em = ccoll.get_codec(spec, backend="emulated")
        try:
            nbytes = em.encoded_nbytes(row_numel, dtype)
        except ccoll.errors.CcollError:
            continue  # below the dtype's minimum rate
        numel = rows * row_numel - (row_numel // 3 if rows > 1 else 0)
        x = _values(numel, dtype, 300 + i)
        for feedback in (False, True):
            fb0 = None
            if feedback:
                fb0 = (torch.randn(rows * row_numel, generator=torch.Generator().manual_seed(i)) * 0.1).to(
                    em.feedback_dtype(dtype))
            ref = torch.full((rows, nbytes), 0x5A, dtype=torch.uint8)
            fb_ref = None if fb0 is None else fb0.clone()
            em.encode_rows(x, ref, row_numel, feedback=fb_ref)
            for op, order in itertools.product(("encode_tiles", "encode_rows"), ORDERS):
                out = _guarded_like(ref, 0xA5)  # garbage: encode_tiles must write every byte
                fb = None if fb0 is None else _guarded_copy(fb0)
                with kernel_call.cupy_on_simt(order=order, record=record):
                    em._encode_rows_kernel("cupy", _guarded_copy(x, i % 2), out, row_numel, fb, op=op)
                assert torch.equal(out, ref), f"{spec} {dname} rows={rows} row_numel={row_numel} {op} {order}"
                if fb is not None:
                    assert torch.equal(fb.view(torch.uint8), fb_ref.view(torch.uint8)), f"{spec} {op} {order}"
                cases += 1
        # one CTA of 4 warps for every tile: runs of tiles per warp and the buffer reuse between tiles
        out, src = _guarded_like(ref, 0xA5), _guarded_copy(x)
        simt.launch("zfp", f"ccoll_zfp_encode_tiles_{dname}", 1, 128,
                    (src, np.uint64(numel), np.uint64(row_numel), np.int32(rows),
                     np.int32(dims), np.int32(em.maxbits(dtype)), np.uint64(nbytes // 8), None, out),
                    order="reverse")
        em.encode_rows(x, ref, row_numel)
        assert torch.equal(out, ref), f"{spec} {dname} one CTA"
        cases += 1
    assert {k for _, k, _, _ in record} == {f"ccoll_zfp_encode_{op}_{dname}" for op in ("tiles", "rows")}
    CALLS[f"zfp tiles {dname}"] = cases


def test_zfp_tile_launch_gives_the_runs_the_kernel_codes():
    """The tile encoder's launch (ccoll/codecs/zfp.py tiles_per_warp): one tile per warp below
    2 * TILE_RUN_MIN_WARPS tiles, runs of 2, 4, ... up to TILES_PER_WARP_MAX above; and the run the kernel derives
    from that grid (kernels/zfp.cu tiles_per_warp_log2: the smallest power of two K with warps * K >= tiles, warps
    rounded up to whole CTAs of 4) is the one the launch meant, which is what tools/sass_estimate.py reports."""
    from ccoll.codecs import zfp as zfp_codec

    lo, top = zfp_codec.TILE_RUN_MIN_WARPS, zfp_codec.TILES_PER_WARP_MAX
    assert [zfp_codec.tiles_per_warp(n) for n in (1, 2 * lo - 1, 2 * lo, 4 * lo - 1, 4 * lo, 10**9)] == [
        1, 1, 2, 2, 4, top]
    for tiles in (1, 5, 2 * lo - 1, 2 * lo, 2 * lo + 3, 4 * lo + 7, 8 * lo, 8 * lo + 1, 10**7 + 13):
        k = zfp_codec.tiles_per_warp(tiles)
        warps = 4 * -(-(32 * -(-tiles // k)) // 128)
        derived = 1
        while warps * derived < tiles:
            derived *= 2
        assert derived == k, tiles


def test_zfp_tiles_negative_control_a_missing_syncwarp_between_the_phases(tmp_path):
    """encode_tiles without the __syncwarp between coding (phase 1) and assembling (phase 2): lanes assemble
    words from lane buffers other lanes have not written yet, and the comparison with the emulated bytes fails
    in both thread orders. At 64 bits per block (rate 16) lane l stores words l and l + 32, of blocks l / 2
    and 16 + l / 2: one is coded by a lane that runs later in forward order, the other in reverse. At 21 bits
    (rate 5.3) lane l's word needs blocks >= l only, so reverse order hides it there -- which is why every
    simt comparison runs both orders and the matrices hold rates above and below 32 bits per block. Each launch
    codes other values (the lane buffers are shared memory, which simt does not re-poison between launches: a
    buffer left by the previous launch of the same values would hide the missing barrier). The real kernel on
    the same launches passes in both."""
    from ccoll import kernels

    text = kernels.source("zfp").read_text()
    sync = "    __syncwarp();\n    assemble_tile_lane("
    assert text.count(sync) == 1
    bad = tmp_path / "zfp_nosync.cu"
    # its own kernel names, so the launches below say which library they mean
    bad.write_text(text.replace(sync, "    assemble_tile_lane(").replace("ccoll_zfp", "nosync_zfp"))
    n = 4 * 32 * 3 + 5
    equal = {}
    for rate, maxbits in ((5.3, 21), (16, 64)):
        em = ccoll.get_codec(f"zfp:rate={rate}", backend="emulated")
        assert em.maxbits(torch.float32) == maxbits
        nbytes = em.encoded_nbytes(n, torch.float32)
        for seed, (module, order) in enumerate(itertools.product((bad, "zfp"), ORDERS)):
            x = _values(n, torch.float32, 11 + seed + 10 * maxbits)
            ref = em.encode_rows(x, torch.empty(1, nbytes, dtype=torch.uint8), n)
            out = _guarded_like(ref, 0xA5)
            simt.launch(module, f"{'nosync' if module is bad else 'ccoll'}_zfp_encode_tiles_f32", 1, 128,
                        (_guarded_copy(x), np.uint64(n), np.uint64(n), np.int32(1), np.int32(1), np.int32(maxbits),
                         np.uint64(nbytes // 8), None, out), order=order)
            equal[maxbits, module == "zfp", order] = torch.equal(out, ref)
    assert equal == {(21, False, "forward"): False, (21, False, "reverse"): True, (64, False, "forward"): False,
                     (64, False, "reverse"): False, **{(b, True, o): True for b in (21, 64) for o in ORDERS}}, equal


@pytest.mark.parametrize("dname", sorted(DTYPES))
def test_lossless_kernels_match_emulated_and_torch(dname):
    record: list = []
    for i, block in enumerate((32, 256, 1024)):
        _check_codec(f"lossless:block={block}", DTYPES[dname], 1 + 2 * (i % 2), 3 * block + 7 * i + 1, i == 1,
                     int(i == 2), salt=0, seed=200 + i, record=record)
    CALLS[f"lossless {dname}"] = len(record)
    assert record


# --------------------------------------------------------------------------------------------------------------
# sizes at the kernels' own indexing bounds: every unit a kernel indexes by (a block, a team's or a thread's
# values, a tile, a CTA's values) -- taken from the launch table (ccoll/kernels/call.py: threads per CTA), the
# codec's own launch geometry and the kernel source's constants, never hand-picked -- at u - 1, u and u + 1
# values in one row, and a tensor that ends u - 1, u, u + 1 values into its last row (a partial last row whose
# end sits at, before and one past a unit: the "whole tile" and "partial tile" bounds).


def _source_constant(name: str, pattern: str) -> int:
    """An integer constant of kernels/<name>.cu (``pattern``'s group 1): the sizes follow the source."""
    m = re.search(pattern, ccoll.kernels.source(name).read_text(), flags=re.MULTILINE)
    assert m, f"kernels/{name}.cu: no match for {pattern!r}"
    return int(m.group(1))


def _around(units) -> list[int]:
    """u - 1, u and u + 1 for every unit u (>= 1), ascending, without repeats."""
    return sorted({n for u in units for n in (u - 1, u, u + 1) if n >= 1})


def _quant_units(codec, dtype: torch.dtype) -> dict[str, int]:
    """The quant kernels' indexing units in values: a block (one scale); plain kernels: an encode CTA
    (threads / team blocks, the team from the codec's own _encode_team), a decode thread's q group
    (CQ_GROUP_WORDS words; decode_sum's own group) and a decode CTA's groups; rotate=hadamard: a CTA of
    teams (one team per block)."""
    B = codec.block
    if codec.rotate:
        threads = kernel_call.kernel("quant", codec.kernel_format, codec._op("encode_rows"), dtype).threads
        return {"block": B, "CTA of teams": threads // codec._team() * B}
    assert codec.GROUP_WORDS == _source_constant("quant", r"^#define CQ_GROUP_WORDS (\d+)")
    threads = {op: kernel_call.kernel("quant", codec.kernel_format, op, dtype).threads
               for op in ("encode_rows", "decode_rows", "decode_sum")}
    group, sum_group = codec.GROUP_WORDS * 32 // codec.bits, codec._sum_group_words * 32 // codec.bits
    return {"block": B, "encode CTA": threads["encode_rows"] // codec._encode_team(dtype) * B,
            "decode_rows group": group, "decode_sum group": sum_group,
            "decode_rows CTA": threads["decode_rows"] * group, "decode_sum CTA": threads["decode_sum"] * sum_group}


def _zfp_units(codec, dtype: torch.dtype) -> dict[str, int]:
    """zfp's units in values: a block (4^dims), a tile (TILE blocks: one warp of encode_tiles), the tile
    encoder's CTA (its warps' tiles) and the per-block kernels' CTA (a block per thread)."""
    S = 4 ** codec.dims
    tile = _source_constant("zfp", r"^const int TILE = (\d+);") * S
    tiles = kernel_call.kernel("zfp", "zfp", "encode_tiles", dtype).threads // 32
    return {"block": S, "tile": tile, "tile CTA": tiles * tile,
            "block CTA": kernel_call.kernel("zfp", "zfp", "decode_rows", dtype).threads * S}


def _lossless_units(codec, dtype: torch.dtype) -> dict[str, int]:
    """lossless: a block (one exponent base), a thread's group of 32 values, a CTA's groups."""
    group = 32  # kernels/lossless.cu: one thread per (row, group of 32 values); the codec launches ceil(n / 32)
    assert "groups = (row_numel + 31) / 32" in ccoll.kernels.source("lossless").read_text()
    return {"block": codec.block, "group": group,
            "CTA": kernel_call.kernel("lossless", "lossless", "pack", dtype).threads * group}


def _bound_cases(units: dict[str, int]) -> list[tuple[int, int, int]]:
    """(rows, row_numel, numel): one row of u - 1, u, u + 1 values per unit; and two rows of 2 u values of which
    the tensor fills u - 1, u, u + 1 of the second (its end before, at and one past a unit inside a row whose
    whole units reach past it)."""
    cases = [(1, n, n) for n in _around(units.values())]
    cases += [(2, 2 * u, 2 * u + k) for u in sorted(set(units.values())) for k in (u - 1, u, u + 1) if k >= 1]
    return cases


#: (spec, dtype) of the boundary matrix: one of each geometry -- 8-bit and 4-bit q words, a word of 16 and of 8
#: input bytes (f32 / 16-bit: the encode's team), small and default blocks, rotate=hadamard; zfp dims 1 and 2
#: in every storage width; lossless in 32- and 16-bit
BOUND_SPECS = [("int8:block=64", "f32"), ("int8:block=64,round=stochastic,seed=3", "bf16"),
               ("int4:block=256", "f32"), ("fp8:format=e4m3,block=32", "f16"),
               ("int8:block=256,rotate=hadamard,rotate_seed=2", "bf16"),
               ("zfp:rate=5.3,dims=1", "f32"), ("zfp:rate=16,dims=1", "bf16"), ("zfp:rate=8,dims=2", "f32"),
               ("zfp:rate=12,dims=1", "f64"), ("lossless:block=64", "f32"), ("lossless:block=64", "bf16")]
BOUND_SIZES: dict[str, list] = {}


@pytest.mark.parametrize("spec, dname", BOUND_SPECS)
def test_kernels_at_their_indexing_bounds(spec, dname):
    """Every kernel the codec launches at the sizes of its own indexing bounds (``_bound_cases`` of the units
    above), simt both orders == emulated (== torch), with buffers against guard pages: an index one past a
    bound reads or writes outside the tensor (a fault, a canary, or bytes that differ). The zfp encoders run
    both ops (tiles and per-block); the tile encoder's whole-tile test (no range checks) meets a tensor
    ending one value short of, at, and one past a tile."""
    dtype = DTYPES.get(dname, torch.float64)
    em = ccoll.get_codec(spec, backend="emulated")
    family = spec.split(":")[0]
    units = {"zfp": _zfp_units, "lossless": _lossless_units}.get(family, _quant_units)(em, dtype)
    cases = _bound_cases(units)
    BOUND_SIZES[f"{spec} {dname}"] = cases
    record: list = []
    for i, (rows, row_numel, numel) in enumerate(cases):
        if dtype == torch.float64:
            _check_zfp_bound(em, rows, row_numel, numel, i, record, both_encoders=True)
            continue
        _check_codec(spec, dtype, rows, row_numel, False, 0, salt=i, seed=500 + i, record=record, numel=numel)
        if family == "zfp":
            _check_zfp_bound(em, rows, row_numel, numel, i, record, both_encoders=False, dtype=dtype)
    CALLS[f"bounds {spec} {dname}"] = len(record)


def _check_zfp_bound(em, rows, row_numel, numel, seed, record, both_encoders, dtype=torch.float64):
    """zfp's encoders at one size: encode_rows (the per-block kernel; and encode_tiles when
    ``both_encoders``), both orders, into 0xA5-filled guarded output == the emulated bytes; fp64 decodes too."""
    x = _values(numel, dtype, 700 + seed) if dtype != torch.float64 else \
        torch.randn(numel, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    ref = em.encode_rows(x, torch.zeros(rows, em.encoded_nbytes(row_numel, dtype), dtype=torch.uint8), row_numel)
    ops = ("encode_tiles", "encode_rows") if both_encoders else ("encode_rows",)
    for op, order in itertools.product(ops, ORDERS):
        out = _guarded_like(ref, 0xA5)
        with kernel_call.cupy_on_simt(order=order, record=record):
            em._encode_rows_kernel("cupy", _guarded_copy(x), out, row_numel, None, op=op)
        assert torch.equal(out, ref), f"{em} {dtype} rows={rows} row_numel={row_numel} numel={numel} {op} {order}"
    if both_encoders:
        y_ref = em.decode_rows(ref, torch.empty(numel, dtype=dtype), row_numel)
        for order in ORDERS:
            y = _guarded_like(y_ref, 0)
            _simt_rows(em, "decode_rows", _guarded_copy(ref), y, row_numel, order=order, record=record)
            assert torch.equal(y.view(torch.uint8), y_ref.view(torch.uint8)), f"{em} f64 {numel} {order}"


def test_huge_grid_top_ctas_past_2_pow_32():
    """int8 stochastic encode and decode of 2^32 + 8192 f32 values (16 GiB virtual in, 6 GiB out, MAP_NORESERVE):
    only the CTAs whose grid-stride loop reaches the top blocks run; the top blocks' scales and q bytes
    equal the torch backend's encode of that slice at stochastic index 2^32, and their decode the decode of
    that payload (64-bit index and offset arithmetic). Block 8 (teams of 2 lanes, 16 blocks per warp): the
    smallest block, so that 2^32 values are more units than one grid stride holds."""
    top, tail, block = 1 << 32, 8192, 8
    numel = top + tail
    codec = ccoll.get_codec(f"int8:block={block},round=stochastic,seed=5", backend="emulated")
    nbytes = codec.encoded_nbytes(numel, torch.float32)
    try:
        src = simt.guarded_empty(numel, torch.float32, noreserve=True)
        out = simt.guarded_empty(nbytes, torch.uint8, noreserve=True).view(1, nbytes)
    except KernelError as e:
        pytest.skip(f"no 20 GiB of address space: {e}")
    x = _values(tail, torch.float32, 9)
    src[top:].copy_(x)
    record: list = []
    # the grid is the codec's cap, 2^20 CTAs of 256 threads = 2^23 warps; a team of 2 lanes per block, 16
    # blocks per warp: 2^27 units per stride, so the top units (>= 2^29) belong to warps 0..63 = CTAs 0..7
    # on their fifth iteration
    team = codec._encode_team(torch.float32)
    assert team == 2
    units_per_stride = (1 << 23) * (32 // team)
    first_warp = (top // block) % units_per_stride // (32 // team)
    last_warp = (numel // block - 1) % units_per_stride // (32 // team)
    with kernel_call.cupy_on_simt(ctas=(first_warp // 8, last_warp // 8 + 1), record=record):
        codec._encode_rows_cupy(src, out, numel, None, 0)
    assert record[0][2] == 1 << 20 and (first_warp, last_warp) == (0, 63)
    ref = codec._encode_row_at(x, top)
    nb = tail // block
    sbytes = codec.encoded_nbytes(numel, torch.float32) - numel  # scale section (numel % 16 == 0)
    assert torch.equal(out[0, 4 * (top // block): 4 * (top // block + nb)], ref[: 4 * nb])
    ref_sbytes = ref.numel() - tail
    assert torch.equal(out[0, sbytes + top: sbytes + top + tail], ref[ref_sbytes:])
    # decode_rows: one thread per 16-byte q group (16 values), 2^28 threads per grid stride: groups >= 2^28
    # (values >= 2^32) are threads 0..511 (CTAs 0..1) on their second iteration
    y = simt.guarded_empty(numel, torch.float32, noreserve=True)
    with kernel_call.cupy_on_simt(ctas=(0, 2), record=record):
        codec._decode_rows_cupy(out, y, numel)
    assert torch.equal(y[top:].view(torch.int32), codec.decode(ref, tail, torch.float32).view(torch.int32))



@pytest.mark.parametrize("spec", ["int8:block=24", "int4:block=64", "fp8:format=e4m3,block=32"])
def test_quant_decodes_read_a_payload_that_is_not_16_byte_aligned(spec):
    """The plain decodes load each 16-byte q group with one vector load only from a 16-byte-aligned payload
    (what the codecs pass: ccoll.codecs.buffers.aligned); from one that is only 4-byte aligned, launched
    directly, they load words -- simt traps a misaligned vector load -- and give the emulated bytes."""
    em = ccoll.get_codec(spec, backend="emulated")
    n, rows = 24 * 13 + 8, 2
    x = _values(rows * n, torch.float32, 21)
    payloads = em.encode_rows(x, torch.empty(rows, em.encoded_nbytes(n, torch.float32), dtype=torch.uint8), n)
    src = simt.guarded_empty(payloads.numel() + 4, torch.uint8)[4:]
    src.copy_(payloads.reshape(-1))
    assert src.data_ptr() % 16 == 4
    cpu = torch.device("cpu")
    y_ref = em.decode_rows(payloads, torch.empty(rows * n), n)
    s_ref = em.decode_sum(payloads, n, torch.float32)
    for order in ORDERS:
        y = _guarded_like(y_ref, 0.0)
        with kernel_call.cupy_on_simt(order=order):
            kernel_call.call("cupy", "quant", em.kernel_format, "decode_rows", torch.float32, cpu,
                             rows * em._groups(n), src, rows, n, rows * n, em.block, y)
        assert torch.equal(y.view(torch.int32), y_ref.view(torch.int32)), f"{spec} {order}: decode_rows"
        s = _guarded_like(s_ref, 0.0)
        with kernel_call.cupy_on_simt(order=order):
            kernel_call.call("cupy", "quant", em.kernel_format, "decode_sum", torch.float32, cpu, em._groups(n),
                             src, rows, payloads.shape[1], n, em.block, s)
        assert torch.equal(s.view(torch.int32), s_ref.view(torch.int32)), f"{spec} {order}: decode_sum"


def test_two_libraries_with_the_same_kernel_names_run_their_own_code(tmp_path):
    """Two simt builds in one process whose C++ symbols coincide (a modified copy of a kernel source keeps
    its kernel names): each launch runs its own library's kernel and its own ``__shared__`` variable. g++
    emits a template's static members and an inline function's statics (simt's kernel descriptors,
    ``__shared__``) as STB_GNU_UNIQUE, which the dynamic linker binds process-wide to the first library
    loaded, whatever RTLD_LOCAL says; simt builds with -fno-gnu-unique so they stay per library."""
    src = ("__device__ __forceinline__ int twin_value() { __shared__ int v; if (threadIdx.x == 0) v = VALUE; "
           "__syncthreads(); return v; }\n"
           "extern \"C\" __global__ void simt_twin_fill(int* out) { out[threadIdx.x] = twin_value(); }\n")
    outs = []
    for value in (11, 22):
        path = tmp_path / f"twin_{value}.cu"
        path.write_text(src.replace("VALUE", str(value)))
        out = _guarded_like(torch.zeros(32, dtype=torch.int32))
        simt.launch(path, "simt_twin_fill", 1, 32, (out,))
        outs.append(out)
    assert outs[0].tolist() == [11] * 32 and outs[1].tolist() == [22] * 32

_CONV_SRC = r"""#include "common.cuh"
extern "C" __global__ void simt_f16_conversions(const unsigned short* h, unsigned int* wide, unsigned int* wide_int,
                                                long long nh, const unsigned int* x, unsigned short* narrow,
                                                unsigned short* narrow_int, long long nx) {
  for (long long i = threadIdx.x; i < nh; i += blockDim.x) {
    wide[i] = ccoll_conv::f16_to_f32(h[i]);
    wide_int[i] = ccoll_conv::f16_to_f32_int(h[i]);
  }
  for (long long i = threadIdx.x; i < nx; i += blockDim.x) {
    narrow[i] = ccoll_conv::f32_to_f16(x[i]);
    narrow_int[i] = ccoll_conv::f32_to_f16_int(x[i]);
  }
}
"""


def test_fp16_conversion_instructions_give_the_integer_codes_bits_on_every_half_and_every_rounding_case(tmp_path):
    """kernels/common.cuh's GPU fp16 <-> fp32 conversions (one IEEE instruction + a NaN select; the simt build
    runs g++'s _Float16 conversions in the instruction's place, IEEE too) against its integer code (the host
    build's) and torch's casts: every half; for fp32 -> fp16 every half's image, every midpoint between
    two neighbouring halves (the ties, normal and subnormal) and their neighbour floats, the overflow
    boundary, NaNs with payloads, fp32 subnormals and 2^20 random bit patterns."""
    halves = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16)
    images = halves.view(torch.float16).float()  # exact
    finite = images[torch.isfinite(images) & (images >= 0)].unique()  # ascending, +0 .. 65504
    mids = torch.cat([(finite[:-1] + finite[1:]) / 2, torch.tensor([65520.0])])  # exact in fp32; 65520 -> Inf
    base = torch.cat([images, mids, -mids]).view(torch.int32)
    g = torch.Generator().manual_seed(7)
    rand = torch.randint(-(1 << 31), (1 << 31) - 1, (1 << 20,), generator=g, dtype=torch.int64).to(torch.int32)
    special = torch.tensor([0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0xFF8FE000 - (1 << 32), 0x00000001, 0x007FFFFF,
                            0x80000001 - (1 << 32), 0x7F7FFFFF, 0x477FEFFF, 0x477FF000], dtype=torch.int64).to(torch.int32)
    x = torch.cat([base - 1, base, base + 1, rand, special])
    path = tmp_path / "f16_conversions.cu"
    path.write_text(_CONV_SRC)
    wide, wide_int = (_guarded_like(torch.empty(1 << 16, dtype=torch.int32)) for _ in range(2))
    narrow, narrow_int = (_guarded_like(torch.empty(x.numel(), dtype=torch.int16)) for _ in range(2))
    simt.launch(path, "simt_f16_conversions", 1, 32,
                (halves, wide, wide_int, np.int64(1 << 16), x, narrow, narrow_int, np.int64(x.numel())))
    assert torch.equal(wide, wide_int)
    assert torch.equal(narrow, narrow_int)
    # and both are torch's casts (NaN: torch's CPU cast keeps the payload as the header says)
    assert torch.equal(wide.view(torch.float32), images) or _same_values(wide.view(torch.float32), images)
    ref = x.view(torch.float32).to(torch.float16).view(torch.int16)
    nan = torch.isnan(x.view(torch.float32))
    assert torch.equal(narrow[~nan], ref[~nan])
    ties = (mids.view(torch.int32) & 0x1FFF) == 0x1000  # normal-range ties: the rounding case that tests even
    assert ties.sum() > 10000


_SPLIT_SRC = r"""#include "common.cuh"
// per (binade, thread): how many of the binade's 2^23 floats the split rounds to other bits than the integer code
extern "C" __global__ void simt_bf16_split(const unsigned int* starts, unsigned int* mismatches) {
  const unsigned int start = starts[blockIdx.x];
  unsigned int bad = 0;
  for (unsigned int i = threadIdx.x; i < (1u << 23); i += blockDim.x) {
    const unsigned int u = start + i;
    float f, r;
    __builtin_memcpy(&f, &u, 4);
    r = ccoll_conv::f32_round_bf16_normal(f);
    unsigned int got;
    __builtin_memcpy(&got, &r, 4);
    bad += got != ccoll_conv::bf16_to_f32(ccoll_conv::f32_to_bf16(u));
  }
  mismatches[blockIdx.x * blockDim.x + threadIdx.x] = bad;
}
"""


def test_bf16_split_rounds_like_the_integer_code_on_every_float_of_its_range(tmp_path):
    """kernels/common.cuh's f32_round_bf16_normal (Veltkamp's split: three fp32 operations; the bf16 decodes'
    rounding where CqInt::decodes_normal holds) against the integer round-to-nearest-even code, on every float
    of the binades [2^-126, 2^-125), [1, 2) and [2^110, 2^111), both signs. No operation of the split
    underflows or overflows for a normal |x| < 2^111, so every binade between is an exact power-of-two scaling
    of [1, 2): this is the whole range. Negative controls: the subnormals and [2^111, 2^112) (65537 x
    overflows near 2^112), where the split is wrong, do differ, so the range the decodes test is needed."""
    inside = [0x00800000, 0x3F800000, 0x76800000]
    outside = [0x00000000, 0x77000000]
    starts = inside + [u | 0x80000000 for u in inside] + outside
    threads = 32
    mismatches = _guarded_like(torch.zeros(len(starts) * threads, dtype=torch.int32))
    path = tmp_path / "bf16_split.cu"
    path.write_text(_SPLIT_SRC)
    simt.launch(path, "simt_bf16_split", len(starts), threads,
                (torch.tensor(starts, dtype=torch.int64).to(torch.int32), mismatches))
    per_binade = mismatches.view(len(starts), threads).sum(1).tolist()
    assert per_binade[:6] == [0] * 6
    assert per_binade[6] > 1000 and per_binade[7] > 0, per_binade


_DIVISION_KERNELS = r"""
// per (binade, thread): how many of the binade's 2^23 floats f give other bits than IEEE division: what = 0
// cq_recip_normal(f) against 1 / f; 1, 2: CqInt<8> / CqInt<4>::div_qmax(f) against f / qmax; 3: f * fl(1 / 127)
// (div_qmax without its correction step) against f / 127
extern "C" __global__ void simt_division(const unsigned int* starts, int what, unsigned int* mismatches) {
  const unsigned int start = starts[blockIdx.x];
  unsigned int bad = 0;
  for (unsigned int i = threadIdx.x; i < (1u << 23); i += blockDim.x) {
    const float f = cq_u2f(start + i);
    float got, want;
    if (what == 0) { got = cq_recip_normal(f); want = cq_div(1.0f, f); }
    else if (what == 1) { got = CqInt8::div_qmax(f); want = cq_div(f, 127.0f); }
    else if (what == 2) { got = CqInt4::div_qmax(f); want = cq_div(f, 7.0f); }
    else { got = cq_mul(f, 1.0f / 127.0f); want = cq_div(f, 127.0f); }
    bad += cq_f2u(got) != cq_f2u(want);
  }
  mismatches[blockIdx.x * blockDim.x + threadIdx.x] = bad;
}
"""


def _division_mismatches(tmp_path, what: int, starts: list[int]) -> list[int]:
    """Mismatches per binade of ``simt_division`` (kernels/quant.cu's helpers, no kernels of its own: the
    source is quant.cu's text, so the simt build is keyed by it)."""
    quant = Path(ccoll.kernels.KERNEL_DIR / "quant.cu").read_text()
    path = tmp_path / "division.cu"
    path.write_text("#define CCOLL_QUANT_KERNELS 0\n" + quant + _DIVISION_KERNELS)
    threads = 32
    mismatches = _guarded_like(torch.zeros(len(starts) * threads, dtype=torch.int32))
    simt.launch(path, "simt_division", len(starts), threads,
                (torch.tensor(starts, dtype=torch.int64).to(torch.int32), np.int32(what), mismatches))
    return mismatches.view(len(starts), threads).sum(1).tolist()


def test_int_scale_reciprocal_is_correctly_rounded_on_every_float_of_its_range(tmp_path):
    """cq_recip_normal (the int codecs' one reciprocal per block, 1 / scale, that the encode multiplies every
    value by) equals IEEE division on every float of [2^-126, 2^-125), [1, 2) and [2^125, 2^126): no
    operation of it underflows or overflows for s in [2^-126, 2^126) and its first guess subtracts the
    exponent, so every binade between is an exact power-of-two scaling of [1, 2). Negative control:
    [2^126, 2^127), outside the range (1 / s subnormal), differs -- the range the codec keeps scales in
    (tiny blocks take 2^-126; ccoll/codecs/quant.py) is needed."""
    per_binade = _division_mismatches(tmp_path, 0, [0x00800000, 0x3F800000, 0x7E000000, 0x7E800000])
    assert per_binade[:3] == [0, 0, 0]
    assert per_binade[3] > 1000, per_binade


@pytest.mark.parametrize("what, qmax", [(1, 127), (2, 7)])
def test_int_scale_absmax_over_qmax_is_correctly_rounded(tmp_path, what, qmax):
    """CqInt::div_qmax (scale = absmax / qmax without div.rn) equals IEEE division on every subnormal and every
    float of [2^-126, 2^-125), [1, 2) and [2^127, 2^128) (exhaustively over all finite floats when written:
    see its comment). Negative control: the product without the correction step, a * fl(1 / 127), differs on
    [1, 2) -- so the step is what makes it exact."""
    starts = [0x00000000, 0x00800000, 0x3F800000, 0x7F000000]
    assert _division_mismatches(tmp_path, what, starts) == [0, 0, 0, 0], qmax
    if what == 1:
        assert _division_mismatches(tmp_path, 3, [0x3F800000])[0] > 1000


# --------------------------------------------------------------------------------------------------------------
# negative controls: small kernels doing what the GPU leaves undefined; simt must stop with a clear error

def _faults(kernel, grid, block, *args):
    simt.launch(FAULTS, kernel, grid, block, args)


def test_shuffle_team_sum_positive_control():
    inp = torch.arange(96, dtype=torch.int32)
    for order in ORDERS:
        out = torch.zeros(96, dtype=torch.int32)
        simt.launch(FAULTS, "simt_team_sum", 1, 96, (inp, out, np.uint32(0xFFFFFFFF), np.int32(8), np.int32(96)),
                    order=order)
        assert torch.equal(out, inp.view(-1, 8).sum(1, dtype=torch.int32).repeat_interleave(8))


def test_warp_ops_semantics():
    out = torch.zeros(5 * 64, dtype=torch.int32)
    _faults("simt_warp_ops", 1, 64, out, np.int32(8))
    lane = torch.arange(64) % 32
    seg = lane // 8 * 8
    o = out.view(64, 5)
    assert torch.equal(o[:, 0], 100 + seg + 3)
    assert torch.equal(o[:, 1], torch.where(lane - seg >= 2, 100 + lane - 2, 100 + lane))
    assert torch.equal(o[:, 2], torch.where(lane - seg + 2 < 8, 100 + lane + 2, 100 + lane))
    assert (o[:, 3] == sum(1 << i for i in range(0, 32, 3))).all() and (o[:, 4] == 3).all()


def test_syncthreads_and_shared_memory_positive_control():
    a = torch.arange(512, dtype=torch.int32)
    for order in ORDERS:
        out = torch.zeros(512, dtype=torch.int32)
        simt.launch(FAULTS, "simt_block_reverse", 2, 256, (a, out, np.int32(-1)), order=order)
        assert torch.equal(out, a.view(2, 256).flip(1).reshape(-1))


def test_catches_a_partial_warp_shuffle_mask():
    inp, out = torch.arange(64, dtype=torch.int32), torch.zeros(64, dtype=torch.int32)
    with pytest.raises(KernelError, match="mask 0x0000ffff, which does not contain the calling lane 16"):
        _faults("simt_team_sum", 1, 64, inp, out, np.uint32(0xFFFF), np.int32(8), np.int32(64))


def test_catches_a_mask_naming_lanes_of_a_partial_warp_that_do_not_exist():
    inp, out = torch.arange(64, dtype=torch.int32), torch.zeros(64, dtype=torch.int32)
    with pytest.raises(KernelError, match="names lane 16, which does not exist"):
        _faults("simt_team_sum", 1, 48, inp, out, np.uint32(0xFFFFFFFF), np.int32(8), np.int32(64))


def test_catches_a_lane_exiting_before_a_team_shuffle():
    with pytest.raises(KernelError, match="lane 5 of the mask has exited"):
        _faults("simt_exit_before_shuffle", 1, 32, torch.zeros(32, dtype=torch.int32), np.int32(5))


def test_catches_lanes_in_different_shuffles():
    with pytest.raises(KernelError, match=r"lane 16 of the mask is in __shfl_xor_sync.*simt_faults.cu:25"):
        _faults("simt_divergent_shuffle", 1, 32, torch.zeros(32, dtype=torch.int32))


def test_catches_a_shuffle_against_a_barrier():
    a = torch.arange(256, dtype=torch.int32)
    with pytest.raises(KernelError, match="waits in __syncthreads"):
        _faults("simt_block_reverse", 1, 256, a, torch.zeros(256, dtype=torch.int32), np.int32(37))


def test_catches_a_misaligned_16_byte_vector_load():
    src, out = simt.guarded_empty(1024, torch.float32), torch.zeros(1024)
    _faults("simt_vector_copy", 1, 32, src, out, np.int32(0))  # aligned: fine
    with pytest.raises(KernelError, match="misaligned access"):
        _faults("simt_vector_copy", 1, 32, src, out, np.int32(1))


def test_catches_an_out_of_bounds_write_at_the_guard_page():
    out = simt.guarded_empty(1024, torch.float32)  # 4096 bytes: the end is the guard page itself
    _faults("simt_fill", 4, 256, out, np.int64(1024), np.int32(0))
    assert torch.equal(out, torch.arange(1024, dtype=torch.float32))
    with pytest.raises(KernelError, match=r"CTA \(4,0,0\) thread \(0,0,0\).*SIGSEGV: invalid access"):
        _faults("simt_fill", 5, 256, out, np.int64(1024), np.int32(1))  # thread 1024 writes out[1024]


def test_catches_an_out_of_bounds_write_into_the_canary_gap():
    out = simt.guarded_empty(999, torch.float32, misalign=4)  # 3996 bytes: canary bytes before the guard page
    with pytest.raises(KernelError, match="out-of-bounds write at byte 0 past the end of the 3996-byte buffer"):
        _faults("simt_fill", 4, 256, out, np.int64(999), np.int32(1))


def test_checks_argument_types_against_the_kernel_signature():
    out = simt.guarded_empty(1024, torch.float32)
    with pytest.raises(KernelError, match="argument 1: a int32 given for a 8-byte 'i' parameter"):
        _faults("simt_fill", 1, 32, out, np.int32(1024), np.int32(0))
    with pytest.raises(KernelError, match="takes 3 arguments, got 2"):
        _faults("simt_fill", 1, 32, out, np.int64(1024))


@pytest.mark.parametrize("spec", ["int8:block=64,round=stochastic,seed=3", "int4:block=32,rotate=hadamard",
                                  "fp8:format=e5m2,block=32", "zfp:rate=8,dims=2", "lossless:block=256"])
def test_get_codec_backend_simt(spec):
    """ccoll.get_codec(spec, backend="simt"): the public API (encode, decode, the batched calls) runs the
    codec's cupy launches on the CPU and gives the emulated backend's bytes."""
    em, sm = ccoll.get_codec(spec, backend="emulated"), ccoll.get_codec(spec, backend="simt")
    x = _values(3 * 1000 + 17, torch.float32, 4).nan_to_num(0.0, 0.0, 0.0)
    p = sm.encode(x)
    assert torch.equal(p, em.encode(x))
    y, y_ref = sm.decode(p, x.numel(), x.dtype), em.decode(p, x.numel(), x.dtype)
    assert torch.equal(y.view(torch.int32), y_ref.view(torch.int32))
    rows = torch.zeros(3, sm.encoded_nbytes(1006, x.dtype), dtype=torch.uint8)
    sm.encode_rows(x, rows, 1006)
    assert torch.equal(rows, em.encode_rows(x, torch.zeros_like(rows), 1006))
    assert torch.equal(sm.decode_sum(rows, 1006, x.dtype).view(torch.int32),
                       em.decode_sum(rows, 1006, x.dtype).view(torch.int32))


def test_zz_counts(capsys):
    """Prints how many kernel launches the matrix compared (run with -s to see it)."""
    with capsys.disabled():
        total = sum(CALLS.values())
        print(f"\nsimt kernel launches compared: {total} " + ", ".join(f"{k}: {v}" for k, v in sorted(CALLS.items())))
        for key, cases in sorted(BOUND_SIZES.items()):
            print(f"bound sizes {key} (rows, row_numel, numel): {cases}")
