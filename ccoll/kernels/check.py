"""The CI side of kernels/*.cu: ``python -m ccoll.kernels check|build [names...]`` (make kernels-check /
kernels-host). ``check`` compiles every source with nvcc for compute_90 (PTX and the host pass, with CuPy's
-ftz=true: ``FTZ_ALLOWED``) and with NVRTC exactly as the GPU path does (``nvrtc_options``; sm_80 and sm_90
cubins, what an A100 / H100 / H200 loads, with ptxas's resource report), and verifies that each build exports
every kernel its codec launches, flushes no subnormals, keeps ``PTX_FORBIDDEN`` out and stays within
``RESOURCE_LIMITS``; it prints registers and local memory per kernel.
``build`` makes the host libraries of the emulated backend.
The runtime (build, load, launch: ccoll/kernels/__init__.py) never imports this module."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import KernelError
from . import (
    CHECK_ARCHS, KERNEL_DIR, PTXAS_VERBOSE, NvrtcBuild, Resources, _nvcc, _write_atomically, build_host, cached_nvrtc,
    kernel_names, module_of, module_options, module_source, modules_of, normalised_options, nvcc_version, nvrtc,
    source,
)


@dataclass(frozen=True)
class ResourceLimit:
    """What each kernel of a source whose name matches ``kernels`` may use per thread: no local memory (a stack
    frame or spills: per-thread arrays that ptxas could not keep in registers, an L1/L2 round trip per access)
    and at most ``max_registers`` registers (64: four 256-thread CTAs resident per SM, 50% occupancy, enough
    warps in flight to stream at memory bandwidth; None: ptxas's own limit)."""

    kernels: str  # regular expression over kernel names
    max_registers: int | None

    def problems(self, name: str, r: Resources) -> list[str]:
        if not re.fullmatch(self.kernels, name):
            return []
        out = []
        if self.max_registers is not None and r.registers > self.max_registers:
            out.append(f"{name}: {r.registers} registers > {self.max_registers}")
        if r.local_bytes:
            out.append(f"{name}: local memory ({r.stack} bytes stack frame, {r.spill_stores} bytes spill stores, "
                       f"{r.spill_loads} bytes spill loads)")
        return out

    def __str__(self) -> str:
        regs = "" if self.max_registers is None else f"within {self.max_registers} registers and "
        return f"{self.kernels}: {regs}no local memory"


#: per source: the resource rules of its kernels. quant: the plain kernels are streaming kernels; the
#: rotate=hadamard ones (``_rot_w<W>_``) hold a lane's share of a block (up to 32 values) in registers,
#: as many as that takes (up to 168: encode, 8 words a lane), but never in local memory.
RESOURCE_LIMITS = {"quant": (ResourceLimit(r"(?!\w*_rot_)\w+", 64), ResourceLimit(r"\w+_rot_\w+", None))}


#: what nvcc compiles for: PTX only. NVRTC already builds every CHECK_ARCHS cubin (what a GPU loads, through
#: ptxas, with its resource report); nvcc adds its own front end, the host pass over the file (g++) and PTX
#: under CuPy's -ftz=true. A sm_90 cubin as well cost quant.cu ~25 s more of ptxas (~98 s vs ~73 s).
NVCC_TARGET = "compute_" + CHECK_ARCHS[-1].split("_")[1]

#: per source: the flushing instructions its PTX may hold when compiled with CuPy's -ftz=true (the nvcc pass
#: compiles with it; the GPU path's own NVRTC builds use -ftz=false and may hold none). quant: none, every fp32
#: operation is explicit non-flushing PTX, so even such a build matches the host build byte for byte. zfp: the
#: decode's fast-path multiplies scale * (float)q, taken only where scale and every nonzero product are normal
#: (so flushing cannot change them: tests/unit/test_zfp_rows.py runs the host build with FTZ/DAZ on); its
#: fixed-point code is integer code, its fp16 conversions explicit cvt without .ftz (kernels/common.cuh) and its
#: fp32 additions explicit add.rn.f32.
FTZ_ALLOWED = {"zfp": frozenset({"mul.ftz.f32"})}

#: per source: (kernels, PTX they must not contain, why). zfp's warp-cooperative tile encoder (issue 18 item
#: 4) assembles its output in registers and shared memory: no atomics and no stack arrays in any dtype.
PTX_FORBIDDEN = {"zfp": (r"ccoll_zfp_encode_tiles_\w+", r"\b(?:atom|red)\.[\w.]+|\.local\b",
                         "the tile encoder has no atomics and no stack arrays")}

_FLUSHING = re.compile(r"\b[a-z]+(?:\.\w+)*\.ftz(?:\.\w+)*")


def _nvcc_ptx(name: str, arch: str, compile: bool = True) -> str | None:
    """The PTX nvcc keeps for kernels/<name>.cu (``check_compile``'s options), cached under build/check/ by
    content (the source's and headers' bytes, the options, nvcc's version): only a compile that succeeded is
    cached, so a source is recompiled until it passes, and an unchanged one is never recompiled.
    ``compile=False``: None instead of compiling a miss."""
    import tempfile

    options = ["-std=c++17", f"-arch={arch}", f"-code={arch}", "-ftz=true", "-Werror", "all-warnings",
               f"-I{KERNEL_DIR}", "-c"]
    import hashlib

    key = hashlib.sha256(repr((nvcc_version(), normalised_options(options))).encode())
    for dep in (source(name), *sorted(KERNEL_DIR.glob("*.cuh"))):  # source(): tests point it at their own files
        key.update(dep.name.encode() + b"\0" + dep.read_bytes())
    from .. import kernels  # BUILD_DIR read at call time: whoever moves the cache moves it here too

    cached = kernels.BUILD_DIR / "check" / f"nvcc-{name}-{arch}-{key.hexdigest()[:20]}.ptx"
    try:
        return cached.read_text()
    except OSError:
        if not compile:
            return None
    with tempfile.TemporaryDirectory(prefix=f"ccoll-nvcc-{name}-") as keep:
        proc = subprocess.run([_nvcc(), *options, "--keep", "--keep-dir", keep, "-o", os.devnull, str(source(name))],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise KernelError(f"{name}.cu does not compile with nvcc for {arch}:\n{proc.stderr}")
        ptx = "".join(p.read_text() for p in sorted(Path(keep).glob("*.ptx")))
    if ".entry" not in ptx:
        raise KernelError(f"{name}.cu: nvcc --keep left no PTX with entry points in {keep}")
    _write_atomically(cached, ptx.encode())
    return ptx


def check_compile(name: str, arch: str = NVCC_TARGET, compile: bool = True) -> frozenset[str] | None:
    """Compile kernels/<name>.cu with nvcc for ``arch`` (device code to PTX, and the host pass; every warning an
    error, e.g. #128-D, an unreachable loop) so that what only nvcc rejects fails in CI too, with CuPy's
    -ftz=true so that the PTX it keeps shows which instructions such a build flushes (KernelError unless they
    are within ``FTZ_ALLOWED``); returns them. The PTX is cached by content (``_nvcc_ptx``); ``compile=False``:
    None where it is not cached."""
    ptx = _nvcc_ptx(name, arch, compile)
    if ptx is None:
        return None
    flushing = frozenset(_FLUSHING.findall(ptx))
    extra = flushing - FTZ_ALLOWED.get(name, frozenset())
    if extra:
        raise KernelError(f"{name}.cu compiled with -ftz=true (CuPy's flag) has flushing instructions beyond "
                          f"{sorted(FTZ_ALLOWED.get(name, ()))}: {', '.join(sorted(extra)[:8])}")
    return flushing


def verify_nvrtc_build(build: NvrtcBuild) -> None:
    """KernelError unless every kernel ccoll/codecs/<source>.py launches from this module is an entry point
    of the build, no instruction of its PTX flushes subnormals (``.ftz``) and, for a cubin with ptxas's
    resource report, every kernel keeps to the source's ``RESOURCE_LIMITS``."""
    src = module_source(build.name)
    entries = build.entries  # a scan of the whole PTX: once, not per launched kernel
    problems = [
        f"no entry point matches {pattern!r} (launched by ccoll.codecs.{src})"
        for pattern in launched_kernels(src, module=build.name)
        if not any(re.fullmatch(pattern, entry) for entry in entries)
    ]
    # a module built from part of a source holds only its own kernels (else the split saves no compile time)
    problems += [f"entry point {e} belongs to module {module_of(src, e)}" for e in sorted(entries)
                 if module_of(src, e) != build.name]
    ftz = sorted(set(_FLUSHING.findall(build.ptx)))
    if ftz:
        problems.append(f"flush-to-zero instructions in the PTX: {', '.join(ftz[:8])}")
    problems += forbidden_ptx(build)
    problems += resource_problems(build)
    if problems:
        raise KernelError(f"{build.name}.cu built by NVRTC for {build.arch}: " + "; ".join(problems)
                          + f"\nentries: {', '.join(sorted(build.entries))}")


def forbidden_ptx(build: NvrtcBuild) -> list[str]:
    """``PTX_FORBIDDEN`` of build.name found in the bodies of the kernels it names (a missing kernel is a
    problem too: the rule must not pass vacuously)."""
    rule = PTX_FORBIDDEN.get(module_source(build.name))
    if rule is None:
        return []
    kernels, forbidden, why = rule
    bodies = {n: b for n, b in re.findall(r"\.entry (\w+)\((.*?)\n\}", build.ptx, re.S) if re.fullmatch(kernels, n)}
    if not bodies:
        return [f"no entry point matches {kernels!r} ({why})"]
    return [f"{n}: {', '.join(sorted(set(found))[:4])} ({why})" for n, b in sorted(bodies.items())
            if (found := re.findall(forbidden, b))]


def resource_problems(build: NvrtcBuild) -> list[str]:
    """``RESOURCE_LIMITS`` of build.name broken by the build's kernels; for a verbose cubin build, a kernel
    missing from ptxas's report is a problem too (the rule must not pass vacuously)."""
    limits = RESOURCE_LIMITS.get(module_source(build.name))
    if limits is None or build.cubin is None or PTXAS_VERBOSE not in build.options:
        return []
    resources = build.resources
    problems = [f"{e}: not in ptxas's resource report" for e in sorted(build.entries) if e not in resources]
    for name in sorted(resources):
        for limit in limits:
            problems += limit.problems(name, resources[name])
    return problems


def resource_report(builds: list[NvrtcBuild]) -> str:
    """One line per kernel: registers / local memory bytes per thread for each build's arch ("" when no
    build has ptxas's report)."""
    builds = [b for b in builds if b.resources]
    if not builds:
        return ""
    names = sorted(set().union(*(b.resources for b in builds)))
    width = max(len(n) for n in names)
    head = " | ".join(f"{b.arch} registers / local bytes" for b in builds)
    module, src = builds[0].name, module_source(builds[0].name)
    label = f"{src}.cu" if module == src else f"{src}.cu (module {module})"
    lines = [f"{label} resources per thread ({head}):"]
    for n in names:
        cells = []
        for b in builds:
            r = b.resources.get(n)
            cells.append("-" if r is None else f"{r.registers:4d} / {r.local_bytes}")
        lines.append(f"  {n:<{width}}  " + " | ".join(cells))
    return "\n".join(lines)


def launched_kernels(name: str, module: str | None = None) -> list[str]:
    """Regular expressions (exact names, escaped), one per kernel that ccoll/codecs/<name>.py launches from
    kernels/<name>.cu: its ``CUDA_KERNELS`` tuple, else the kernel table of ccoll/kernels/call.py (every
    launch goes through it); [] for a name with no codec module. ``module``: only those loaded from that
    NVRTC module (``module_of``)."""
    import importlib

    try:
        codec = importlib.import_module(f"ccoll.codecs.{name}")
    except ImportError:
        return []
    names = getattr(codec, "CUDA_KERNELS", None)
    if names is None:
        from .call import cuda_kernels

        names = cuda_kernels(name)
    return [re.escape(n) for n in names if module is None or module_of(name, n) == module]


def _job(job: tuple[str, ...]):
    """One unit of ``check``, run in a worker process: ("nvcc", source) or (module, arch) for NVRTC; returns
    (its result, seconds)."""
    import time

    start = time.perf_counter()
    result = check_compile(job[1]) if job[0] == "nvcc" else cached_nvrtc(job[0], job[1], verbose=True)
    return result, time.perf_counter() - start


def check(names: list[str]) -> int:
    """Compile each source with nvcc (``check_compile``) and each of its NVRTC modules for every CHECK_ARCHS
    target exactly as the GPU path does (plus ptxas's resource report), verify each build
    (``verify_nvrtc_build``), print what was checked and the resource reports; 1 if any source failed (every
    failure printed), else 0.

    Every nvcc pass and every (module, arch) NVRTC build is its own job in a pool of one process per core
    (NVRTC compiles in one thread of a process at a time), nvcc passes first (quant.cu's is among the longest
    jobs, ~70 s). 2 cores: ~3m50s, ~400 s of CPU (make kernels-check prints each job's seconds); the suite's
    slowest test. Every job's output is cached by content (``cached_nvrtc``, ``_nvcc_ptx``): a rerun with
    unchanged sources compiles nothing and re-verifies the cached outputs in seconds."""
    import concurrent.futures
    import multiprocessing

    jobs = [("nvcc", n) for n in names] + [(m, a) for n in names for m in modules_of(n) for a in CHECK_ARCHS]
    futures = {}
    for job in jobs:  # cached outputs here, without a pool (its interpreters' start-up is most of a cached check)
        cached = check_compile(job[1], compile=False) if job[0] == "nvcc" else cached_nvrtc(*job, True, False)
        if cached is not None:
            futures[job] = concurrent.futures.Future()
            futures[job].set_result((cached, 0.0))
    missing = [job for job in jobs if job not in futures]
    workers = max(1, min(os.cpu_count() or 1, len(missing)))
    if missing:
        # spawn: the parent may hold libnvrtc (ctypes) and threads; a fresh interpreter per worker is ~1 s
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures.update({job: pool.submit(_job, job) for job in missing})
            concurrent.futures.wait(futures.values())
    status, seconds = 0, {}
    for name in names:
        try:
            flushing, seconds["nvcc", name] = futures["nvcc", name].result()
            builds = []
            for m in modules_of(name):
                for a in CHECK_ARCHS:
                    build, seconds[m, a] = futures[m, a].result()
                    builds.append(build)
            for build in builds:
                verify_nvrtc_build(build)
        except KernelError as e:
            print(f"FAILED {name}.cu: {e}")
            status = 1
            continue
        _report(name, flushing, builds)
    print(f"compile seconds ({workers} processes; {len(jobs) - len(missing)} of {len(jobs)} jobs cached): " + ", ".join(
        f"{' '.join(job)} {t:.0f}" for job, t in sorted(seconds.items(), key=lambda kv: -kv[1])))
    return status


def _report(name: str, flushing: frozenset[str], builds: list[NvrtcBuild]) -> None:
    for module in modules_of(name):
        report = resource_report([b for b in builds if b.name == module])
        if report:
            print(report)
    print(f"{name}.cu compiles with nvcc for {NVCC_TARGET}; with -ftz=true (CuPy's flag) its flushing "
          f"instructions are: {', '.join(sorted(flushing)) or 'none'}")
    target = "--gpu-architecture"  # the options printed are the module's, for every arch
    for module in modules_of(name):
        mb = [b for b in builds if b.name == module]
        print(f"{name}.cu {'' if module == name else f'(module {module}) '}compiles with NVRTC "
              f"{'.'.join(map(str, nvrtc().version))} for {', '.join(b.arch for b in mb)}: {len(mb[0].entries)} "
              f"entry points, every launched kernel present ({len(launched_kernels(name, module))} names/patterns), "
              f"no .ftz; options: {' '.join(o for o in module_options(module, mb[0].arch) if not o.startswith(target))}")
    limits = RESOURCE_LIMITS.get(name)
    if limits is not None:
        print(f"{name}.cu resources, for {', '.join(dict.fromkeys(b.arch for b in builds))}: "
              f"{'; '.join(map(str, limits))}")
    rule = PTX_FORBIDDEN.get(name)
    if rule is not None:
        print(f"{name}.cu PTX: no {rule[1]} in {rule[0]} ({rule[2]})")


def main(argv: list[str]) -> int:
    """`python -m ccoll.kernels build|check [names...]` (used by make kernels-host / kernels-check)."""
    if not argv or argv[0] not in ("build", "check"):
        print("usage: python -m ccoll.kernels build|check [name ...]", file=sys.stderr)
        return 2
    names = argv[1:] or kernel_names()
    if argv[0] == "build":
        for name in names:
            print(f"host build: {build_host(name)}")
        return 0
    return check(names)
