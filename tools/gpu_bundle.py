"""`make gpu-bundle`: build kernels/*.cu with NVRTC into cubins for sm_80 and sm_90 under build/gpu/, so a GPU
session loads them (``ccoll.kernels.bundle_path``) instead of spending its minutes compiling.

Each cubin is named ``<name>-<arch>-<bundle_key>.cubin``; the key hashes the sources and the options, so the
runtime never loads a stale one (it compiles with NVRTC instead, and the report says so). Each build is
verified as ``make kernels-check`` verifies it (every kernel the codecs launch is exported, no flush-to-zero),
so the kernel list comes from the codecs, never from here. ``build/gpu/manifest.json`` records what was built,
by which NVRTC, and the sizes. Older cubins in build/gpu/ are removed. Run it again after any kernels/ edit.
"""
from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def build_one(name: str, arch: str) -> dict:
    from ccoll import kernels
    from ccoll.kernels.check import verify_nvrtc_build

    path = kernels.bundle_path(name, arch)
    if not path.exists():
        build = kernels.compile_nvrtc(name, arch)
        verify_nvrtc_build(build)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(build.cubin)
        tmp.replace(path)
    return {"name": name, "arch": arch, "file": path.name, "bytes": path.stat().st_size}


def main(argv: list[str] | None = None) -> int:
    from ccoll import kernels

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default=",".join(kernels.CHECK_ARCHS), help="comma-separated sm_XY targets")
    ap.add_argument("--jobs", type=int, default=2, help="compiles at once (NVRTC releases the GIL)")
    args = ap.parse_args(argv)
    archs = [a for a in args.archs.split(",") if a]
    jobs = [(name, arch) for name in kernels.module_names() for arch in archs]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        built = list(pool.map(lambda job: build_one(*job), jobs))
    keep = {b["file"] for b in built}
    for old in kernels.bundle_dir().glob("*.cubin"):
        if old.name not in keep:
            old.unlink()
    manifest = {"nvrtc": ".".join(map(str, kernels.nvrtc().version)), "archs": archs, "cubins": built,
                "total_bytes": sum(b["bytes"] for b in built)}
    (kernels.bundle_dir() / "manifest.json").write_text(json.dumps(manifest, indent=1))
    for b in built:
        print(f"{b['file']:60s} {b['bytes']:>10d} B")
    print(f"# gpu-bundle: {len(built)} cubins, {manifest['total_bytes'] / 2**20:.1f} MiB in {kernels.bundle_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
