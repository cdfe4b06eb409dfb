"""The one launch point of kernels/*.cu for every codec: ``call(backend, family, fmt, op, dtype, device,
nthreads, *args)`` runs kernel ``ccoll_<fmt>_<op>_<suffix>`` of kernels/<family>.cu

- on the host build (backend "emulated": ``ccoll_host_<fmt>_<op>_<suffix>``, OpenMP over blocks), or
- on a GPU (backend "cupy": one launch of ``nthreads`` threads on torch's current stream).

A backend is an entry of ``LAUNCHERS`` (a function taking the resolved kernel and its arguments), so a new
one (e.g. running the ``__global__`` kernels on the CPU) is one more entry, not a change to any codec.

One table each for what used to be written per codec: ``SUFFIX`` (dtype -> kernel-name suffix),
``FAMILIES`` (formats, dtypes and launch geometry of each .cu file) and ``SIGNATURES`` (argument kinds of
every entry point, in the CUDA kernel's order; a kind prefixed with ``~`` is launch geometry that only
the CUDA kernel takes, its host twin does not). Argument kinds: ``p`` pointer (a tensor, None for NULL,
or an int address), ``q`` int64, ``Q`` uint64, ``i`` int32, ``u`` uint32.
"""
from __future__ import annotations

import contextlib
import ctypes
import re
import threading
from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import KernelError

#: dtype -> the suffix of kernel names (``ccoll_<fmt>_<op>_<suffix>``)
SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.float64: "f64"}


@dataclass(frozen=True)
class Family:
    """One kernels/<name>.cu: the formats and dtypes it has kernels for, and how a GPU launch is shaped."""

    formats: tuple[str, ...]
    ops: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    #: threads per CUDA block
    threads: int
    #: most blocks per launch (the kernels loop grid-stride beyond)
    max_grid: int


#: the rotate=hadamard quant kernels' q words per lane W, per format (kernels/quant.cu CqRotated,
#: CQ_GLOBALS_ROT): one kernel ``<op>_rot_w<W>`` per count, so a lane's block stays in registers. A lane holds
#: at most 32 values of a block of <= 1024: 8 words of the 8-bit formats, 4 of int4.
ROT_WORDS = {"int8": (1, 2, 4, 8), "int4": (1, 2, 4), "fp8e4m3": (1, 2, 4, 8), "fp8e5m2": (1, 2, 4, 8)}
_ROT_WORDS_ANY = tuple(sorted({w for words in ROT_WORDS.values() for w in words}))
_QUANT_OPS = ("encode_rows", "decode_rows", "decode_sum")
_ROT_OP = re.compile(r"\w+_rot_w(\d+)")  # a rotate op; in a kernel name, the host twin drops the "w<W>_"
_ROT_WORDS_NAME = re.compile(r"_rot_w\d+_")
#: threads per CUDA block of those kernels, in place of the family's 256: registers are allocated per warp
#: (sm_80 / sm_90: 64 Ki per SM), so at W = 4 and 8's 120..168 registers one 256-thread CTA (8 warps) fits
#: an SM and a second does not; 128-thread CTAs fit 3 (12 warps: 1.5x the loads in flight). W = 1, 2
#: (45..104 registers) fit as many warps either way, or a few more.
ROT_THREADS = 128

FAMILIES = {
    # the _rot_w<W> ops are the rotate=hadamard instantiations (kernels/quant.cu): the plain kernels carry no
    # rotation
    "quant": Family(("int8", "int4", "fp8e4m3", "fp8e5m2"),
                    _QUANT_OPS + tuple(f"{op}_rot_w{w}" for op in _QUANT_OPS for w in _ROT_WORDS_ANY),
                    (torch.float32, torch.bfloat16, torch.float16), 256, 1 << 20),
    "zfp": Family(("zfp",), ("encode_rows", "encode_tiles", "decode_rows", "decode_sum"),
                  (torch.float32, torch.bfloat16, torch.float16, torch.float64), 128, 2**31 - 1),
    "lossless": Family(("lossless",), ("range", "pack", "decode"),
                       (torch.float32, torch.bfloat16, torch.float16), 256, 1 << 20),
}

#: (family, op) -> argument kinds, in the CUDA kernel's order (see the module docstring)
SIGNATURES = {
    # src, numel, rows, row_numel, block, ~team, stochastic, seed, feedback, out
    ("quant", "encode_rows"): ("p", "q", "q", "q", "q", "~i", "i", "u", "p", "p"),
    # in, rows, row_numel, numel, block, out (one thread per 16-byte q group)
    ("quant", "decode_rows"): ("p", "q", "q", "q", "q", "p"),
    # in, rows, row_nbytes, numel, block, out (fp32; one thread per 16-byte q group)
    ("quant", "decode_sum"): ("p", "q", "q", "q", "q", "p"),
    # rotate=hadamard (per ROT_WORDS): the same, then the sign seed; the decodes run one team per block
    **{("quant", f"encode_rows_rot_w{w}"): ("p", "q", "q", "q", "q", "~i", "i", "u", "p", "p", "u")
       for w in _ROT_WORDS_ANY},
    # in, rows, row_numel, numel, block, out, ~team, rot_seed
    **{("quant", f"decode_rows_rot_w{w}"): ("p", "q", "q", "q", "q", "p", "~i", "u") for w in _ROT_WORDS_ANY},
    # in, rows, row_nbytes, numel, block, out (fp32), ~team, rot_seed
    **{("quant", f"decode_sum_rot_w{w}"): ("p", "q", "q", "q", "q", "p", "~i", "u") for w in _ROT_WORDS_ANY},
    # src, numel, row_numel, rows, dims, maxbits, row_words, feedback, out
    ("zfp", "encode_rows"): ("p", "Q", "Q", "i", "i", "i", "Q", "p", "p"),
    # the same arguments; one warp per 32 blocks, whole 32-bit output words (no zeroed output needed)
    ("zfp", "encode_tiles"): ("p", "Q", "Q", "i", "i", "i", "Q", "p", "p"),
    # in, row_words, rows, numel, row_numel, dims, maxbits, out
    ("zfp", "decode_rows"): ("p", "Q", "i", "Q", "Q", "i", "i", "p"),
    # in, row_words, rows, numel, dims, maxbits, out (fp32)
    ("zfp", "decode_sum"): ("p", "Q", "i", "Q", "i", "i", "p"),
    # src, numel, rows, row_numel, ranges
    ("lossless", "range"): ("p", "q", "q", "q", "p"),
    # src, numel, rows, row_numel, block, row_nbytes, out
    ("lossless", "pack"): ("p", "q", "q", "q", "q", "q", "p"),
    # in, rows, row_nbytes, row_numel, numel, block, out
    ("lossless", "decode"): ("p", "q", "q", "q", "q", "q", "p"),
}

_CTYPES = {"p": ctypes.c_void_p, "q": ctypes.c_longlong, "Q": ctypes.c_uint64, "i": ctypes.c_int,
           "u": ctypes.c_uint32}


def cuda_kernels(family: str) -> tuple[str, ...]:
    """Every CUDA kernel of kernels/<family>.cu the codecs launch (the NVRTC build check asserts each
    exists); () for an unknown family."""
    fam = FAMILIES.get(family)
    if fam is None:
        return ()
    return tuple(f"ccoll_{fmt}_{op}_{SUFFIX[d]}" for fmt in fam.formats for op in fam.ops if _exists(fmt, op)
                 for d in fam.dtypes)


def _exists(fmt: str, op: str) -> bool:
    """Whether format ``fmt`` has kernels for ``op`` (of its family's ops): all but the rotate=hadamard counts
    of words per lane that its blocks never need (``ROT_WORDS``)."""
    m = _ROT_OP.fullmatch(op)
    return m is None or int(m.group(1)) in ROT_WORDS[fmt]


@dataclass(frozen=True)
class Kernel:
    """A resolved entry point: what a launcher needs besides the arguments."""

    family: str
    name: str  # the CUDA kernel's name; the host twin is ccoll_host_<name minus "ccoll_">
    kinds: tuple[str, ...]
    threads: int
    max_grid: int

    @property
    def host_name(self) -> str:
        """The host build's twin: the same name, but one ``_rot_`` twin for every ``_rot_w<W>_`` kernel (the
        host's team of one holds a whole block: words per lane are a GPU launch's choice)."""
        return "ccoll_host_" + _ROT_WORDS_NAME.sub("_rot_", self.name[len("ccoll_"):])


def kernel(family: str, fmt: str, op: str, dtype: torch.dtype) -> Kernel:
    fam = FAMILIES[family]
    if fmt not in fam.formats or op not in fam.ops or not _exists(fmt, op) or dtype not in fam.dtypes:
        raise KernelError(f"kernels/{family}.cu has no kernel for format {fmt!r}, op {op!r}, dtype {dtype}")
    threads = ROT_THREADS if _ROT_OP.fullmatch(op) else fam.threads
    return Kernel(family, f"ccoll_{fmt}_{op}_{SUFFIX[dtype]}", SIGNATURES[(family, op)], threads, fam.max_grid)


def _address(a) -> int:
    if a is None:
        return 0
    return a.data_ptr() if isinstance(a, torch.Tensor) else int(a)


def host_function(k: Kernel):
    """The host build's twin of ``k`` with its ctypes signature set (device-only arguments left out)."""
    from . import host_library  # through the module: tests count and replace host libraries there

    fn = getattr(host_library(k.family), k.host_name)
    if fn.argtypes is None:
        fn.argtypes = [_CTYPES[kind] for kind in k.kinds if not kind.startswith("~")]
        fn.restype = None
    return fn


class _HostThreads(threading.local):
    """The OpenMP team size this thread last gave the host builds (``ccoll_host_quant_set_threads``), and per
    family whether the current one was given (a library without the setter is not asked again)."""

    n = 0

    def __init__(self) -> None:
        self.done: dict[str, int] = {}


_host_threads = _HostThreads()


def host_threads(n: int, family: str = "quant") -> None:
    """Run this thread's host-build calls on ``n`` OpenMP threads. Why: OpenMP's default is every core of the
    machine whatever the caller allows, so ranks that share a node (each told ``torch.set_num_threads(1)``,
    as ccoll's launchers and the tests do) would each start a team of all cores and oversubscribe them. The
    launch passes ``torch.get_num_threads()`` -- the caller's own budget of intra-op cores -- so the host
    build uses the cores the caller leaves to torch and no more. One call into ``family``'s library when it
    changes (the team size is per calling thread in OpenMP, hence thread-local here). kernels/quant.cu
    exports the setter; the other host builds link the same OpenMP runtime, so once it ran their calls from
    this thread follow it too."""
    state = _host_threads
    if state.done.get(family) != n:
        from . import host_library  # through the module: tests count and replace host libraries there

        setter = getattr(host_library(family), "ccoll_host_quant_set_threads", None)
        if setter is not None:
            setter.argtypes, setter.restype = [ctypes.c_int], None
            setter(n)
            state.n = n
        state.done[family] = n


def _launch_host(k: Kernel, device: torch.device, nthreads: int, args: tuple) -> None:
    host_threads(torch.get_num_threads(), k.family)
    host_function(k)(*(_address(a) if kind == "p" else int(a)
                       for kind, a in zip(k.kinds, args) if not kind.startswith("~")))


def _gpu_launch(k: Kernel, nthreads: int, args: tuple) -> tuple[int, int, tuple]:
    """(grid, block, typed arguments) of a ``__global__`` launch: the one geometry of the GPU and simt."""
    import numpy as np

    typed = {"p": np.uint64, "q": np.int64, "Q": np.uint64, "i": np.int32, "u": np.uint32}
    values = tuple(typed[kind.lstrip("~")](_address(a) if kind == "p" else int(a)) for kind, a in zip(k.kinds, args))
    return max(1, min(-(-nthreads // k.threads), k.max_grid)), k.threads, values


def _launch_cupy(k: Kernel, device: torch.device, nthreads: int, args: tuple) -> None:
    from . import launch  # through the module: tests replace it with a stand-in

    grid, block, values = _gpu_launch(k, nthreads, args)
    launch(k.family, k.name, grid, block, values, device)


class _SimtOptions(threading.local):
    cupy_on_simt = False  # this thread's "cupy" launches run on simt (cupy_on_simt())
    order = "forward"  # CTA/warp/lane order ccoll.simt runs threads in (tests run "reverse" too)
    ctas: tuple[int, int] | None = None  # only CTAs in [lo, hi) (sparse huge grids)
    record: list | None = None  # gets (family, kernel, grid, block) of each launch


simt_options = _SimtOptions()


@contextlib.contextmanager
def cupy_on_simt(order: str = "forward", ctas: tuple[int, int] | None = None, record: list | None = None):
    """Within the block, this thread's "cupy" launches run on ccoll.simt, so a codec's
    ``_encode_rows_cupy`` / ``_decode_rows_cupy`` / ``_decode_sum_cupy`` run on CPU tensors with exactly the
    grid, block and arguments they give CuPy (the ``backend="simt"`` codecs use it). Thread-local: other
    threads keep their backend. ``order`` / ``ctas``: as ``ccoll.simt.launch``; ``record``: a list that gets
    (family, kernel, grid, block) of each launch."""
    opts = simt_options
    saved = (opts.cupy_on_simt, opts.order, opts.ctas, opts.record)
    opts.cupy_on_simt, opts.order, opts.ctas, opts.record = True, order, ctas, record
    try:
        yield
    finally:
        opts.cupy_on_simt, opts.order, opts.ctas, opts.record = saved


def _launch_simt(k: Kernel, device: torch.device, nthreads: int, args: tuple) -> None:
    """The ``__global__`` kernels run on the CPU by ccoll.simt with exactly the GPU's launch (CI's check of
    the GPU path: the kernels' thread mapping and this module's geometry and argument order)."""
    from .. import simt

    grid, block, values = _gpu_launch(k, nthreads, args)
    opts = simt_options
    if opts.record is not None:
        opts.record.append((k.family, k.name, grid, block))
    simt.launch(k.family, k.name, grid, block, values, device, order=opts.order, ctas=opts.ctas)


#: backend -> launcher(kernel, device, nthreads, args); a new backend is a new entry
LAUNCHERS: dict[str, Callable[[Kernel, torch.device, int, tuple], None]] = {
    "emulated": _launch_host,
    "cupy": _launch_cupy,
    "simt": _launch_simt,
}


def call(backend: str, family: str, fmt: str, op: str, dtype: torch.dtype, device: torch.device,
         nthreads: int, *args) -> None:
    """Run ``ccoll_<fmt>_<op>_<SUFFIX[dtype]>`` of kernels/<family>.cu on ``backend`` over ``nthreads``
    GPU threads' worth of work (the host build loops over the same work itself); ``args`` in the CUDA
    kernel's order (``SIGNATURES``). Nothing is synchronised."""
    k = kernel(family, fmt, op, dtype)
    if len(args) != len(k.kinds):
        raise KernelError(f"{k.name} takes {len(k.kinds)} arguments ({' '.join(k.kinds)}), got {len(args)}")
    if backend == "cupy" and simt_options.cupy_on_simt:
        backend = "simt"
    try:
        launcher = LAUNCHERS[backend]
    except KeyError:
        raise KernelError(f"no kernel launcher for backend {backend!r}; available: {', '.join(LAUNCHERS)}") from None
    launcher(k, device, nthreads, args)
