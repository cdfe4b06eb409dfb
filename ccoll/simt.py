"""The "simt" backend: the real ``__global__`` kernels of kernels/*.cu executed on the CPU.

Why: CI has no GPU. The emulated backend (``-DCCOLL_HOST``) runs the kernels' per-block functions in a host
loop, so the thread mapping, the warp shuffles and the vector loads/stores of the ``__global__`` kernels
never run in CI. Here the .cu file is compiled as C++ together with kernels/simt/simt.h (each CUDA thread a
fiber, warps resolved at their sync points, alignment and bounds checked; the header's comment says what
it can and cannot see) and each kernel is launched with a grid, a block and its arguments, as CuPy does.

API (narrow on purpose; the codecs' launch point takes ``launch`` as a backend entry):
  * ``launch(module, kernel, grid, block, args, device=None, *, shared_bytes=0, order="forward", ctas=None)``
    -- the shape of ``ccoll.kernels.launch``: ``module`` a kernels/<module>.cu name (or a path to a .cu
    file), ``grid`` / ``block`` ints or (x, y, z), ``args`` numpy scalars as the cupy backend passes them
    (``np.uint64`` addresses of torch CPU memory, ``np.int64`` / ``np.int32`` / ``np.uint32`` /
    ``np.float32``), torch tensors (their address) or None (a null pointer). Each argument's size and kind
    are checked against the kernel's C++ signature. Raises KernelError on a GPU-undefined warp operation, a
    misaligned vector access, a fault (guard page) or a canary overwrite.
  * ``guarded_empty(numel, dtype, misalign=0, noreserve=False)``: a CPU tensor whose end lies against a
    PROT_NONE page (canary bytes fill < 64 bytes in between when ``misalign`` requires them).
  * ``ccoll.kernels.call.cupy_on_simt()``: a context manager routing this thread's "cupy" launches here, so a
    codec's own cupy launch geometry (``_encode_rows_cupy`` ...) runs on CPU tensors unchanged.
  * ``build(module)``: the shared library, cached under build/simt/ keyed by the sources' hashes.
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
import threading
import weakref
from pathlib import Path

import numpy as np
import torch

from . import kernels, resources
from .errors import KernelError

#: the CPU shim (simt.h, simt_runtime.cpp): ccoll's own, so always the shipped one, even under $CCOLL_KERNEL_DIR
SIMT_DIR = resources.shipped_kernel_dir() / "simt"
#: g++ flags of every simt build. -O1: the test matrix compiles and runs fastest overall; -ffp-contract=off:
#: no a*b+c contraction (as the GPU build's --fmad=false); alignment traps instead of UBSan's runtime;
#: -fno-gnu-unique: template statics (simt::Entry<&kernel>::desc) and inline functions' statics
#: (``__shared__``) stay per library instead of binding process-wide to the first library that defines
#: them (STB_GNU_UNIQUE ignores RTLD_LOCAL), so two builds with the same kernel names each run their own.
CXXFLAGS = (
    "-std=c++17", "-O1", "-fPIC", "-shared", "-DCCOLL_SIMT", "-ffp-contract=off", "-fno-strict-aliasing",
    "-fsanitize=alignment", "-fsanitize-undefined-trap-on-error", "-fno-gnu-unique", "-w",
)
ORDERS = {"forward": 0, "reverse": 1}

_lock = threading.RLock()


def _cxx() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise KernelError("the simt backend compiles kernels/*.cu as C++ and needs g++ (or $CXX)")
    return cxx


def _source(module: str | os.PathLike) -> Path:
    path = Path(module)
    if path.suffix == ".cu":
        if not path.exists():
            raise KernelError(f"no kernel source {path}")
        return path.resolve()
    return kernels.source(str(module))


def _deps(src: Path) -> list[Path]:
    return [src, *sorted(src.parent.glob("*.cuh")), *sorted(kernels.KERNEL_DIR.glob("*.cuh")),
            SIMT_DIR / "simt.h", SIMT_DIR / "simt_runtime.cpp"]


def _run(cmd: list[str], what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KernelError(f"simt {what} failed:\n{' '.join(cmd)}\n{proc.stderr[-8000:]}")
    return proc.stdout


def kernel_names(src: Path) -> list[str]:
    """The ``__global__`` kernels of ``src``, found by one preprocessor pass (macro-generated names too)."""
    text = _run([_cxx(), "-E", "-P", "-std=c++17", "-DCCOLL_SIMT", "-DSIMT_LIST_KERNELS", f"-I{SIMT_DIR}",
                 f"-I{src.parent}", f"-I{kernels.KERNEL_DIR}", "-include", "simt.h", "-x", "c++", str(src)],
                "preprocessing")
    names = re.findall(r"__simt_global__\s+void\s+(\w+)\s*\(", text)
    if re.search(r"extern\s+static", text):
        raise KernelError(f"{src.name}: `extern __shared__` arrays are not supported by simt (see simt.h)")
    return sorted(set(names))


def build(module: str | os.PathLike) -> Path:
    """Compile kernels/<module>.cu (or a .cu path) with the simt shim into build/simt/<stem>-<hash>.so,
    once per content of the sources (a file lock makes concurrent processes build once)."""
    src = _source(module)
    key = hashlib.sha256(repr((CXXFLAGS, _cxx())).encode())
    for dep in _deps(src):
        key.update(dep.name.encode() + b"\0" + dep.read_bytes())
    out = kernels.BUILD_DIR / "simt" / f"{src.stem}-{key.hexdigest()[:20]}.so"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{src.stem}.lock", "w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)
        if out.exists():
            return out
        names = kernel_names(src)
        if not names:
            raise KernelError(f"{src} has no __global__ kernel")
        wrapper = out.with_suffix(f".{os.getpid()}.cpp")
        wrapper.write_text(
            f'// generated by ccoll/simt.py from {src}\n#include "simt.h"\n#include "{src}"\n'
            f'#include "simt_runtime.cpp"\n' + "".join(f"SIMT_EXPORT({n})\n" for n in names))
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        try:
            _run([_cxx(), *CXXFLAGS, f"-I{SIMT_DIR}", f"-I{src.parent}", f"-I{kernels.KERNEL_DIR}", "-o", str(tmp),
                  str(wrapper)], f"build of {src.name}")
            os.replace(tmp, out)
        finally:
            wrapper.unlink(missing_ok=True)
            tmp.unlink(missing_ok=True)
    return out


class _Desc(ctypes.Structure):
    _fields_ = [("thunk", ctypes.c_void_p), ("nargs", ctypes.c_int), ("sizes", ctypes.POINTER(ctypes.c_int)),
                ("kinds", ctypes.c_char_p)]


class _Library:
    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        fn = self.lib.simt_launch
        fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint),
                       ctypes.POINTER(ctypes.c_uint), ctypes.c_ulonglong, ctypes.c_int, ctypes.c_ulonglong,
                       ctypes.c_ulonglong, ctypes.c_char_p, ctypes.c_ulonglong]
        fn.restype = ctypes.c_int
        self.kernels: dict[str, tuple[int, tuple[int, ...], str]] = {}

    def kernel(self, name: str) -> tuple[int, tuple[int, ...], str]:
        k = self.kernels.get(name)
        if k is None:
            try:
                getter = getattr(self.lib, f"simt_desc_{name}")
            except AttributeError:
                raise KernelError(f"no __global__ kernel {name!r} in this simt build") from None
            getter.restype = ctypes.POINTER(_Desc)
            desc = getter()
            d = desc.contents
            k = self.kernels[name] = (ctypes.addressof(d), tuple(d.sizes[i] for i in range(d.nargs)),
                                      d.kinds.decode())
        return k


@functools.lru_cache(maxsize=None)
def library(module: str) -> _Library:
    with _lock:
        return _Library(build(module))


# --------------------------------------------------------------------------------------------------
# arguments: numpy scalars (as the cupy backend passes them), tensors, None

_CTYPE = {("p", 8): ctypes.c_uint64, ("i", 8): ctypes.c_int64, ("u", 8): ctypes.c_uint64, ("i", 4): ctypes.c_int32,
          ("u", 4): ctypes.c_uint32, ("f", 4): ctypes.c_float, ("f", 8): ctypes.c_double, ("i", 2): ctypes.c_int16,
          ("u", 2): ctypes.c_uint16, ("i", 1): ctypes.c_int8, ("u", 1): ctypes.c_uint8}


def _marshal(kernel: str, args: tuple, sizes: tuple[int, ...], kinds: str) -> tuple[list, list[int]]:
    if len(args) != len(sizes):
        raise KernelError(f"{kernel} takes {len(sizes)} arguments, got {len(args)}")
    values, pointers = [], []
    for i, (a, size, kind) in enumerate(zip(args, sizes, kinds)):
        if a is None or isinstance(a, torch.Tensor):
            if kind != "p":
                raise KernelError(f"{kernel} argument {i}: a pointer given for a {size}-byte {kind!r} parameter")
            if isinstance(a, torch.Tensor) and a.device.type != "cpu":
                raise KernelError(f"{kernel} argument {i}: simt runs on CPU tensors, got one on {a.device}")
            addr = 0 if a is None else a.data_ptr()
            values.append(ctypes.c_uint64(addr))
            pointers.append(addr)
            continue
        if not isinstance(a, np.generic):
            raise KernelError(f"{kernel} argument {i}: pass numpy scalars as the cupy backend does (a typed "
                              f"{size}-byte value), got {type(a).__name__}")
        got = "f" if np.issubdtype(a.dtype, np.floating) else "i" if np.issubdtype(a.dtype, np.signedinteger) else "u"
        if a.dtype.itemsize != size or (kind == "f") != (got == "f"):
            raise KernelError(f"{kernel} argument {i}: a {a.dtype} given for a {size}-byte {kind!r} parameter")
        if kind == "p":
            pointers.append(int(a))
        values.append(_CTYPE[(kind if kind != "p" else "u", size)](a.item()))
    return values, pointers


def _dim3(v) -> tuple[int, int, int]:
    t = (int(v),) if np.isscalar(v) else tuple(int(x) for x in v)
    t = t + (1,) * (3 - len(t))
    if len(t) != 3 or min(t) < 1:
        raise KernelError(f"launch dimensions {v!r}: 1 to 3 positive ints")
    return t


def launch(module: str, kernel: str, grid, block, args: tuple, device=None, *, shared_bytes: int = 0,
           order: str = "forward", ctas: tuple[int, int] | None = None) -> None:
    """Run ``kernel`` of kernels/<module>.cu over ``grid`` x ``block`` CPU threads (see the module
    docstring). ``device`` is accepted for ccoll.kernels.launch's shape and must be a CPU device or None.
    ``ctas``: run only CTAs with linear index in [lo, hi) (sparse huge grids). Synchronous."""
    if device is not None and torch.device(device).type != "cpu":
        raise KernelError(f"the simt backend runs on the CPU, got device {device}")
    if order not in ORDERS:
        raise KernelError(f"order {order!r}; one of {', '.join(ORDERS)}")
    lib = library(str(module))
    desc, sizes, kinds = lib.kernel(kernel)
    values, pointers = _marshal(kernel, tuple(args), sizes, kinds)
    params = (ctypes.c_void_p * max(1, len(values)))(*(ctypes.addressof(v) for v in values))
    g, b = _dim3(grid), _dim3(block)
    lo, hi = (0, 1 << 64) if ctas is None else ctas
    err = ctypes.create_string_buffer(4096)
    with _lock:  # one launch at a time: the runtime's scheduler state is per library, signals per process
        status = lib.lib.simt_launch(desc, params, (ctypes.c_uint * 3)(*g), (ctypes.c_uint * 3)(*b),
                                     int(shared_bytes), ORDERS[order], int(lo), min(int(hi), (1 << 64) - 1), err,
                                     len(err))
    if status:
        raise KernelError(f"simt {module}:{kernel} <<<{g}, {b}>>>: {err.value.decode(errors='replace')}")
    _check_canaries(kernel, pointers)


# --------------------------------------------------------------------------------------------------
# guarded buffers: the end of the data against a PROT_NONE page, canary bytes in any gap

_PAGE = 4096
_SLACK_ALIGN = 64
_CANARY = 0xA5
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_PROT_NONE, _PROT_RW = 0, 3
_MAP_PRIVATE, _MAP_ANONYMOUS, _MAP_NORESERVE = 0x02, 0x20, 0x4000

#: live guarded buffers: data start -> (data end, guard page address)
_guarded: dict[int, tuple[int, int]] = {}


def _unmap(base: int, size: int, start: int) -> None:
    _guarded.pop(start, None)
    _libc.munmap(base, size)


def guarded_empty(numel: int, dtype: torch.dtype, misalign: int = 0, noreserve: bool = False) -> torch.Tensor:
    """A 1-D CPU tensor of ``numel`` x ``dtype`` whose data start is 64-byte aligned plus ``misalign`` bytes
    and whose end is followed by a PROT_NONE page, directly or after < 64 canary bytes (checked after every
    simt launch that is passed a pointer into it). ``noreserve``: MAP_NORESERVE, for sparse huge buffers
    (pages are only backed once touched). Contents are zero."""
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if not 0 <= misalign < _SLACK_ALIGN:
        raise KernelError(f"misalign {misalign}: 0..{_SLACK_ALIGN - 1}")
    data_pages = -(-(nbytes + 2 * _SLACK_ALIGN) // _PAGE)
    size = (data_pages + 1) * _PAGE
    flags = _MAP_PRIVATE | _MAP_ANONYMOUS | (_MAP_NORESERVE if noreserve else 0)
    base = _libc.mmap(None, size, _PROT_RW, flags, -1, 0)
    if base in (None, ctypes.c_void_p(-1).value):
        raise KernelError(f"mmap of {size} bytes failed (errno {ctypes.get_errno()})")
    guard = base + data_pages * _PAGE
    if _libc.mprotect(guard, _PAGE, _PROT_NONE) != 0:
        _libc.munmap(base, size)
        raise KernelError("mprotect of the guard page failed")
    start = ((guard - nbytes) & ~(_SLACK_ALIGN - 1)) + misalign
    if start + nbytes > guard:
        start -= _SLACK_ALIGN
    end = start + nbytes
    if guard > end:
        ctypes.memset(end, _CANARY, guard - end)
    raw = (ctypes.c_uint8 * max(1, nbytes)).from_address(start)
    weakref.finalize(raw, _unmap, base, size, start)
    _guarded[start] = (end, guard)
    t = torch.frombuffer(raw, dtype=torch.uint8)[:nbytes]
    return t.view(dtype)


def _check_canaries(kernel: str, pointers: list[int]) -> None:
    for p in pointers:
        for start, (end, guard) in list(_guarded.items()):
            if start <= p <= end and guard > end:
                gap = ctypes.string_at(end, guard - end)
                bad = [i for i, c in enumerate(gap) if c != _CANARY]
                if bad:
                    raise KernelError(f"simt {kernel}: out-of-bounds write at byte {bad[0]} past the end of the "
                                      f"{end - start}-byte buffer at 0x{start:x} (canary overwritten)")
