"""Loading kernels/*.cu: as CuPy RawModules on a GPU, or built for the host with nvcc ("emulated").

Why a host build: CI has no GPU, so the kernels' own per-block logic (``__host__ __device__`` functions)
is compiled for the CPU and checked byte for byte against libzfp and the torch backend. Each .cu file
exposes, under ``#ifdef CCOLL_HOST``, ``extern "C"`` host entry points named ``ccoll_host_<codec>_<op>_<dtype>``
that loop over blocks (OpenMP) calling exactly the functions the ``__global__`` kernels call.
"""
from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from .errors import KernelError

ROOT = Path(__file__).resolve().parent.parent
KERNEL_DIR = Path(os.environ.get("CCOLL_KERNEL_DIR", ROOT / "kernels"))
BUILD_DIR = Path(os.environ.get("CCOLL_BUILD_DIR", ROOT / "build"))
#: compute capabilities `make kernels-check` compiles for
CHECK_ARCHS = ("sm_80", "sm_90")

_lock = threading.Lock()


def kernel_names() -> list[str]:
    return sorted(p.stem for p in KERNEL_DIR.glob("*.cu"))


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
    return [source(name), *KERNEL_DIR.glob("*.cuh")]


def host_library_path(name: str) -> Path:
    return BUILD_DIR / "host" / f"libccoll_{name}.so"


def build_host(name: str) -> Path:
    """Build kernels/<name>.cu for the host if the .so is missing or older than its sources.
    A file lock makes concurrent ranks build once."""
    out = host_library_path(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    newest = max(p.stat().st_mtime for p in _deps(name))
    with open(out.parent / f".{name}.lock", "w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)
        if out.exists() and out.stat().st_mtime >= newest:
            return out
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        cmd = [
            _nvcc(), "-O3", "-std=c++17", "-DCCOLL_HOST", f"-I{KERNEL_DIR}",
            "-Xcompiler", "-fPIC,-O3,-fopenmp", "-shared", "-lgomp", "-o", str(tmp), str(source(name)),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise KernelError(f"host build of {name}.cu failed:\n{' '.join(cmd)}\n{proc.stderr}")
        os.replace(tmp, out)
    return out


@functools.lru_cache(maxsize=None)
def host_library(name: str) -> ctypes.CDLL:
    """The host build of kernels/<name>.cu, built on first use."""
    with _lock:
        return ctypes.CDLL(str(build_host(name)))


def check_compile(name: str, archs=CHECK_ARCHS) -> None:
    """Compile kernels/<name>.cu for each GPU arch (device code only) so type errors fail in CI."""
    for arch in archs:
        cmd = [_nvcc(), "-std=c++17", f"-arch={arch}", f"-I{KERNEL_DIR}", "-c", "-o", os.devnull, str(source(name))]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise KernelError(f"{name}.cu does not compile for {arch}:\n{proc.stderr}")


_modules: dict[str, object] = {}


def cupy_module(name: str):
    """kernels/<name>.cu compiled by NVRTC as a CuPy RawModule, compiled once per process (CuPy also
    caches the binary on disk). Imports cupy here, never at ccoll import time."""
    with _lock:
        mod = _modules.get(name)
        if mod is None:
            try:
                import cupy
            except ImportError as e:
                raise KernelError("the cupy backend needs CuPy: pip install 'ccoll[gpu]'") from e
            code = source(name).read_text()
            mod = cupy.RawModule(code=code, options=("-std=c++17", f"-I{KERNEL_DIR}"))
            _modules[name] = mod
        return mod


_functions: dict[tuple[str, str, int], object] = {}
_streams: dict[tuple[int, int], object] = {}


def launch(module: str, kernel: str, grid: int, block: int, args: tuple, device) -> None:
    """Launch ``kernel`` of kernels/<module>.cu with ``grid`` x ``block`` threads on torch's current
    stream of CUDA ``device``, without synchronising. ``args`` are numpy scalars (pointers as
    ``np.uint64`` device addresses of torch-owned memory). The one place that knows how kernels are
    loaded and launched: codecs call only this. Functions and stream wrappers are cached."""
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    fkey = (module, kernel, index)
    fn = _functions.get(fkey)
    if fn is None:
        import cupy

        with cupy.cuda.Device(index):
            fn = cupy_module(module).get_function(kernel)
        _functions[fkey] = fn
    ptr = torch.cuda.current_stream(index).cuda_stream
    stream = _streams.get((index, ptr))
    if stream is None:
        import cupy

        stream = _streams[(index, ptr)] = cupy.cuda.ExternalStream(ptr, index)
    import cupy

    with cupy.cuda.Device(index):
        fn((int(grid),), (int(block),), args, stream=stream)


def main(argv: list[str]) -> int:
    """`python -m ccoll.kernels build|check [names...]` (used by make kernels-host / kernels-check)."""
    if not argv or argv[0] not in ("build", "check"):
        print("usage: python -m ccoll.kernels build|check [name ...]", file=sys.stderr)
        return 2
    names = argv[1:] or kernel_names()
    for name in names:
        if argv[0] == "build":
            print(f"host build: {build_host(name)}")
        else:
            check_compile(name)
            print(f"{name}.cu compiles for {', '.join(CHECK_ARCHS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
