"""``python -m ccoll info [--json]``: what ccoll finds on this machine, in one screen (as ``ds_report`` and
``torch.utils.collect_env`` do for their stacks).

Why: a pip-installed ccoll compiles its kernels where it runs and picks a codec backend by what is there
(CuPy and a GPU, nvcc, g++, NVRTC), and a rank that cannot find a policy or a compiler fails far from the cause.
This answers "what will ccoll do here, and if not, why" before a job is launched: where ccoll, its kernel
sources and its policies were found, where built kernels are cached and what is cached, the versions of torch
(CUDA, NCCL), CuPy, mpi4py and its MPI (CUDA-aware or not), zfpy, the compilers, whether each kernel
backend can run here, and the active policy (``CCOLL_POLICY``).

Each probe runs in its own try/except and reports its failure as text: this command never fails because a
dependency is missing or broken. CuPy, mpi4py and deepspeed are imported only by their own probes (importing
this module imports none of them); MPI is not initialised (mpi4py's ``rc.initialize = False``: its library
version and Open MPI's ``MPIX_Query_cuda_support`` may be asked before ``MPI_Init``).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

#: cache subdirectories of the build dir and what each holds (ccoll.kernels, ccoll.simt, make gpu-bundle)
CACHE_PARTS = {"host": "host libraries (emulated backend)", "nvrtc": "NVRTC images (cupy backend)",
               "simt": "simt libraries", "gpu": "carried cubin bundle (make gpu-bundle)"}


def _probe(fn: Callable[[], Any]) -> Any:
    """``fn()``, or ``{"error": "<type>: <message>"}`` when it raises: one broken probe never stops the report."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - every failure is what the report is for
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")}


def _version_of(module: str) -> str | None:
    """The installed distribution's version of an importable module, without importing it; None if absent."""
    if importlib.util.find_spec(module) is None:
        return None
    from importlib import metadata

    for dist in metadata.packages_distributions().get(module, [module]):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown version"


def _ccoll() -> dict:
    import ccoll
    from . import resources

    checkout = resources.source_checkout()
    return {"version": ccoll.__version__, "location": str(Path(ccoll.__file__).resolve().parent),
            "install": f"source checkout {checkout}" if checkout else "installed package",
            "python": sys.version.split()[0], "executable": sys.executable}


def _kernels() -> dict:
    from . import resources

    kdir = resources.kernel_dir()
    return {"dir": str(kdir), "source": "CCOLL_KERNEL_DIR" if os.environ.get("CCOLL_KERNEL_DIR") else "shipped",
            "exists": kdir.is_dir(), "sources": sorted(p.name for p in kdir.glob("*.cu")),
            "headers": sorted(p.name for p in kdir.glob("*.cuh")),
            "simt_shim": str(resources.shipped_kernel_dir() / "simt")}


def _policies() -> dict:
    from . import resources

    cdir = resources.config_dir()
    return {"dir": str(cdir), "exists": cdir.is_dir(), "shipped": list(resources.shipped_policies()),
            "clusters": sorted(p.stem for p in (cdir / "clusters").glob("*.yaml"))}


def _cache() -> dict:
    from . import resources

    bdir = resources.build_dir()
    source = ("CCOLL_BUILD_DIR" if os.environ.get("CCOLL_BUILD_DIR")
              else "checkout build/" if resources.source_checkout() else "user cache")
    out: dict = {"dir": str(bdir), "source": source, "exists": bdir.is_dir(), "cached": {}}
    for sub, what in CACHE_PARTS.items():
        files = [p for p in (bdir / sub).glob("*") if p.is_file() and not p.name.startswith(".")] \
            if (bdir / sub).is_dir() else []
        out["cached"][sub] = {"what": what, "files": len(files), "bytes": sum(p.stat().st_size for p in files),
                              "names": sorted(p.name for p in files)[:8]}
    return out


def _torch() -> dict:
    import torch

    out: dict = {"version": torch.__version__, "cuda_build": torch.version.cuda,
                 "cuda_available": torch.cuda.is_available()}
    if out["cuda_available"]:
        out["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        out["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    import torch.distributed as dist

    out["distributed"] = dist.is_available()
    out["backends"] = [b for b, ok in (("gloo", dist.is_available() and dist.is_gloo_available()),
                                       ("nccl", dist.is_available() and dist.is_nccl_available()),
                                       ("mpi", dist.is_available() and dist.is_mpi_available())) if ok]
    if "nccl" in out["backends"]:
        version = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    else:
        out["nccl"] = "not built into this torch"
    return out


def _cupy() -> dict:
    if importlib.util.find_spec("cupy") is None:
        return {"installed": False, "reason": "not installed (pip install 'ccoll[gpu]' on a CUDA machine)"}
    import cupy

    out: dict = {"installed": True, "version": cupy.__version__}
    try:
        out["gpus"] = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - no driver / no device: CuPy raises its own runtime errors
        out["gpus"] = 0
        out["reason"] = f"{type(e).__name__}: {e}"
    return out


def _mpi() -> dict:
    if importlib.util.find_spec("mpi4py") is None:
        return {"installed": False, "reason": "not installed (pip install 'ccoll[mpi]')"}
    import mpi4py

    out: dict = {"installed": True, "version": mpi4py.__version__}
    mpi4py.rc.initialize = False  # ask the library, never start MPI (a singleton init may need a launcher)
    mpi4py.rc.finalize = False
    from mpi4py import MPI

    out["library"] = MPI.Get_library_version().strip().splitlines()[0].strip()
    out["standard"] = ".".join(map(str, MPI.Get_version()))
    out["cuda_aware"] = _mpi_cuda_aware(out["library"])
    return out


def _mpi_cuda_aware(library: str) -> str:
    """Open MPI: ``MPIX_Query_cuda_support()`` from the libmpi mpi4py loaded (its CUDA extension; absent from a
    build without CUDA support); any other MPI: unknown (no portable query)."""
    if not library.startswith("Open MPI"):
        return "unknown (only Open MPI can be asked: MPIX_Query_cuda_support)"
    import ctypes

    libs = sorted({line.split()[-1] for line in open("/proc/self/maps") if "/libmpi.so" in line})
    if not libs:
        return "unknown (libmpi not found among the loaded libraries)"
    query = getattr(ctypes.CDLL(libs[0]), "MPIX_Query_cuda_support", None)
    if query is None:
        return f"no (MPIX_Query_cuda_support absent from {libs[0]}: built without CUDA support)"
    query.restype = ctypes.c_int
    return "yes (MPIX_Query_cuda_support() = 1)" if query() else "no (MPIX_Query_cuda_support() = 0)"


def _zfpy() -> dict:
    version = _version_of("zfpy")
    if version is None:
        return {"installed": False, "reason": "not installed: the zfp codec's torch backend needs it"}
    return {"installed": True, "version": version}


def _nvcc() -> dict:
    from .kernels import _nvcc

    path = _nvcc()
    proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    release = [line for line in proc.stdout.splitlines() if "release" in line]
    return {"path": path, "version": release[-1].split("release")[-1].strip() if release else proc.stdout.strip()}


def _nvrtc() -> dict:
    from . import kernels

    lib = kernels.nvrtc()
    return {"path": lib.path, "version": ".".join(map(str, lib.version)),
            "archs": [f"sm_{a}" for a in lib.archs]}


def _cxx() -> dict:
    from .simt import _cxx

    return {"path": _cxx()}


def _backends(report: dict) -> dict:
    """Per kernel backend: can it run here, and if not, why (from the probes above; nothing is compiled)."""
    from . import kernels

    def failed(key: str) -> str | None:
        value = report.get(key)
        return value["error"] if isinstance(value, dict) and "error" in value else None

    out = {"torch": {"ok": True, "why": "pure torch: always (CPU and CUDA tensors)"}}
    if failed("nvcc"):
        out["emulated"] = {"ok": False, "why": f"needs nvcc to build kernels/*.cu for the host: {failed('nvcc')}"}
    else:
        built = [n for n in _probe(kernels.kernel_names) if kernels.host_library_path(n).exists()] \
            if not failed("kernels") else []
        cpu_default = "; the CPU default of int8/int4 (auto)" if "quant" in built else ""
        out["emulated"] = {"ok": True, "why": f"nvcc found; host builds cached: {', '.join(built) or 'none yet'} "
                                              f"(built on first use){cpu_default}"}
    cupy = report.get("cupy", {})
    torch_info = report.get("torch", {})
    if not cupy.get("installed"):
        out["cupy"] = {"ok": False, "why": f"CuPy {cupy.get('reason') or cupy.get('error', 'not available')}"}
    elif not torch_info.get("cuda_available"):
        out["cupy"] = {"ok": False, "why": "no CUDA device visible to torch"}
    elif not cupy.get("gpus"):
        out["cupy"] = {"ok": False, "why": f"CuPy sees no GPU: {cupy.get('reason', '')}"}
    elif failed("nvrtc") and not report.get("cache", {}).get("cached", {}).get("gpu", {}).get("files"):
        out["cupy"] = {"ok": False, "why": f"no NVRTC to compile the kernels and no carried bundle: {failed('nvrtc')}"}
    else:
        out["cupy"] = {"ok": True, "why": "CuPy, a GPU, and NVRTC or a carried bundle"}
    if failed("cxx"):
        out["simt"] = {"ok": False, "why": f"needs a C++ compiler: {failed('cxx')}"}
    else:
        out["simt"] = {"ok": True, "why": f"g++ found ({report['cxx']['path']}): kernels run as C++ on the CPU"}
    return out


def _policy() -> dict | None:
    spec = os.environ.get("CCOLL_POLICY")
    if not spec:
        return None
    from .policy import Policy, find_policy

    path = find_policy(spec)
    policy = Policy.from_yaml(path)
    return {"spec": spec, "source": path, "fingerprint": policy.fingerprint()[:12],
            "describe": policy.describe().splitlines()}


#: report key -> probe, in the order printed
PROBES: dict[str, Callable[[], Any]] = {
    "ccoll": _ccoll, "kernels": _kernels, "policies": _policies, "cache": _cache, "torch": _torch,
    "cupy": _cupy, "mpi": _mpi, "zfpy": _zfpy, "nvcc": _nvcc, "nvrtc": _nvrtc, "cxx": _cxx,
}


def collect() -> dict:
    """The whole report as a JSON-able dict (``--json`` prints exactly this)."""
    report = {key: _probe(fn) for key, fn in PROBES.items()}
    report["backends"] = _probe(lambda: _backends(report))
    report["policy"] = _probe(_policy)
    return report


def _line(value: Any, keys: tuple[str, ...] = ()) -> str:
    if isinstance(value, dict) and "error" in value:
        return f"unavailable: {value['error']}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {value[k]}" for k in keys if k in value)
    return str(value)


def format_text(r: dict) -> str:
    """One screen of text from :func:`collect`'s report."""
    def get(key, *path, default="?"):
        v = r.get(key)
        for p in path:
            if not isinstance(v, dict) or p not in v:
                return default
            v = v[p]
        return v

    def err(key):
        v = r.get(key)
        return f"unavailable: {v['error']}" if isinstance(v, dict) and "error" in v else None

    lines = ["ccoll info", "-" * 72]
    where = "{} at {} ({})".format(get("ccoll", "version"), get("ccoll", "location"), get("ccoll", "install"))
    lines.append("ccoll        " + (err("ccoll") or where))
    lines.append(f"python       {get('ccoll', 'python')} {get('ccoll', 'executable')}")
    k = r.get("kernels", {})
    if err("kernels"):
        lines.append("kernels      " + err("kernels"))
    else:
        files = " ".join(k["sources"] + k["headers"]) or "NO SOURCES"
        lines.append(f"kernels      {k['dir']} ({k['source']}): {files}")
    p = r.get("policies", {})
    if err("policies"):
        lines.append("policies     " + err("policies"))
    else:
        lines.append(f"policies     {p['dir']}: {', '.join(p['shipped']) or 'NONE'}")
        lines.append(f"clusters     {', '.join(p['clusters']) or 'none'}")
    c = r.get("cache", {})
    if err("cache"):
        lines.append(f"build cache  {err('cache')}")
    else:
        parts = [f"{sub} {v['files']} files ({v['bytes'] / 2**20:.1f} MiB)" for sub, v in c["cached"].items() if v["files"]]
        lines.append(f"build cache  {c['dir']} ({c['source']}): {'; '.join(parts) or 'empty'}")
    t = r.get("torch", {})
    if err("torch"):
        lines.append(f"torch        {err('torch')}")
    else:
        cuda = f"CUDA available ({', '.join(t.get('devices', []))})" if t["cuda_available"] else "CUDA not available"
        lines.append(f"torch        {t['version']} (CUDA build {t['cuda_build']}); {cuda}; "
                     f"distributed: {', '.join(t['backends']) or 'none'}; NCCL {t['nccl']}")
    cp = r.get("cupy", {})
    lines.append("cupy         " + (err("cupy") or (f"{cp['version']}, GPUs visible: {cp.get('gpus')}"
                                                   + (f" ({cp['reason']})" if cp.get("reason") else "")
                                                   if cp.get("installed") else cp["reason"])))
    m = r.get("mpi", {})
    lines.append("mpi4py       " + (err("mpi") or (f"{m['version']}; {m['library'].split(', package:')[0]} (MPI "
                                                   f"{m['standard']}); CUDA-aware: "
                                                   f"{m['cuda_aware']}" if m.get("installed") else m["reason"])))
    z = r.get("zfpy", {})
    lines.append("zfpy         " + (err("zfpy") or (z["version"] if z.get("installed") else z["reason"])))
    lines.append("nvcc         " + (err("nvcc") or f"{get('nvcc', 'version')} ({get('nvcc', 'path')})"))
    n = r.get("nvrtc", {})
    lines.append("nvrtc        " + (err("nvrtc") or f"{n['version']} ({n['path']}); targets {n['archs'][0]}..{n['archs'][-1]}"))
    lines.append("c++          " + (err("cxx") or get("cxx", "path")))
    lines.append("backends")
    b = r.get("backends", {})
    if err("backends"):
        lines.append(f"  {err('backends')}")
    else:
        for name, v in b.items():
            lines.append(f"  {name:<9}  {'yes' if v['ok'] else 'NO '}  {v['why']}")
    pol = r.get("policy")
    if pol is None:
        lines.append("policy       CCOLL_POLICY not set (a shipped name, e.g. CCOLL_POLICY=hybrid, or a YAML path)")
    elif err("policy"):
        lines.append(f"policy       CCOLL_POLICY={os.environ.get('CCOLL_POLICY')}: {err('policy')}")
    else:
        lines.append(f"policy       CCOLL_POLICY={pol['spec']} -> {pol['source']} (fingerprint {pol['fingerprint']})")
        lines += [f"  {line}" for line in pol["describe"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ccoll info", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="the same report as JSON")
    args = ap.parse_args(argv)
    report = collect()
    print(json.dumps(report, indent=1, default=str) if args.json else format_text(report))
    return 0
