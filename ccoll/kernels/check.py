"""The CI side of kernels/*.cu: ``python -m ccoll.kernels check|build [names...]`` (make kernels-check /
kernels-host). ``check`` compiles every source with nvcc for sm_80 and sm_90 (device code) and with NVRTC
exactly as the GPU path does (``nvrtc_options``; sm_XY cubins, what an A100 / H100 / H200 loads, with ptxas's
resource report), and verifies that each build exports every kernel its codec launches, flushes no
subnormals and stays within ``RESOURCE_LIMITS``; it prints registers and local memory per kernel.
``build`` makes the host libraries of the emulated backend.
The runtime (build, load, launch: ccoll/kernels/__init__.py) never imports this module."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass

from ..errors import KernelError
from . import (
    CHECK_ARCHS, KERNEL_DIR, PTXAS_VERBOSE, NvrtcBuild, Resources, _nvcc, build_host, compile_nvrtc,
    kernel_names, module_of, module_options, module_source, modules_of, nvrtc, source,
)


@dataclass(frozen=True)
class ResourceLimit:
    """What every kernel of a source (but those matching ``exempt``) may use per thread: at most
    ``max_registers`` registers (64: four 256-thread CTAs resident per SM, 50% occupancy, enough warps in
    flight to stream at memory bandwidth) and no local memory (a stack frame or spills: per-thread arrays
    that ptxas could not keep in registers, an L1/L2 round trip per access)."""

    max_registers: int
    exempt: str  # regular expression over kernel names

    def problems(self, name: str, r: Resources) -> list[str]:
        if re.fullmatch(self.exempt, name):
            return []
        out = []
        if r.registers > self.max_registers:
            out.append(f"{name}: {r.registers} registers > {self.max_registers}")
        if r.local_bytes:
            out.append(f"{name}: local memory ({r.stack} bytes stack frame, {r.spill_stores} bytes spill stores, "
                       f"{r.spill_loads} bytes spill loads)")
        return out


#: per source: the resource rule of its kernels. quant: the plain kernels are streaming kernels; the
#: rotate=hadamard ones (``_rot_``) hold a whole block per team in registers and are exempt.
RESOURCE_LIMITS = {"quant": ResourceLimit(64, r"ccoll_\w+_rot_\w+")}


#: the arch nvcc compiles for: one is enough, as NVRTC already builds every CHECK_ARCHS target's device code
#: (what a GPU loads); nvcc adds its own front end and the host pass over the file. Both archs doubled the
#: slowest test of the suite (~100 s of CPU per arch for quant.cu).
NVCC_ARCHS = CHECK_ARCHS[-1:]


def check_compile(name: str, archs=NVCC_ARCHS) -> None:
    """Compile kernels/<name>.cu with nvcc for ``archs`` so that what only nvcc rejects fails in CI too."""
    procs = [(arch, subprocess.Popen([_nvcc(), "-std=c++17", f"-arch={arch}", f"-I{KERNEL_DIR}", "-c", "-o",
                                      os.devnull, str(source(name))], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True))
             for arch in archs]  # several archs (if given) compile at once: the suite's slowest test
    errors = []
    for arch, proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            errors.append(f"{name}.cu does not compile for {arch}:\n{err}")
    if errors:
        raise KernelError("\n".join(errors))


def check_nvrtc(name: str, archs=CHECK_ARCHS) -> list[NvrtcBuild]:
    """Compile each NVRTC module of kernels/<name>.cu (``modules_of``) with NVRTC for each sm_XY, exactly as
    the GPU path does on such a device (plus ptxas's resource report), and verify each build
    (``verify_nvrtc_build``)."""
    builds = [compile_nvrtc(module, arch, verbose=True) for module in modules_of(name) for arch in archs]
    for build in builds:
        verify_nvrtc_build(build)
    return builds


def verify_nvrtc_build(build: NvrtcBuild) -> None:
    """KernelError unless every kernel ccoll/codecs/<source>.py launches from this module is an entry point
    of the build, no instruction of its PTX flushes subnormals (``.ftz``) and, for a cubin with ptxas's
    resource report, every kernel keeps to the source's ``RESOURCE_LIMITS``."""
    src = module_source(build.name)
    problems = [
        f"no entry point matches {pattern!r} (launched by ccoll.codecs.{src})"
        for pattern in launched_kernels(src, module=build.name)
        if not any(re.fullmatch(pattern, entry) for entry in build.entries)
    ]
    # a module built from part of a source holds only its own kernels (else the split saves no compile time)
    problems += [f"entry point {e} belongs to module {module_of(src, e)}" for e in sorted(build.entries)
                 if module_of(src, e) != build.name]
    ftz = sorted(set(re.findall(r"\b[a-z]+(?:\.\w+)*\.ftz(?:\.\w+)*", build.ptx)))
    if ftz:
        problems.append(f"flush-to-zero instructions in the PTX: {', '.join(ftz[:8])}")
    problems += resource_problems(build)
    if problems:
        raise KernelError(f"{build.name}.cu built by NVRTC for {build.arch}: " + "; ".join(problems)
                          + f"\nentries: {', '.join(sorted(build.entries))}")


def resource_problems(build: NvrtcBuild) -> list[str]:
    """``RESOURCE_LIMITS`` of build.name broken by the build's kernels; for a verbose cubin build, a kernel
    missing from ptxas's report is a problem too (the rule must not pass vacuously)."""
    limit = RESOURCE_LIMITS.get(module_source(build.name))
    if limit is None or build.cubin is None or PTXAS_VERBOSE not in build.options:
        return []
    resources = build.resources
    problems = [f"{e}: not in ptxas's resource report" for e in sorted(build.entries) if e not in resources]
    for name in sorted(resources):
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


def _check_in_processes(names: list[str]) -> int:
    """One ``check NAME`` process per source, as many at once as there are cores: the check is the
    slowest test of the suite, and NVRTC compiles in one thread of a process at a time (2 cores: one
    process, sources one after the other ~6 min; threads 5m05s; processes 4m44s; and each source's nvcc
    archs at once beside its NVRTC builds 4m11s)."""
    pending = list(names)
    running: list[tuple[str, subprocess.Popen]] = []
    reports: dict[str, tuple[int, str]] = {}
    cmd = [sys.executable, "-m", "ccoll.kernels", "check"]
    while pending or running:
        while pending and len(running) < max(1, os.cpu_count() or 1):
            name = pending.pop(0)
            running.append((name, subprocess.Popen(cmd + [name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                   text=True)))
        name, proc = running.pop(0)
        out, _ = proc.communicate()
        reports[name] = (proc.returncode, out)
    status = 0
    for name in names:  # in the order asked, whatever order they finished in
        rc, out = reports[name]
        print(out, end="")
        status = status or rc
    return status


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
    if len(names) > 1:
        return _check_in_processes(names)
    import concurrent.futures

    name = names[0]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # nvcc's processes run while NVRTC compiles here
        nvcc = pool.submit(check_compile, name)
        builds = check_nvrtc(name)
        nvcc.result()
    for module in modules_of(name):
        report = resource_report([b for b in builds if b.name == module])
        if report:
            print(report)
    print(f"{name}.cu compiles with nvcc for {', '.join(NVCC_ARCHS)}")
    target = "--gpu-architecture"  # the options printed are the module's, for every arch
    for module in modules_of(name):
        mb = [b for b in builds if b.name == module]
        print(f"{name}.cu {'' if module == name else f'(module {module}) '}compiles with NVRTC "
              f"{'.'.join(map(str, nvrtc().version))} for {', '.join(b.arch for b in mb)}: {len(mb[0].entries)} "
              f"entry points, every launched kernel present ({len(launched_kernels(name, module))} names/patterns), "
              f"no .ftz; options: {' '.join(o for o in module_options(module, mb[0].arch) if not o.startswith(target))}")
    limit = RESOURCE_LIMITS.get(name)
    if limit is not None:
        print(f"{name}.cu resources: every kernel but {limit.exempt} within {limit.max_registers} registers and no "
              f"local memory, for {', '.join(dict.fromkeys(b.arch for b in builds))}")
    return 0
