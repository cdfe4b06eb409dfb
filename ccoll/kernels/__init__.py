"""Loading kernels/*.cu: compiled by NVRTC and launched through CuPy on a GPU, or built for the host with
nvcc ("emulated").

Why a host build: CI has no GPU, so the kernels' own per-block logic (``__host__ __device__`` functions)
is compiled for the CPU and checked byte for byte against libzfp and the torch backend. Each .cu file
exposes, under ``#ifdef CCOLL_HOST``, ``extern "C"`` host entry points named ``ccoll_host_<codec>_<op>_<dtype>``
that loop over blocks (OpenMP) calling exactly the functions the ``__global__`` kernels call.

Why NVRTC is called here and not through ``cupy.RawModule``: CuPy appends ``-ftz=true`` to every NVRTC
compile, after the caller's options (``_compile_with_cache_cuda`` in cupy/cuda/compiler.py), and NVRTC
keeps the last occurrence of a flag. Flush-to-zero makes fp32 multiplies, adds, divisions and min/max
flush subnormal operands and results, so int8 blocks with absmax below ~1.5e-36 quantize to zero and
zfp fp32 blocks near 2^-98 decode to zeros: GPU bytes would differ from the emulated and torch backends.
So kernels/*.cu are compiled with exactly ``nvrtc_options(arch)`` (``NVRTC_OPTIONS`` plus the target),
the one list both the GPU path and ``make kernels-check`` use, and the binary is loaded with CuPy's
``Module``. NVRTC is loaded with ctypes (the ``nvidia-cuda-nvrtc`` wheel, a CUDA toolkit, or the system
loader), so CI compiles the very same way without a GPU.
"""
from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from .. import resources
from ..errors import KernelError

#: the directory holding the ``ccoll`` package: the checkout in a source tree (tests and tools find tools/
#: there). Never used to find the sources or the cache: that is ccoll/resources.py.
ROOT = Path(__file__).resolve().parent.parent.parent
#: the kernel sources ($CCOLL_KERNEL_DIR, else the shipped ones) and the build cache ($CCOLL_BUILD_DIR, the
#: checkout's build/, or the user cache): ``ccoll.resources.kernel_dir`` / ``build_dir``
KERNEL_DIR = resources.kernel_dir()
BUILD_DIR = resources.build_dir()
#: compute capabilities `make kernels-check` builds with NVRTC (sm_XY cubins with ptxas's resource report, what
#: such a device loads); nvcc compiles PTX for the last one only (ccoll/kernels/check.py NVCC_TARGET)
CHECK_ARCHS = ("sm_80", "sm_90")

#: NVRTC options for every kernels/*.cu build, on a GPU and in CI alike (``nvrtc_options`` adds the target).
#: ``-ftz=false``: subnormals are kept, as on the host and in torch (see the module docstring);
#: ``--fmad=false``: no a*b+c contraction into one rounding, so every fp32/fp64 operation rounds as the host
#: build's does (the kernels already spell the exact ops with __fadd_rn/__fmul_rn where it matters);
#: ``-prec-div``/``-prec-sqrt``: IEEE round-to-nearest division and square root (NVRTC's defaults, stated
#: so that no later default change can alter the bytes).
NVRTC_OPTIONS = (
    "-std=c++17",
    f"-I{KERNEL_DIR}",
    "--fmad=false",
    "-ftz=false",
    "-prec-div=true",
    "-prec-sqrt=true",
)

#: what `make kernels-check` adds to ``nvrtc_options`` for a cubin target: ptxas's per-kernel resource report
#: (registers, stack frame, spills) in the compile log. Verbosity only: the code is the same.
PTXAS_VERBOSE = "--ptxas-options=-v"

_lock = threading.Lock()

#: NVRTC modules (what a GPU loads and ``make gpu-bundle`` carries) made from part of a source: source ->
#: ((module, kernel-name regex, extra NVRTC options), ...); a source not listed is one module of its own name.
#: kernels/quant.cu's rotate=hadamard kernels (``_rot_w<W>_``, one per words per lane) are a module of their
#: own, compiled on their first launch only: they take most of the file's NVRTC time (sm_90 on a 2-core CI
#: machine: the plain kernels 13 s, the _rot_w<W> ones 61 s), which a run without rotate need not pay. The
#: host build, nvcc's compile check and simt still compile the whole file (no CCOLL_QUANT_KERNELS).
MODULE_PARTS: dict[str, tuple[tuple[str, str, tuple[str, ...]], ...]] = {
    "quant": (("quant", r"(?!.*_rot_)\w+", ("-DCCOLL_QUANT_KERNELS=1",)),
              ("quant_rot", r"\w+_rot_\w+", ("-DCCOLL_QUANT_KERNELS=2",))),
}


def kernel_names() -> list[str]:
    """The sources kernels/*.cu by name (a host library, a simt library and a kernels-check each)."""
    return sorted(p.stem for p in KERNEL_DIR.glob("*.cu"))


def modules_of(name: str) -> tuple[str, ...]:
    """The NVRTC modules of source ``name`` (``MODULE_PARTS``; else the source's own name)."""
    parts = MODULE_PARTS.get(name)
    return tuple(p[0] for p in parts) if parts else (name,)


def module_names() -> list[str]:
    """Every NVRTC module, over all sources."""
    return [m for name in kernel_names() for m in modules_of(name)]


def _module_part(module: str) -> tuple[str, str, tuple[str, ...]]:
    """(source, kernel regex, extra options) of an NVRTC module."""
    for name, parts in MODULE_PARTS.items():
        for part in parts:
            if part[0] == module:
                return name, part[1], part[2]
    return module, r"\w+", ()


def module_source(module: str) -> str:
    """The source name an NVRTC module is compiled from."""
    return _module_part(module)[0]


def module_of(name: str, kernel: str) -> str:
    """The NVRTC module of source ``name`` that defines ``kernel``."""
    for part in MODULE_PARTS.get(name, ()):
        if re.fullmatch(part[1], kernel):
            return part[0]
    return name


def module_options(module: str, arch: str) -> tuple[str, ...]:
    """``nvrtc_options(arch)`` plus the module's own defines (``MODULE_PARTS``): its effective NVRTC options."""
    return nvrtc_options(arch) + _module_part(module)[2]


def source(name: str) -> Path:
    path = KERNEL_DIR / f"{name}.cu"
    if not path.exists():
        raise KernelError(f"no kernel source {path}; available: {', '.join(kernel_names())}")
    return path


def _nvcc() -> str:
    nvcc = shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None
    )
    if nvcc is None:
        raise KernelError("nvcc not found: the emulated backend builds kernels/*.cu for the host with nvcc")
    return nvcc


def _deps(name: str) -> list[Path]:
    """The files a build of source or module ``name`` depends on."""
    return [source(module_source(name)), *KERNEL_DIR.glob("*.cuh")]


def normalised_options(options) -> tuple[str, ...]:
    """``options`` with the include path of the kernel sources written as the relative ``-Ikernels``: what a
    build depends on is the sources' bytes (hashed beside), not where they are (a checkout, an installed
    wheel)."""
    return tuple("-Ikernels" if o == f"-I{KERNEL_DIR}" else o for o in options)


def content_key(name: str, options, *compiler) -> str:
    """The key of a build of source or module ``name``: its options (``normalised_options``), the compiler's
    identity (``compiler``: a version) and every source it depends on, by bytes -- never by mtime, so a
    checkout, a copy, a wheel's sources or a tree edited back and forth share one cache entry per content."""
    key = hashlib.sha256(repr((compiler, normalised_options(options))).encode())
    for dep in sorted(_deps(name), key=lambda p: p.name):
        key.update(dep.name.encode() + b"\0" + dep.read_bytes())
    return key.hexdigest()[:20]


@functools.lru_cache(maxsize=None)
def nvcc_version() -> str:
    """``nvcc --version``'s last line (the release and build), part of every nvcc build's key."""
    proc = subprocess.run([_nvcc(), "--version"], capture_output=True, text=True)
    return proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else "unknown"


#: host compiler options of one source's host build beyond the common ones. quant: -fno-trapping-math lets
#: the compiler turn the selects of its CPU streaming loops (kernels/quant.cu "the CPU's streaming paths")
#: into vector blends: without it g++ will not evaluate both sides of a select holding an fp32 operation
#: (either might raise a floating-point flag) and leaves those loops scalar ("control flow in loop"). It
#: changes no result: the operations and their rounding are the same, only when they are evaluated (no
#: reassociation, contraction, reciprocal or finite-math assumption comes with it).
HOST_OPTIONS = {"quant": ("-fno-trapping-math",)}
#: sources whose host build targets this machine's CPU (-march=native: its widest vectors; AVX-512 doubles the
#: quant streaming loops' rate over the x86-64 baseline's SSE2). Only where :func:`native_target` can say what
#: that means here: the build's key then includes it, so a cache shared by machines of different CPUs (a
#: home directory on NFS) keeps one build per CPU and never loads one built for another. Results do not
#: depend on it: IEEE operations rounded alike at any width, no contraction (-ffp-contract=off).
HOST_NATIVE = ("quant",)


@functools.lru_cache(maxsize=None)
def native_target() -> str | None:
    """The target options the host compiler's ``-march=native`` stands for on this CPU (its driver's expansion:
    ``-march=<cpu> -mavx2 -mno-avx512er ... --param ...``), or None when the compiler cannot be asked (then no
    host build uses -march=native)."""
    cc = shutil.which("g++") or shutil.which("c++")
    if cc is None:
        return None
    try:
        proc = subprocess.run([cc, "-march=native", "-E", "-v", "-x", "c++", "-"], input="", capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in proc.stderr.splitlines():
        if "cc1" in line and "-march=" in line:
            return " ".join(tok for tok in line.split() if tok.startswith(("-m", "--param")))
    return None


def _host_command(name: str, out: Path) -> list[str]:
    native = ("-march=native",) if name in HOST_NATIVE and native_target() else ()
    return [
        _nvcc(), "-O3", "-std=c++17", "-DCCOLL_HOST", f"-I{KERNEL_DIR}",
        # -ffp-contract=off: no a*b+c contraction on a host with FMA instructions (as the GPU's --fmad=false)
        "-Xcompiler", ",".join(("-fPIC", "-O3", "-fopenmp", "-ffp-contract=off", *HOST_OPTIONS.get(name, ()), *native)),
        "-shared", "-lgomp", "-o", str(out), str(source(name)),
    ]


def host_library_path(name: str) -> Path:
    """Where the host build of kernels/<name>.cu for the current sources, options and nvcc is (or will be):
    ``libccoll_<name>-<content_key>.so``."""
    command = _host_command(name, Path("OUT"))
    target = (native_target(),) if "-march=native" in command[6] else ()
    key = content_key(name, command[1:-3], nvcc_version(), *target)
    return BUILD_DIR / "host" / f"libccoll_{name}-{key}.so"


def build_host(name: str) -> Path:
    """Build kernels/<name>.cu for the host unless a build of the same content exists (``host_library_path``:
    keyed by the sources' bytes, the options and nvcc's version). A file lock makes concurrent ranks build
    once."""
    out = host_library_path(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{name}.lock", "w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)
        if out.exists():
            return out
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        cmd = _host_command(name, tmp)
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise KernelError(f"host build of {name}.cu failed:\n{' '.join(cmd)}\n{proc.stderr}")
        os.replace(tmp, out)
    return out


@functools.lru_cache(maxsize=None)
def host_build_ready(name: str) -> bool:
    """Whether the host build of kernels/<name>.cu for the current sources, options and nvcc is already in the
    cache (``make kernels-host``, or an earlier ``emulated`` call): never builds, and False without nvcc. The
    codecs' ``auto`` backend asks it (once per process) before preferring the host build on CPU tensors: a
    first build takes minutes, which a training step must not wait for."""
    try:
        return host_library_path(name).exists()
    except (KernelError, OSError):
        return False


@functools.lru_cache(maxsize=None)
def host_library(name: str) -> ctypes.CDLL:
    """The host build of kernels/<name>.cu, built on first use."""
    with _lock:
        return ctypes.CDLL(str(build_host(name)))


# --------------------------------------------------------------------------------------------------
# NVRTC through ctypes: the GPU build and the CI check share nvrtc_options() and compile_nvrtc()


def nvrtc_options(arch: str) -> tuple[str, ...]:
    """The complete NVRTC option list for target ``arch`` ("sm_90": a cubin; "compute_90": PTX only).
    Nothing is appended after it: these are the effective options."""
    if not re.fullmatch(r"(sm|compute)_\d+[af]?", arch):
        raise KernelError(f"NVRTC target {arch!r} is not of the form sm_XY or compute_XY")
    return (*NVRTC_OPTIONS, f"--gpu-architecture={arch}")


def _nvrtc_candidates() -> list[str]:
    """Where libnvrtc may be, best first: $CCOLL_NVRTC; the nvidia-cuda-nvrtc wheels (13.x: nvidia/cu13/lib,
    12.x: nvidia/cuda_nvrtc/lib) on sys.path; a CUDA toolkit; then the system loader's search."""
    found = [os.environ["CCOLL_NVRTC"]] if os.environ.get("CCOLL_NVRTC") else []
    dirs = [Path(p or ".") / sub for p in sys.path for sub in ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            dirs += [Path(home) / "lib64", Path(home) / "lib"]
    for d in dirs:
        libs = [p for p in d.glob("libnvrtc.so*") if "builtins" not in p.name and "alt" not in p.name]
        found += [str(p) for p in sorted(libs, key=lambda p: len(p.name), reverse=True)]
    return found + ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]


class _Nvrtc:
    """The few NVRTC entry points ccoll needs, from one loaded libnvrtc."""

    def __init__(self, path: str):
        self.path = path
        lib = self.lib = ctypes.CDLL(path)
        p, i, sz = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_size_t)
        for fn, args in {
            "nvrtcVersion": [i, i],
            "nvrtcGetNumSupportedArchs": [i],
            "nvrtcGetSupportedArchs": [i],
            "nvrtcCreateProgram": [ctypes.POINTER(p), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, p, p],
            "nvrtcCompileProgram": [p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
            "nvrtcGetProgramLogSize": [p, sz],
            "nvrtcGetProgramLog": [p, ctypes.c_char_p],
            "nvrtcGetPTXSize": [p, sz],
            "nvrtcGetPTX": [p, ctypes.c_char_p],
            "nvrtcGetCUBINSize": [p, sz],
            "nvrtcGetCUBIN": [p, ctypes.c_char_p],
            "nvrtcDestroyProgram": [ctypes.POINTER(p)],
        }.items():
            getattr(lib, fn).argtypes = args
            getattr(lib, fn).restype = ctypes.c_int
        lib.nvrtcGetErrorString.argtypes, lib.nvrtcGetErrorString.restype = [ctypes.c_int], ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)
        count = ctypes.c_int()
        self._check(lib.nvrtcGetNumSupportedArchs(ctypes.byref(count)), "nvrtcGetNumSupportedArchs")
        archs = (ctypes.c_int * count.value)()
        self._check(lib.nvrtcGetSupportedArchs(archs), "nvrtcGetSupportedArchs")
        self.archs = tuple(archs)

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise KernelError(f"{what} failed: {self.lib.nvrtcGetErrorString(status).decode()} ({self.path})")

    def _buffer(self, prog, size_fn, get_fn) -> bytes:
        size = ctypes.c_size_t()
        self._check(size_fn(prog, ctypes.byref(size)), size_fn.__name__)
        buf = ctypes.create_string_buffer(size.value)
        self._check(get_fn(prog, buf), get_fn.__name__)
        return buf.raw

    def compile(self, text: str, filename: str, options: tuple[str, ...]) -> tuple[bytes, bytes | None, str]:
        """(PTX with its trailing NUL, cubin or None for a compute_XY target, compile log)."""
        lib, prog = self.lib, ctypes.c_void_p()
        self._check(lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), filename.encode(), 0, None, None),
                    "nvrtcCreateProgram")
        try:
            opts = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
            status = lib.nvrtcCompileProgram(prog, len(options), opts)
            log = self._buffer(prog, lib.nvrtcGetProgramLogSize, lib.nvrtcGetProgramLog).rstrip(b"\0").decode(
                errors="replace")
            if status != 0:
                raise KernelError(f"NVRTC {'.'.join(map(str, self.version))} cannot compile {filename} with "
                                  f"{' '.join(options)}:\n{log}")
            ptx = self._buffer(prog, lib.nvrtcGetPTXSize, lib.nvrtcGetPTX)
            cubin = None
            if any(o.startswith("--gpu-architecture=sm_") for o in options):
                cubin = self._buffer(prog, lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN)
            return ptx, cubin, log
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


@functools.lru_cache(maxsize=None)
def nvrtc() -> _Nvrtc:
    """libnvrtc, loaded once; KernelError naming every place looked when there is none."""
    tried = []
    for path in _nvrtc_candidates():
        try:
            return _Nvrtc(path)
        except (OSError, AttributeError) as e:
            tried.append(f"{path}: {e}")
    raise KernelError("no usable libnvrtc (install the nvidia-cuda-nvrtc wheel, e.g. pip install "
                      "'ccoll[dev]', or set CCOLL_NVRTC=/path/libnvrtc.so); tried:\n  " + "\n  ".join(tried))


@dataclass(frozen=True)
class Resources:
    """ptxas's resource usage of one kernel: registers per thread and local memory (bytes per thread)."""

    registers: int
    stack: int  # stack frame: local arrays and spills live here
    spill_stores: int
    spill_loads: int

    @property
    def local_bytes(self) -> int:
        return max(self.stack, self.spill_stores, self.spill_loads)


def parse_ptxas_resources(log: str) -> dict[str, Resources]:
    """Per-kernel ``Resources`` from a ptxas ``-v`` log (NVRTC with ``PTXAS_VERBOSE``, or nvcc
    ``--resource-usage``): the "Compiling entry function" / "N bytes stack frame" / "Used N registers" lines."""
    out: dict[str, Resources] = {}
    name, frame = None, (0, 0, 0)
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name, frame = m.group(1), (0, 0, 0)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name is not None:
            frame = tuple(int(x) for x in m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and name is not None:
            out[name] = Resources(int(m.group(1)), *frame)
            name = None
    return out


@dataclass(frozen=True)
class NvrtcBuild:
    """One NVRTC compile of kernels/<name>.cu: the effective options and what came out."""

    name: str
    arch: str
    options: tuple[str, ...]
    ptx: str
    cubin: bytes | None
    log: str

    @property
    def entries(self) -> frozenset[str]:
        """The kernels' names as the module exports them (``extern "C"`` so: exactly the source names)."""
        return frozenset(re.findall(r"^\s*(?:\.visible\s+)?\.entry\s+(\w+)", self.ptx, flags=re.MULTILINE))

    @property
    def resources(self) -> dict[str, Resources]:
        """Per-kernel registers and local memory, for a cubin built with ``PTXAS_VERBOSE`` ({} otherwise)."""
        return parse_ptxas_resources(self.log)

    @property
    def image(self) -> bytes:
        """What cuModuleLoadData takes: the cubin, else the NUL-terminated PTX for the driver to JIT."""
        return self.cubin if self.cubin is not None else self.ptx.encode() + b"\0"


def compile_nvrtc(name: str, arch: str, verbose: bool = False) -> NvrtcBuild:
    """Compile NVRTC module ``name`` (kernels/<name>.cu, or the part of a source ``MODULE_PARTS`` names) for
    ``arch`` using exactly ``module_options(name, arch)`` (``verbose``: plus ``PTXAS_VERBOSE``, so the log
    reports each kernel's resources; an sm_XY target only)."""
    options = module_options(name, arch) + ((PTXAS_VERBOSE,) if verbose else ())
    path = source(module_source(name))
    ptx, cubin, log = nvrtc().compile(path.read_text(), str(path), options)
    return NvrtcBuild(name, arch, options, ptx.rstrip(b"\0").decode(), cubin, log)


def device_target(capability: tuple[int, int]) -> str:
    """The NVRTC target for a device: its own sm_XY (a cubin, no JIT) when this NVRTC knows it, else PTX for
    the newest older compute_XY it knows, which the driver JIT-compiles for the device."""
    cc = capability[0] * 10 + capability[1]
    archs = nvrtc().archs
    if cc in archs:
        return f"sm_{cc}"
    older = [a for a in archs if a <= cc]
    if not older:
        raise KernelError(f"NVRTC {nvrtc().version} supports {archs}, nothing for compute capability {capability}")
    return f"compute_{max(older)}"


def _cache_path(name: str, arch: str, kind: str, verbose: bool = False) -> Path:
    """build/nvrtc/<name>-<arch>[-v]-<content_key>.<kind>: NVRTC's output for the sources' bytes, the module's
    options (include path normalised) and this NVRTC's version."""
    options = module_options(name, arch) + ((PTXAS_VERBOSE,) if verbose else ())
    return BUILD_DIR / "nvrtc" / f"{name}-{arch}{'-v' if verbose else ''}-{content_key(name, options, nvrtc().version)}.{kind}"


def _write_atomically(path: Path, data: bytes) -> None:
    """``data`` into ``path`` by rename (concurrent writers of one key write the same bytes); nothing if the
    cache directory is read-only."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        pass


def _cached_build(name: str, arch: str) -> bytes:
    """The module image for kernels/<name>.cu on ``arch``, cached under build/nvrtc/ keyed by content
    (``_cache_path``: ranks of one job, and every checkout or installed copy of the same sources sharing the
    cache, compile once). Uncached if build/ is read-only."""
    path = _cache_path(name, arch, "bin")
    try:
        return path.read_bytes()
    except OSError:
        pass
    image = compile_nvrtc(name, arch).image
    _write_atomically(path, image)
    return image


def cached_nvrtc(name: str, arch: str, verbose: bool = False, compile: bool = True) -> NvrtcBuild | None:
    """``compile_nvrtc(name, arch, verbose)``, its PTX, cubin and log cached by content (``_cache_path``), so
    `make kernels-check` and its test recompile only what changed: a check's verdict then depends on the
    work to do, not on how fast the machine does it. ``compile=False``: None instead of compiling a miss."""
    import json

    path = _cache_path(name, arch, "json", verbose)
    options = module_options(name, arch) + ((PTXAS_VERBOSE,) if verbose else ())
    try:
        data = json.loads(path.read_text())
        cubin = path.with_suffix(".cubin").read_bytes() if data["cubin"] else None
        return NvrtcBuild(name, arch, options, data["ptx"], cubin, data["log"])
    except (OSError, ValueError, KeyError):
        pass
    if not compile:
        return None
    build = compile_nvrtc(name, arch, verbose)
    if build.cubin is not None:
        _write_atomically(path.with_suffix(".cubin"), build.cubin)
    _write_atomically(path, json.dumps({"ptx": build.ptx, "log": build.log, "cubin": build.cubin is not None}).encode())
    return build


# --------------------------------------------------------------------------------------------------
# the carried bundle: cubins built off the GPU machine (``make gpu-bundle``), so a GPU session compiles nothing

def bundle_dir() -> Path:
    """Where ``make gpu-bundle`` writes ``<name>-<arch>-<key>.cubin`` (ignored under build/; a device call
    carries it); read at call time, so whoever moves BUILD_DIR moves it too."""
    return BUILD_DIR / "gpu"


def bundle_key(name: str, arch: str) -> str:
    """What a bundled cubin of kernels/<name>.cu for ``arch`` was built from: the options (the include path
    as the relative "kernels", since the checkout's path differs between machines) and every source's bytes.
    Any edit to a .cu/.cuh file or to the options gives a new key, so a stale cubin is never loaded. The
    NVRTC version is not in the key: a cubin for sm_XY runs on any sm_XY device whose driver loads it."""
    key = hashlib.sha256(repr(normalised_options(module_options(name, arch))).encode())
    for dep in sorted(_deps(name)):
        key.update(dep.name.encode() + b"\0" + dep.read_bytes())
    return key.hexdigest()[:20]


def bundle_path(name: str, arch: str) -> Path:
    return bundle_dir() / f"{name}-{arch}-{bundle_key(name, arch)}.cubin"


#: (name, device index) -> where the loaded module came from ("bundle <file>" or "nvrtc <target>")
module_origin: dict[tuple[str, int], str] = {}


def _module_image(name: str, capability: tuple[int, int]) -> tuple[bytes, str]:
    """The bundled cubin for this device's sm_XY when one matches the sources, else an NVRTC build."""
    arch = f"sm_{capability[0] * 10 + capability[1]}"
    bundled = bundle_path(name, arch)
    if bundled.exists():
        return bundled.read_bytes(), f"bundle {bundled.name}"
    target = device_target(capability)
    return _cached_build(name, target), f"nvrtc {target}"


# --------------------------------------------------------------------------------------------------
# loading and launching on a GPU (CuPy imported here only)

_modules: dict[tuple[str, int], object] = {}


def cupy_module(name: str, device_index: int):
    """NVRTC module ``name`` (``modules_of``) as a CuPy ``Module`` on CUDA device ``device_index``: the
    carried cubin of ``make gpu-bundle`` when one matches the sources (``bundle_path``), else NVRTC with
    ``module_options(name, device_target(capability))``; loaded with cuModuleLoadData. Once per process and
    device."""
    with _lock:
        mod = _modules.get((name, device_index))
        if mod is None:
            import torch

            cupy = _cupy()
            capability = torch.cuda.get_device_capability(device_index)
            image, origin = _module_image(name, capability)
            with cupy.cuda.Device(device_index):
                mod = cupy.cuda.function.Module()
                try:
                    mod.load(image)
                except Exception:  # noqa: BLE001 - a bundled cubin this driver refuses: build it here
                    if not origin.startswith("bundle"):
                        raise
                    target = device_target(capability)
                    origin = f"nvrtc {target} (the bundled cubin did not load)"
                    mod = cupy.cuda.function.Module()
                    mod.load(_cached_build(name, target))
            _modules[(name, device_index)] = mod
            module_origin[(name, device_index)] = origin
        return mod


def _cupy():
    try:
        import cupy
    except ImportError as e:
        raise KernelError("the cupy backend needs CuPy: pip install 'ccoll[gpu]' (CUDA 13) or 'ccoll[gpu-cu12]'") from e
    return cupy


class _TorchStream:
    """A raw stream handle in the CUDA stream protocol (``__cuda_stream__``) for ``cupy.cuda.Stream.from_external``."""

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


def _cupy_stream(cupy, index: int, ptr: int):
    """A CuPy view of torch's stream ``ptr`` on device ``index``, made once per stream: ``Stream.from_external``
    (CuPy >= 14, where ``ExternalStream`` is deprecated), else ``ExternalStream`` (older CuPy)."""
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    with cupy.cuda.Device(index):
        if from_external is not None:
            return from_external(_TorchStream(ptr))
        return cupy.cuda.ExternalStream(ptr, index)


_functions: dict[tuple[str, str, int], object] = {}
#: (device, raw stream) -> CuPy stream view; bounded by the streams torch hands out (its per-device pools)
_streams: dict[tuple[int, int], object] = {}


def launch(module: str, kernel: str, grid: int, block: int, args: tuple, device) -> None:
    """Launch ``kernel`` of kernels/<module>.cu (loaded from its NVRTC module, ``module_of``) with
    ``grid`` x ``block`` threads on torch's current stream of CUDA ``device``, without synchronising. ``args`` are numpy scalars (pointers as
    ``np.uint64`` device addresses of torch-owned memory). The one place that knows how kernels are
    loaded and launched: codecs call only this. Functions are cached per (module, kernel, device) and
    stream views per raw stream, so a launch costs two dict look-ups and the driver call."""
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    fn = _functions.get((module, kernel, index))
    cupy = _cupy()
    if fn is None:
        mod = cupy_module(module_of(module, kernel), index)
        try:
            with cupy.cuda.Device(index):
                fn = mod.get_function(kernel)
        except Exception as e:  # CuPy's driver error type differs across versions
            raise KernelError(f"kernels/{module}.cu has no kernel {kernel!r}: {e}") from e
        _functions[(module, kernel, index)] = fn
    ptr = torch.cuda.current_stream(index).cuda_stream
    stream = _streams.get((index, ptr))
    if stream is None:
        stream = _streams[(index, ptr)] = _cupy_stream(cupy, index, ptr)
    if cupy.cuda.runtime.getDevice() == index:
        fn((int(grid),), (int(block),), args, stream=stream)
    else:
        with cupy.cuda.Device(index):
            fn((int(grid),), (int(block),), args, stream=stream)
