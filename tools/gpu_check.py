"""`make gpu-check`: on a CUDA machine, in one command (< 5 minutes), check the GPU kernels and time them.

1. Environment: uses the torch in this interpreter if it is a CUDA build; installs what is missing with
   pip (CuPy matching the CUDA major version -- cupy-cuda12x / cupy-cuda13x, from torch.version.cuda, else
   `nvcc --version`, else nvidia-smi; a CUDA torch; numpy / zfpy / pyyaml) and prints what it uses.
2. Bytes: for every deterministic codec spec (zfp at several rates, dims 1 and 2; int8/int4 at several
   blocks, nearest and seeded stochastic rounding; bf16; fp16; none) and every dtype the codec takes, on
   sizes with partial blocks: cupy-backend bytes == emulated-backend bytes (when nvcc can build the host
   library) == torch-backend bytes; decodes equal (NaN positions equal); decode_sum equal.
3. Throughput: GB/s of input (256 MiB of fp32 and of bf16), encode and decode, CUDA events after warm-up,
   next to the device's copy bandwidth (a device-to-device copy of the same input; "copy GB/s" counts the
   input bytes once, like the codec columns), so the fraction of roofline is visible.
Exit status: 0 all equal, 1 any mismatch, 2 no CUDA device / environment unusable.
"""
from __future__ import annotations

import argparse
import importlib
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NO_DEVICE = 2


def _run(cmd: list[str], timeout: float = 60) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _pip_install(*packages: str) -> bool:
    print(f"# pip install {' '.join(packages)}", flush=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *packages], timeout=900)
    importlib.invalidate_caches()
    return proc.returncode == 0


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
        return True
    except ImportError:
        return False


def _cuda_major(torch_mod) -> str | None:
    if torch_mod is not None and torch_mod.version.cuda:
        return torch_mod.version.cuda.split(".")[0]
    m = re.search(r"release (\d+)\.", _run(["nvcc", "--version"])) if shutil.which("nvcc") else None
    if m:
        return m.group(1)
    m = re.search(r"CUDA Version:\s*(\d+)\.", _run(["nvidia-smi"])) if shutil.which("nvidia-smi") else None
    return m.group(1) if m else None


def setup_environment():
    """Return (torch, cupy) ready for CUDA, or exit NO_DEVICE with the reason."""
    gpu_listed = bool(shutil.which("nvidia-smi")) and "GPU" in _run(["nvidia-smi", "-L"])
    torch_mod = importlib.import_module("torch") if _importable("torch") else None
    if torch_mod is not None and torch_mod.cuda.is_available():
        pass
    elif not gpu_listed:
        print("gpu-check: no CUDA device (torch.cuda.is_available() is False and nvidia-smi lists no GPU)")
        sys.exit(NO_DEVICE)
    else:  # a GPU, but no CUDA torch in this interpreter: PyPI's Linux torch wheel is a CUDA build
        version = torch_mod.__version__.split("+")[0] if torch_mod is not None else None
        pkg = f"torch=={version}" if version else "torch"
        print(f"# this interpreter's torch ({getattr(torch_mod, '__version__', 'none')}) has no CUDA; installing {pkg}")
        if not _pip_install("--force-reinstall", "--no-deps", pkg) and not _pip_install(pkg):
            print("gpu-check: could not install a CUDA build of torch; run with a Python that has one, e.g. "
                  "`make gpu-check PY=python3`")
            sys.exit(NO_DEVICE)
        print("# re-running with the new torch", flush=True)
        sys.exit(subprocess.call([sys.executable, *sys.argv]))
    for module, package in (("numpy", "numpy"), ("yaml", "pyyaml"), ("zfpy", "zfpy")):
        if not _importable(module) and not _pip_install(package):
            print(f"gpu-check: {package} is missing and could not be installed")
            sys.exit(NO_DEVICE)
    if not _importable("cupy"):
        major = _cuda_major(torch_mod)
        if major not in ("11", "12", "13"):
            print(f"gpu-check: cannot tell which CuPy to install (CUDA major version {major!r})")
            sys.exit(NO_DEVICE)
        if not _pip_install(f"cupy-cuda{major}x"):
            print(f"gpu-check: could not install cupy-cuda{major}x")
            sys.exit(NO_DEVICE)
    import cupy

    return torch_mod, cupy


# --------------------------------------------------------------------------------------------------
# byte checks

CHECK_SPECS = [
    *(f"zfp:rate={r}" for r in (2.125, 4, 8, 12.5, 16, 32)),
    *(f"zfp:rate={r},dims=2" for r in (0.53125, 1, 4, 8, 16, 32)),
    *(f"int8:block={b}" for b in (8, 24, 64, 256, 4096)),
    *(f"int4:block={b}" for b in (8, 24, 64, 256, 4096)),
    "int8:block=64,round=stochastic,seed=3",
    "int4:block=256,round=stochastic,seed=4",
    "bf16",
    "fp16",
    "none",
]
CHECK_SIZES = [1, 3, 5, 16, 255, 1023, 4099, (1 << 20) + 3]


def _data(torch, n: int, dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp(2 * torch.randn(n, generator=g))
    x[torch.rand(n, generator=g) < 0.05] = 0.0
    if n > 40:
        x[17:33] = 0.0  # whole zero blocks
    if dtype == torch.float16:
        x = x.clamp(-6e4, 6e4)
    return x.to(dtype)


def _same_values(torch, a, b) -> bool:
    a, b = a.cpu(), b.cpu()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    na, nb = torch.isnan(a), torch.isnan(b)
    return bool(torch.equal(na, nb)) and bool(torch.equal(a[~na], b[~nb]))


def check_bytes(torch, quick: bool) -> tuple[int, int]:
    import ccoll
    from ccoll.errors import CcollError

    try:
        from ccoll import kernels

        for name in kernels.kernel_names():
            kernels.host_library(name)
        emulated = True
    except (CcollError, OSError) as e:
        print(f"# note: no emulated backend here ({str(e).splitlines()[0]}); comparing cupy with torch only")
        emulated = False
    sizes = CHECK_SIZES[:-1] if quick else CHECK_SIZES
    checks = mismatches = 0
    t0 = time.perf_counter()
    for spec in CHECK_SPECS:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            codec_t = ccoll.get_codec(spec, backend="torch")
            if dtype not in codec_t.dtypes:
                continue
            codec_c = ccoll.get_codec(spec, backend="cupy")
            codec_e = ccoll.get_codec(spec, backend="emulated") if emulated else None
            bad = []
            for n in sizes:
                x = _data(torch, n, dtype, seed=n)
                try:
                    ref = codec_t.encode(x)
                except CcollError as e:
                    print(f"# skip {spec} {dtype} n={n}: {e}")
                    break
                got = codec_c.encode(x.cuda()).cpu()
                checks += 1
                if not torch.equal(got, ref):
                    bad.append(f"n={n}: cupy bytes != torch bytes ({int((got != ref).sum())} of {ref.numel()} differ)")
                if codec_e is not None and not torch.equal(codec_e.encode(x), ref):
                    bad.append(f"n={n}: emulated bytes != torch bytes")
                y_ref = codec_t.decode(ref, n, dtype)
                if not _same_values(torch, codec_c.decode(ref.cuda(), n, dtype), y_ref):
                    bad.append(f"n={n}: cupy decode != torch decode")
                if codec_e is not None and not _same_values(torch, codec_e.decode(ref, n, dtype), y_ref):
                    bad.append(f"n={n}: emulated decode != torch decode")
                rows = torch.stack([ref, codec_t.encode(_data(torch, n, dtype, seed=n + 1)), ref])
                s_ref = codec_t.decode_sum(rows, n, dtype)
                if not _same_values(torch, codec_c.decode_sum(rows.cuda(), n, dtype), s_ref):
                    bad.append(f"n={n}: cupy decode_sum != torch decode_sum")
            torch.cuda.synchronize()
            status = "OK" if not bad else "MISMATCH"
            print(f"{status:8s} {spec:42s} {str(dtype).replace('torch.', ''):9s} {len(sizes)} sizes", flush=True)
            for line in bad:
                print(f"         {line}")
            mismatches += len(bad)
    print(f"# {checks} encodes compared in {time.perf_counter() - t0:.1f} s, {mismatches} mismatches")
    return checks, mismatches


# --------------------------------------------------------------------------------------------------
# throughput

TP_SPECS = [
    "zfp:rate=8",
    "zfp:rate=8,dims=2",
    "int8:block=256",
    "int4:block=64",
    "int4:block=64,round=stochastic",
    "bf16",
    "fp16",
    "none",
]


def _gpu_seconds(torch, fn, iters: int) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def throughput(torch, nbytes: int, iters: int) -> None:
    import ccoll
    from ccoll.errors import CcollError

    print(f"\n### GPU throughput: GB/s of input ({nbytes >> 20} MiB), CUDA events, mean of {iters} after warm-up\n")
    print("| codec | dtype | encode GB/s | decode GB/s | encode / copy | decode / copy |")
    print("|---|---|---:|---:|---:|---:|")
    for dtype in (torch.float32, torch.bfloat16):
        numel = nbytes // torch.tensor([], dtype=dtype).element_size()
        x = torch.randn(numel, device="cuda").to(dtype)
        dst = torch.empty_like(x)
        copy_gbs = nbytes / _gpu_seconds(torch, lambda: dst.copy_(x), iters) / 1e9
        print(f"| device copy | {str(dtype).replace('torch.', '')} | {copy_gbs:.0f} | {copy_gbs:.0f} | 1.00 | 1.00 |")
        for spec in TP_SPECS:
            codec = ccoll.get_codec(spec, backend="cupy")
            if dtype not in codec.dtypes:
                continue
            try:
                payload = codec.encode(x)
            except CcollError as e:
                print(f"| {spec} | {dtype} | skipped: {e} | | | |")
                continue
            enc = nbytes / _gpu_seconds(torch, lambda: codec.encode(x), iters) / 1e9
            dec = nbytes / _gpu_seconds(torch, lambda: codec.decode(payload, numel, dtype), iters) / 1e9
            print(f"| {spec} | {str(dtype).replace('torch.', '')} | {enc:.0f} | {dec:.0f} | {enc / copy_gbs:.2f} | "
                  f"{dec / copy_gbs:.2f} |", flush=True)
        del x, dst
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the 2^20+3 size, 64 MiB throughput")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--skip-throughput", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    torch, cupy = setup_environment()
    props = torch.cuda.get_device_properties(0)
    print(f"# gpu-check: {props.name} ({props.total_memory >> 30} GiB, sm_{props.major}{props.minor}), "
          f"torch {torch.__version__} (CUDA {torch.version.cuda}), cupy {cupy.__version__}, python {sys.version.split()[0]}")
    _, mismatches = check_bytes(torch, args.quick)
    if not args.skip_throughput:
        throughput(torch, (64 if args.quick else 256) << 20, args.iters)
    print(f"\n# gpu-check {'FAILED' if mismatches else 'passed'} in {time.perf_counter() - t0:.0f} s")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
