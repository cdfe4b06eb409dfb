"""Building kernels/*.cu for GPUs without a GPU.

`python -m ccoll.kernels check` (also `make kernels-check`) compiles every kernels/*.cu with nvcc (PTX for
compute_90 under CuPy's -ftz=true, and the host pass), and for sm_80 and sm_90 with NVRTC (the
nvidia-cuda-nvrtc wheel, loaded with ctypes) using exactly the options the cupy backend compiles with, so a
syntax or type error in GPU code, a kernel the Python side launches but the module lacks, a flush-to-zero
build (or, under -ftz=true, a flushing instruction a source does not allow), atomics or stack arrays in zfp's
tile encoder, or a plain quant kernel above 64 registers or with local memory (ptxas's resource report of the
NVRTC cubins) fails CI instead of a user's GPU job.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import types

import pytest
import torch

from ccoll import kernels
from ccoll.kernels import check as kernels_check
from ccoll.errors import KernelError


def _require_nvrtc():
    try:
        return kernels.nvrtc()
    except KernelError as e:
        pytest.skip(f"no libnvrtc here (CI installs the nvidia-cuda-nvrtc wheel with '.[dev]'): {str(e)[:200]}")


@pytest.fixture(scope="module")
def lossless_build():
    """The smallest kernel source (~1 s of NVRTC for compute_90, zfp's ~20 s): the verification and launch
    logic under test are the same for every source."""
    _require_nvrtc()
    return kernels.compile_nvrtc("lossless", "compute_90")


# a multiply, an add, a max and a division of fp32 values: flush-to-zero would mark each with .ftz
_TINY = 'extern "C" __global__ void k(float* x) { x[0] = x[1] * x[2] + x[3]; x[4] = fmaxf(x[5], x[6]); x[7] = x[8] / x[9]; }'


@pytest.mark.timeout(0)  # bounded by work: a fixed set of compiles, each cached by content (see the docstring)
def test_given_every_kernel_source_when_checking_expect_nvcc_and_nvrtc_builds_with_every_launched_kernel():
    """`python -m ccoll.kernels check` in a subprocess, its verdict independent of the machine's speed: every
    nvcc pass and NVRTC build is cached by content (the sources' bytes, the options, the compiler's version:
    ``kernels.cached_nvrtc``, ``check._nvcc_ptx``), so after the first run only a changed source compiles
    again (~4m30s of NVRTC + nvcc on 2 quiet cores from nothing; seconds when cached), and no wall-clock
    limit is set: a loaded machine is slower, not wrong."""
    names = kernels.kernel_names()
    assert {"quant", "zfp"} <= set(names)  # the check must not pass vacuously
    if shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"):
        pytest.skip("nvcc not found: the check also compiles with nvcc")
    nv = _require_nvrtc()
    proc = subprocess.run(
        [sys.executable, "-m", "ccoll.kernels", "check"], capture_output=True, text=True, cwd=kernels.ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-4000:]
    version = ".".join(map(str, nv.version))
    for name in names:
        assert f"{name}.cu compiles with nvcc for compute_90" in proc.stdout
        assert f"{name}.cu compiles with NVRTC {version} for sm_80, sm_90" in proc.stdout
    assert "-ftz=false" in proc.stdout
    # the nvcc pass compiles as CuPy would (-ftz=true): quant flushes nothing, zfp only its normal-operand
    # multiplies (FTZ_ALLOWED; the exact set shows the flag took effect), and the tile encoder's PTX rule held
    flushing = dict(re.findall(r"^(\w+)\.cu compiles with nvcc for compute_90; with -ftz=true \(CuPy's flag\) its "
                               r"flushing instructions are: (.*)$", proc.stdout, flags=re.MULTILINE))
    assert flushing["quant"] == "none" and flushing["zfp"] == "mul.ftz.f32", flushing
    assert "zfp.cu PTX: no " in proc.stdout
    # the resource report: every launched quant kernel, registers / local bytes for sm_80 and sm_90
    assert "quant.cu resources per thread (sm_80 registers / local bytes | sm_90 registers / local bytes):" \
        in proc.stdout
    rows = {m[0]: tuple(map(int, m[1:])) for m in re.findall(
        r"^  (ccoll_\w+)\s+(\d+) / (\d+) \| +(\d+) / (\d+)$", proc.stdout, flags=re.MULTILINE)}
    from ccoll.kernels.call import cuda_kernels

    quant = cuda_kernels("quant")
    assert set(quant) <= set(rows) and len(quant) == 36 + 135
    plain = [k for k in quant if "_rot_" not in k]
    assert len(plain) == 36
    for k in quant:  # no local memory anywhere; plain kernels within 64 registers
        regs80, local80, regs90, local90 = rows[k]
        assert local80 == local90 == 0 and 0 < regs80 and 0 < regs90, (k, rows[k])
        assert k not in plain or (regs80 <= 64 and regs90 <= 64), (k, rows[k])


def test_given_the_cupy_build_options_expect_no_flush_to_zero_and_one_rounding_per_operation():
    for arch in ("sm_90", "compute_80"):
        options = kernels.nvrtc_options(arch)
        ftz = [o for o in options if re.match(r"-?-ftz", o)]
        assert ftz == ["-ftz=false"], options  # NVRTC keeps the last occurrence: there is exactly one
        assert "--fmad=false" in options and "-prec-div=true" in options and "-prec-sqrt=true" in options
        assert "-std=c++17" in options and f"-I{kernels.KERNEL_DIR}" in options
        assert options[-1] == f"--gpu-architecture={arch}"
    with pytest.raises(KernelError):
        kernels.nvrtc_options("90")


def test_given_fp32_arithmetic_when_compiled_with_the_options_expect_ptx_without_ftz_and_cupys_flag_would_add_it():
    """The PTX check is sharp: CuPy's trailing -ftz=true (cupy/cuda/compiler.py) turns the same source into
    flushing instructions, which is what RawModule used to build."""
    nv = _require_nvrtc()
    options = kernels.nvrtc_options("compute_90")
    ptx = nv.compile(_TINY, "tiny.cu", options)[0].decode()
    assert "mul.rn.f32" in ptx and "div.rn.f32" in ptx and "max.f32" in ptx
    assert ".ftz" not in ptx and "fma." not in ptx  # --fmad=false: a*b+c rounds twice, as on the host
    flushed = nv.compile(_TINY, "tiny.cu", (*options, "-ftz=true"))[0].decode()
    assert "mul.rn.ftz.f32" in flushed and "max.ftz.f32" in flushed


def test_given_a_kernel_the_codec_would_launch_but_the_module_lacks_when_verifying_expect_kernel_error(
    lossless_build, monkeypatch
):
    import ccoll.codecs.lossless as lossless_codec

    kernels_check.verify_nvrtc_build(lossless_build)  # the real module exports what lossless.py launches
    assert {"ccoll_lossless_range_f32", "ccoll_lossless_pack_bf16", "ccoll_lossless_decode_f16"} <= lossless_build.entries
    monkeypatch.setattr(lossless_codec, "CUDA_KERNELS", ("ccoll_lossless_pack_f32", "ccoll_lossless_pack_f64"),
                        raising=False)
    assert kernels_check.launched_kernels("lossless") == ["ccoll_lossless_pack_f32", "ccoll_lossless_pack_f64"]
    with pytest.raises(KernelError, match="ccoll_lossless_pack_f64"):
        kernels_check.verify_nvrtc_build(lossless_build)


def test_given_a_source_that_flushes_under_cupys_flag_when_nvcc_checks_expect_kernel_error(monkeypatch, tmp_path):
    """The nvcc pass's -ftz=true rule is sharp: a multiply, an add, a max and a division of fp32 values compiled
    with CuPy's flag flush, and a source allowed none of them fails the check (~3 s of nvcc)."""
    if shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"):
        pytest.skip("nvcc not found")
    (tmp_path / "tiny.cu").write_text(_TINY)
    monkeypatch.setattr(kernels_check, "source", lambda name: tmp_path / f"{name}.cu")
    with pytest.raises(KernelError, match=r"tiny\.cu compiled with -ftz=true .*\.ftz") as failed:
        kernels_check.check_compile("tiny")
    flushing = frozenset(re.findall(r"\b[\w.]+\.ftz[\w.]*", str(failed.value).split(": ", 1)[1]))
    assert len(flushing) >= 3, flushing  # the multiply(-add), the max and the division
    monkeypatch.setitem(kernels_check.FTZ_ALLOWED, "tiny", flushing)
    assert kernels_check.check_compile("tiny") == flushing


@pytest.mark.parametrize("body, expect", [
    ("ld.global.u32 %r1, [%rd1];\n\tst.shared.u32 [%r2], %r1;", []),
    ("atom.global.add.u32 %r1, [%rd1], 1;", ["ccoll_zfp_encode_tiles_f32: atom.global.add.u32"]),
    (".local .align 4 .b8 __local_depot0[16];", ["ccoll_zfp_encode_tiles_f32: .local"]),
])
def test_given_zfp_tile_encoder_ptx_expect_no_atomics_and_no_stack_arrays(body, expect):
    """zfp's PTX rule (``PTX_FORBIDDEN``), on hand-written PTX (no compile); other kernels may use both."""
    ptx = (".visible .entry ccoll_zfp_encode_rows_f32(\n)\n{\n\tatom.global.or.b32 %r1, [%rd1], %r2;\n}\n"
           f".visible .entry ccoll_zfp_encode_tiles_f32(\n)\n{{\n\t{body}\n}}\n")
    build = kernels.NvrtcBuild("zfp", "compute_90", (), ptx, None, "")
    problems = kernels_check.forbidden_ptx(build)
    assert len(problems) == len(expect) and all(p.startswith(e) for p, e in zip(problems, expect)), problems
    empty = kernels.NvrtcBuild("zfp", "compute_90", (), ptx.split(".visible .entry ccoll_zfp_encode_tiles")[0],
                               None, "")
    assert [p.split(" (")[0] for p in kernels_check.forbidden_ptx(empty)] == [
        f"no entry point matches {kernels_check.PTX_FORBIDDEN['zfp'][0]!r}"]


_PTXAS_LOG = """ptxas info    : 220 bytes gmem
ptxas info    : Compiling entry function 'ccoll_int8_encode_rows_f32' for 'sm_90'
ptxas info    : Function properties for ccoll_int8_encode_rows_f32
ptxas         .     {stack} bytes stack frame, {spill} bytes spill stores, {spill} bytes spill loads
ptxas info    : Used {regs} registers, used 0 barriers, {stack} bytes cumulative stack size, 432 bytes cmem[0]
ptxas info    : Compiling entry function 'ccoll_int8_encode_rows_rot_w8_f32' for 'sm_90'
ptxas info    : Function properties for ccoll_int8_encode_rows_rot_w8_f32
ptxas         .     {rot_stack} bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 238 registers, used 0 barriers, {rot_stack} bytes cumulative stack size, 432 bytes cmem[0]
"""


@pytest.mark.parametrize("regs, stack, spill, rot_stack, expect", [
    (64, 0, 0, 0, []),
    (65, 0, 0, 0, ["ccoll_int8_encode_rows_f32: 65 registers > 64"]),
    (40, 16, 0, 0, ["ccoll_int8_encode_rows_f32: local memory (16 bytes stack frame"]),
    (64, 8, 8, 0, ["ccoll_int8_encode_rows_f32: local memory (8 bytes stack frame, 8 bytes spill stores"]),
    (64, 0, 0, 256, ["ccoll_int8_encode_rows_rot_w8_f32: local memory (256 bytes stack frame"]),
])
def test_given_ptxas_resources_when_checking_quant_expect_no_local_memory_and_plain_kernels_within_64_registers(
    regs, stack, spill, rot_stack, expect
):
    """The failure rule of `make kernels-check`, on ptxas logs (no compile): a quant kernel fails with any
    stack / spill bytes, a plain one also above 64 registers (the rotate=hadamard kernels, ``_rot_w<W>_``,
    hold a lane's share of a block in as many registers as it takes); a launched kernel missing from the
    report fails too."""
    log = _PTXAS_LOG.format(regs=regs, stack=stack, spill=spill, rot_stack=rot_stack)
    res = kernels.parse_ptxas_resources(log)
    assert res["ccoll_int8_encode_rows_f32"] == kernels.Resources(regs, stack, spill, spill)
    assert res["ccoll_int8_encode_rows_rot_w8_f32"].registers == 238
    ptx = ".visible .entry ccoll_int8_encode_rows_f32(\n.visible .entry ccoll_int8_encode_rows_rot_w8_f32(\n"
    options = kernels.nvrtc_options("sm_90") + (kernels.PTXAS_VERBOSE,)
    build = kernels.NvrtcBuild("quant", "sm_90", options, ptx, b"cubin", log)
    problems = kernels_check.resource_problems(build)
    assert len(problems) == len(expect) and all(p.startswith(e) for e, p in zip(expect, problems)), problems
    missing = kernels.NvrtcBuild("quant", "sm_90", options, ptx + ".visible .entry ccoll_int4_decode_sum_f32(\n",
                                 b"cubin", log)
    assert any("ccoll_int4_decode_sum_f32: not in ptxas's resource report" in p
               for p in kernels_check.resource_problems(missing))
    report = kernels_check.resource_report([build, kernels.NvrtcBuild("quant", "sm_80", options, ptx, b"c", log)])
    local = max(stack, spill)
    assert re.search(rf"\n  ccoll_int8_encode_rows_f32 +{regs:4d} / {local} \| {regs:4d} / {local}\n", report), report


def test_given_a_codec_without_CUDA_KERNELS_expect_its_kernel_name_templates_as_patterns(monkeypatch):
    import ccoll.codecs.quant as quant_codec

    monkeypatch.delattr(quant_codec, "CUDA_KERNELS", raising=False)
    patterns = kernels_check.launched_kernels("quant")
    assert patterns and all(p.startswith("ccoll_") and "host" not in p for p in patterns)
    assert any(re.fullmatch(p, "ccoll_int4_decode_sum_bf16") for p in patterns)
    assert kernels_check.launched_kernels("no_such_codec") == []


def test_given_device_capabilities_expect_own_cubin_else_newest_older_ptx():
    nv = _require_nvrtc()
    assert kernels.device_target((9, 0)) == "sm_90"
    newest = max(nv.archs)
    assert kernels.device_target((newest // 10 + 5, 0)) == f"compute_{newest}"  # a future GPU: the driver JITs
    with pytest.raises(KernelError):
        kernels.device_target((1, 0))


def test_given_launches_on_two_torch_streams_expect_one_build_one_lookup_and_no_sync(monkeypatch, tmp_path):
    """Stand-in for a GPU (CI has none): a recording fake of the CuPy pieces ``kernels.launch`` uses
    (Module.load, get_function, Stream.from_external, Device, the launch call) and torch's stream/capability
    queries. What runs for real: the NVRTC build with the options under test, the on-disk cache and the
    caching and stream logic of ``launch`` (on the smallest source, lossless: the logic is per module)."""
    _require_nvrtc()
    log = {"load": [], "get_function": [], "from_external": [], "launch": []}

    class Function:
        def __call__(self, grid, block, args, stream=None):
            log["launch"].append((grid, block, args, stream))

    class Module:
        def load(self, image):
            log["load"].append(image)

        def get_function(self, name):
            log["get_function"].append(name)
            return Function()

    class Stream:
        @staticmethod
        def from_external(obj):
            log["from_external"].append(obj.__cuda_stream__())
            return ("cupy-stream", obj.__cuda_stream__()[1])

    class Device:
        def __init__(self, index):
            assert index == 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    cuda = types.SimpleNamespace(
        function=types.SimpleNamespace(Module=Module), Stream=Stream, Device=Device,
        runtime=types.SimpleNamespace(getDevice=lambda: 0),
    )  # no synchronize anywhere: calling one would fail
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    current = {"ptr": 0xA000}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index: types.SimpleNamespace(cuda_stream=current["ptr"]))
    monkeypatch.setattr(kernels, "BUILD_DIR", tmp_path)
    for cache in ("_modules", "_functions", "_streams"):
        monkeypatch.setattr(kernels, cache, {})
    device = torch.device("cuda", 0)

    kernels.launch("lossless", "ccoll_lossless_pack_f32", 3, 128, ("a",), device)
    kernels.launch("lossless", "ccoll_lossless_pack_f32", 4, 128, ("b",), device)
    current["ptr"] = 0xB000
    kernels.launch("lossless", "ccoll_lossless_pack_f32", 5, 128, ("c",), device)

    assert len(log["load"]) == 1 and log["load"][0][:4] == b"\x7fELF"  # a sm_90 cubin: no JIT, no -ftz=true
    assert len(list((tmp_path / "nvrtc").glob("lossless-sm_90-*.bin"))) == 1
    assert log["get_function"] == ["ccoll_lossless_pack_f32"]
    assert log["from_external"] == [(0, 0xA000), (0, 0xB000)]
    assert log["launch"] == [
        ((3,), (128,), ("a",), ("cupy-stream", 0xA000)),
        ((4,), (128,), ("b",), ("cupy-stream", 0xA000)),
        ((5,), (128,), ("c",), ("cupy-stream", 0xB000)),
    ]
    monkeypatch.setattr(kernels, "_modules", {})  # a second process: the cached image, no compile
    monkeypatch.setattr(kernels, "compile_nvrtc", lambda *a: pytest.fail("recompiled despite the cache"))
    kernels.cupy_module("lossless", 0)
    assert log["load"][1] == log["load"][0]


def test_given_quant_expect_rotate_kernels_in_their_own_nvrtc_module_so_plain_runs_never_compile_them():
    """kernels/quant.cu is two NVRTC modules (``MODULE_PARTS``): the plain kernels ("quant") and the
    rotate=hadamard ones ("quant_rot"), each with its own defines, cache and bundle key; every launched
    kernel belongs to exactly one, and a launch loads the one that defines its kernel. No compile here: the
    check (test above) verifies each module exports its launched kernels and nothing of the other's."""
    from ccoll.kernels.call import cuda_kernels

    assert kernels.modules_of("quant") == ("quant", "quant_rot")
    assert kernels.modules_of("zfp") == ("zfp",) and kernels.module_source("zfp") == "zfp"
    assert kernels.module_source("quant_rot") == "quant"
    assert {"quant", "quant_rot", "zfp", "lossless"} <= set(kernels.module_names())
    names = cuda_kernels("quant")
    rot = [k for k in names if kernels.module_of("quant", k) == "quant_rot"]
    plain = [k for k in names if kernels.module_of("quant", k) == "quant"]
    assert len(plain) == 36 and len(rot) == 135 and all("_rot_w" in k for k in rot)
    assert not any("_rot_" in k for k in plain)
    assert kernels.module_of("zfp", "ccoll_zfp_encode_tiles_f32") == "zfp"
    assert kernels.module_options("quant", "sm_90") == kernels.nvrtc_options("sm_90") + ("-DCCOLL_QUANT_KERNELS=1",)
    assert kernels.module_options("quant_rot", "sm_90")[-1] == "-DCCOLL_QUANT_KERNELS=2"
    assert kernels.module_options("zfp", "sm_90") == kernels.nvrtc_options("sm_90")
    assert kernels.bundle_key("quant", "sm_90") != kernels.bundle_key("quant_rot", "sm_90")
    # a build holding the other module's kernels fails the check
    ptx = ".visible .entry ccoll_int8_encode_rows_f32(\n.visible .entry ccoll_int8_encode_rows_rot_w2_f32(\n"
    build = kernels.NvrtcBuild("quant_rot", "compute_90", kernels.module_options("quant_rot", "compute_90"), ptx,
                               None, "")
    with pytest.raises(KernelError, match="ccoll_int8_encode_rows_f32 belongs to module quant"):
        kernels_check.verify_nvrtc_build(build)


def test_given_the_build_caches_expect_keys_of_the_sources_bytes_not_their_path_or_mtime(monkeypatch, tmp_path):
    """The host build's library (and NVRTC's and the check's outputs, by the same ``content_key``) is named by the
    sources' bytes, the options with the include path normalised, and the compiler's version: a copy of the
    sources elsewhere (an installed wheel) or a touched file finds the same build, an edit of the source or of a
    header a new one. Before, the host build was keyed by mtime: an older edit, or a copy, reused a stale
    library."""
    if shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"):
        pytest.skip("nvcc not found: the host build's key holds nvcc's version")
    names = {}
    for where in ("a", "b"):
        d = tmp_path / where
        d.mkdir()
        for f in kernels.KERNEL_DIR.glob("*.cu*"):
            (d / f.name).write_bytes(f.read_bytes())
        monkeypatch.setattr(kernels, "KERNEL_DIR", d)
        names[where] = kernels.host_library_path("lossless").name
    assert names["a"] == names["b"] and names["a"].startswith("libccoll_lossless-")
    os.utime(tmp_path / "b" / "lossless.cu", (1, 1))
    assert kernels.host_library_path("lossless").name == names["a"]
    options = ("-std=c++17", f"-I{tmp_path / 'b'}")
    key = kernels.content_key("lossless", options, "13.0")
    assert key == kernels.content_key("lossless", ("-std=c++17", "-Ikernels"), "13.0")
    assert key != kernels.content_key("lossless", options, "13.1")
    (tmp_path / "b" / "common.cuh").write_text((tmp_path / "b" / "common.cuh").read_text() + "\n")
    assert kernels.host_library_path("lossless").name != names["a"]
    assert kernels.content_key("lossless", options, "13.0") != key
