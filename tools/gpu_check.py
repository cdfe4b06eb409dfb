"""`make gpu-check`: on a CUDA machine, in one command (< 5 minutes), check the GPU path and time it.

Runs with the interpreter it is started with (``make gpu-check PYTHON=python3``): it never installs
anything and never builds a venv, because GPU machines usually have no network. What it needs there:
torch with CUDA, CuPy (cupy-cuda13x / cupy-cuda12x), numpy; optional: zfpy (libzfp comparisons, else
skipped with a line), nvcc + g++ (the emulated host build, else skipped with a line), mpi4py is not used.

1. Bytes: for every deterministic codec spec (zfp rates, dims 1 and 2; int8/int4 blocks, nearest and seeded
   stochastic; fp8 e4m3/e5m2; rotate=hadamard; bf16; fp16; none), every dtype it takes (fp64 included) and inputs that are normal,
   subnormal, non-finite, and misaligned views, the "device" backend (cupy on CUDA tensors) is compared
   with each reference backend (torch; emulated, when the host build exists): encode bytes, decode
   values, decode_sum, and the batched API (encode_rows without and with error feedback -- payload and
   residuals --, decode_rows).
2. Throughput: encode / decode / decode_sum GB/s of input at 256 MiB of fp32 and of bf16, CUDA events
   after warm-up, beside the device's measured copy bandwidth (input bytes counted once, as in the codec
   columns).
3. The simulated world (``ccoll.testing.simulated_world``, if present): compressed all_reduce time per
   element at p = 8, 64, 256 on one GPU.
4. Two gloo processes all_reduce CUDA tensors; the result bytes must equal the same run on CPU tensors.

One JSON report (``--report``, default results/gpu_check.json) and a summary table on stdout.
Exit status: 0 all equal, 1 any mismatch or failed check, 2 no CUDA device / CuPy missing.

``--cpu-selftest`` runs the same comparison matrix, gloo check and report on CPU tensors, with the
emulated backend in the device column, so CI executes the code that runs on the GPU.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EXIT_OK, EXIT_MISMATCH, EXIT_NO_DEVICE = 0, 1, 2

def _registry_specs() -> list[str]:
    """Every registered codec's example specs (Codec.example_specs): a new codec enters every check here."""
    from ccoll.codecs import example_specs

    return example_specs()


#: the registry's examples, plus the kernel-geometry cases this check adds: block sizes that make GPU teams
#: of 1 to 32 lanes holding 1 to 8 words each, partial blocks, rates near the minimum, non-default seeds
GEOMETRY_SPECS = [
    *(f"zfp:rate={r}" for r in (2.875, 4, 8, 12.5, 16, 32)),
    *(f"zfp:rate={r},dims=2" for r in (0.71875, 1, 4, 8, 16, 32)),
    *(f"int8:block={b}" for b in (8, 24, 64, 256, 4096)),
    *(f"int4:block={b}" for b in (8, 24, 64, 256, 4096)),
    "int8:block=64,round=stochastic,seed=3",
    "int4:block=256,round=stochastic,seed=4",
    *(f"fp8:format=e4m3,block={b}" for b in (8, 24, 32, 4096)),
    *(f"fp8:format=e5m2,block={b}" for b in (32, 4096)),
    *(f"int8:block={b},rotate=hadamard,rotate_seed=3" for b in (8, 1024)),
    *(f"int4:block={b},rotate=hadamard,rotate_seed=3" for b in (8, 32, 1024)),
    *(f"fp8:block={b},rotate=hadamard,rotate_seed=3" for b in (32, 1024)),
    "int4:block=64,round=stochastic,seed=4,rotate=hadamard",
    "lossless:block=32",
]


def check_specs() -> list[str]:
    """The byte-comparison matrix's specs: the registry's examples, then the geometry cases."""
    return list(dict.fromkeys([*_registry_specs(), *GEOMETRY_SPECS]))


#: the spec lists read the codec registry, which imports torch: computed on first use (this module
#: imports neither torch nor ccoll at import time, so a machine without them gets a clear exit)
_LAZY_SPECS = {"CHECK_SPECS": check_specs, "TP_SPECS": _registry_specs, "GLOO_SPECS": lambda: tuple(_registry_specs())}


def __getattr__(name: str):
    if name in _LAZY_SPECS:
        return _LAZY_SPECS[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
INPUTS = ("normal", "subnormal", "nonfinite", "misaligned")
SIZES = (1, 5, 255, 4099, (1 << 20) + 3)
QUICK_SIZES = (1, 5, 255, 4099)
#: the special inputs use two sizes: a partial block and many blocks with a partial tail
SPECIAL_SIZES = (5, 4099)
ROWS = 3  # rows of the batched checks (the last one partly padding)
FEEDBACK_SALT = 0x5EED_0001_2345


def _dtypes(torch):
    return (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


# --------------------------------------------------------------------------------------------------
# inputs


def make_input(torch, kind: str, n: int, dtype, seed: int):
    """A CPU tensor of ``n`` values of ``dtype``. ``subnormal`` spans the dtype's smallest normals and its
    subnormals (zfp's tiny-block threshold 2^-98 and int8's absmax/127 underflow included for fp32/bf16);
    ``nonfinite`` holds NaN and +-Inf; ``misaligned`` is a view one element past an aligned start."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * torch.exp(2 * torch.randn(n, generator=g, dtype=torch.float64))
    x[torch.rand(n, generator=g) < 0.05] = 0.0
    if n > 40:
        x[17:33] = 0.0  # whole zero blocks
    info = torch.finfo(dtype)
    if kind == "subnormal":
        # per 16-value run, an exponent from ~30 binades above the smallest normal down past the smallest
        # subnormal (fp32: 2^-96 .. 2^-150, covering zfp's tiny-block threshold and int8's scale underflow)
        runs = -(-n // 16)
        min_exp = int(torch.log2(torch.tensor(info.tiny, dtype=torch.float64)))  # -126, -1022, -14
        digits = {torch.float32: 24, torch.bfloat16: 8, torch.float16: 11, torch.float64: 53}[dtype]
        span = 10 if dtype == torch.float16 else 30
        shift = torch.randint(min_exp - digits, min_exp + span, (runs,), generator=g).repeat_interleave(16)[:n]
        x = torch.randn(n, generator=g, dtype=torch.float64) * torch.pow(2.0, shift.to(torch.float64))
    elif kind == "nonfinite":
        for i, v in zip(range(3, n, 37), (float("nan"), float("inf"), float("-inf")) * n):
            x[i] = v
    if dtype == torch.float16:
        x = x.clamp(-6e4, 6e4)
    x = x.to(dtype)
    if kind == "misaligned":
        base = torch.zeros(n + 1, dtype=dtype)
        base[1:] = x
        x = base[1:]
    return x


def same_values(torch, a, b) -> bool:
    """Equal dtype, shape and values, NaN at the same places (NaN payload bits may differ)."""
    a, b = a.cpu(), b.cpu()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    na, nb = torch.isnan(a), torch.isnan(b)
    return bool(torch.equal(na, nb)) and bool(torch.equal(a[~na], b[~nb]))


# --------------------------------------------------------------------------------------------------
# the comparison matrix


@dataclass
class Matrix:
    """What was compared, what differed, what was skipped (and why)."""

    compared: int = 0
    groups: list = field(default_factory=list)
    mismatches: list = field(default_factory=list)
    skipped: list = field(default_factory=list)


def _row_numel(codec, n: int) -> int:
    """Rows of whole codec blocks such that ROWS of them cover n (the last row partly padding)."""
    per_row = -(-n // ROWS)
    return -(-per_row // codec.align_numel) * codec.align_numel


def compare_one(torch, spec: str, dtype, kind: str, n: int, device_backend: str, refs: dict, device) -> tuple[int, list]:
    """All comparisons of one (spec, dtype, input, size): the device backend on ``device`` against each
    reference backend on the CPU. Returns (comparisons made, mismatch descriptions)."""
    import ccoll

    dev = ccoll.get_codec(spec, backend=device_backend)
    x = make_input(torch, kind, n, dtype, seed=n)
    xd = x.to(device) if device.type != "cpu" else x
    if kind == "misaligned" and device.type != "cpu":  # keep the device copy misaligned too
        base = torch.zeros(n + 1, dtype=dtype, device=device)
        base[1:] = xd
        xd = base[1:]
    others = [make_input(torch, kind, n, dtype, seed=n + 1 + i) for i in range(2)]
    made, bad = 0, []

    def check(ok: bool, what: str) -> None:
        nonlocal made
        made += 1
        if not ok:
            bad.append(what)

    got = dev.encode(xd).cpu()
    row_numel = _row_numel(dev, n)
    nbytes_row = dev.encoded_nbytes(row_numel, dtype)
    src = x.contiguous()
    fb_dtype = dev.feedback_dtype(dtype)
    fb0 = (torch.randn(ROWS * row_numel, generator=torch.Generator().manual_seed(n), dtype=torch.float64) * 1e-3).to(fb_dtype)
    fb0[n:] = 0
    for name, ref in refs.items():
        pair = f"{device_backend} vs {name}"
        want = ref.encode(x)
        check(torch.equal(got, want), f"{pair}: encode bytes differ ({int((got != want).sum())} of {want.numel()})")
        want_dec = ref.decode(want, n, dtype)
        check(same_values(torch, dev.decode(want.to(device), n, dtype), want_dec), f"{pair}: decode differs")
        rows = torch.stack([want, *(ref.encode(o) for o in others)])
        check(same_values(torch, dev.decode_sum(rows.to(device), n, dtype), ref.decode_sum(rows, n, dtype)),
              f"{pair}: decode_sum differs")
        # batched API
        out_d = torch.empty(ROWS, nbytes_row, dtype=torch.uint8, device=device)
        out_r = torch.empty(ROWS, nbytes_row, dtype=torch.uint8)
        dev.encode_rows(xd.contiguous(), out_d, row_numel, salt=FEEDBACK_SALT)  # misaligned stays so
        ref.encode_rows(src, out_r, row_numel, salt=FEEDBACK_SALT)
        check(torch.equal(out_d.cpu(), out_r), f"{pair}: encode_rows bytes differ")
        fb_d, fb_r = fb0.to(device), fb0.clone()
        dev.encode_rows(xd.contiguous(), out_d, row_numel, feedback=fb_d, salt=FEEDBACK_SALT)
        ref.encode_rows(src, out_r, row_numel, feedback=fb_r, salt=FEEDBACK_SALT)
        check(torch.equal(out_d.cpu(), out_r), f"{pair}: encode_rows(feedback) bytes differ")
        check(same_values(torch, fb_d, fb_r), f"{pair}: encode_rows(feedback) residuals differ")
        back_d = torch.empty(n, dtype=dtype, device=device)
        back_r = torch.empty(n, dtype=dtype)
        dev.decode_rows(out_r.to(device), back_d, row_numel)
        ref.decode_rows(out_r, back_r, row_numel)
        check(same_values(torch, back_d, back_r), f"{pair}: decode_rows differs")
    return made, bad


def run_matrix(torch, device_backend: str, device, refs_for, sizes, specs=None, inputs=INPUTS,
               log=print) -> Matrix:
    """The comparison matrix. ``refs_for(spec)`` gives {name: CPU reference codec} for a spec and may omit
    references it cannot run (the reason goes in the report's skipped list through the codec factory)."""
    import ccoll
    from ccoll.errors import CcollError, KernelError

    m = Matrix()
    for spec in check_specs() if specs is None else specs:
        probe = ccoll.get_codec(spec, backend="torch")
        refs = refs_for(spec)
        if not refs:
            continue
        for dtype in _dtypes(torch):
            if dtype not in probe.dtypes:
                continue
            group = {"spec": spec, "dtype": _dtype_name(dtype), "references": sorted(refs), "inputs": list(inputs),
                     "sizes": {"normal": list(sizes), "other inputs": list(SPECIAL_SIZES)}, "compared": 0,
                     "mismatches": []}
            for kind in inputs:
                for n in sizes if kind == "normal" else SPECIAL_SIZES:
                    try:
                        made, bad = compare_one(torch, spec, dtype, kind, n, device_backend, refs, device)
                    except KernelError as e:  # the device build or launch failed: a finding, not a skip
                        group["compared"] += 1
                        group["mismatches"].append(f"{kind} n={n}: {type(e).__name__}: {str(e)[:300]}")
                        break
                    except CcollError as e:  # e.g. a rate below float64's minimum: refused everywhere
                        m.skipped.append(f"{spec} {_dtype_name(dtype)}: {str(e).splitlines()[0]}")
                        break
                    group["compared"] += made
                    group["mismatches"] += [f"{kind} n={n}: {b}" for b in bad]
                else:
                    continue
                break
            if group["compared"]:
                m.groups.append(group)
                m.compared += group["compared"]
                m.mismatches += [f"{spec} {group['dtype']} {b}" for b in group["mismatches"]]
                status = "OK" if not group["mismatches"] else "MISMATCH"
                log(f"{status:8s} {spec:38s} {group['dtype']:9s} {group['compared']:4d} comparisons vs "
                    f"{', '.join(group['references'])}")
                for b in group["mismatches"][:6]:
                    log(f"         {b}")
    return m


def reference_factory(torch, emulated: bool, zfpy: bool, skipped: list):
    """refs_for(spec): the CPU references that can run here; notes each one left out once in ``skipped``."""
    import ccoll

    noted = set()

    def note(line: str) -> None:
        if line not in noted:
            noted.add(line)
            skipped.append(line)
            print(f"# skip: {line}")

    def refs_for(spec: str) -> dict:
        refs = {}
        if spec.startswith("zfp") and not zfpy:
            note("libzfp comparisons (zfp vs its torch backend): zfpy is not importable here (carry a zfpy wheel)")
        else:
            refs["torch"] = ccoll.get_codec(spec, backend="torch")
        if emulated:
            refs["emulated"] = ccoll.get_codec(spec, backend="emulated")
        return refs

    return refs_for


def zfpy_usable() -> bool:
    """Whether libzfp's Python binding imports here (a carried wheel may not match this numpy)."""
    try:
        import zfpy  # noqa: F401
    except Exception:  # ImportError, or a binary built against another numpy
        return False
    return True


def emulated_available(skipped: list) -> bool:
    """Whether the host build of kernels/*.cu exists or can be built here (nvcc and g++)."""
    from ccoll import kernels
    from ccoll.errors import CcollError

    if not all(kernels.host_library_path(n).exists() for n in kernels.kernel_names()):
        missing = [tool for tool in ("nvcc", "g++") if shutil.which(tool) is None
                   and not (tool == "nvcc" and os.path.exists("/usr/local/cuda/bin/nvcc"))]
        if missing:
            line = f"emulated backend: {' and '.join(missing)} not found, so no host build of kernels/*.cu"
            skipped.append(line)
            print(f"# skip: {line}")
            return False
    try:
        for name in kernels.kernel_names():
            kernels.host_library(name)
        return True
    except (CcollError, OSError) as e:
        line = f"emulated backend: host build failed: {str(e).splitlines()[0]}"
        skipped.append(line)
        print(f"# skip: {line}")
        return False


# --------------------------------------------------------------------------------------------------
# throughput (CUDA only)

TP_ROWS = 4  # decode_sum rows


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


def throughput(torch, nbytes: int, iters: int) -> list[dict]:
    """GB/s of input bytes: encode reads nbytes, decode writes nbytes, decode_sum decodes TP_ROWS payloads
    of nbytes each (counted TP_ROWS * nbytes). ``of_copy``: the fraction of the measured copy bandwidth."""
    import ccoll
    from ccoll.errors import CcollError

    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        numel = nbytes // torch.tensor([], dtype=dtype).element_size()
        x = torch.randn(numel, device="cuda").to(dtype)
        dst = torch.empty_like(x)
        copy = nbytes / _gpu_seconds(torch, lambda: dst.copy_(x), iters) / 1e9
        rows.append({"codec": "device copy", "dtype": _dtype_name(dtype), "encode_GBps": copy, "decode_GBps": copy,
                     "decode_sum_GBps": copy, "copy_GBps": copy})
        del dst
        for spec in _registry_specs():
            codec = ccoll.get_codec(spec, backend="cupy")
            if dtype not in codec.dtypes:
                continue
            try:
                payload = codec.encode(x)
            except CcollError as e:
                rows.append({"codec": spec, "dtype": _dtype_name(dtype), "skipped": str(e)})
                continue
            payloads = payload.unsqueeze(0).expand(TP_ROWS, -1).contiguous()
            acc = torch.empty(numel, dtype=torch.float32, device="cuda")
            enc = nbytes / _gpu_seconds(torch, lambda: codec.encode(x), iters) / 1e9
            dec = nbytes / _gpu_seconds(torch, lambda: codec.decode(payload, numel, dtype), iters) / 1e9
            dsum = TP_ROWS * nbytes / _gpu_seconds(torch, lambda: codec.decode_sum(payloads, numel, dtype, out=acc), iters) / 1e9
            rows.append({"codec": spec, "dtype": _dtype_name(dtype), "encode_GBps": enc, "decode_GBps": dec,
                         "decode_sum_GBps": dsum, "copy_GBps": copy})
            del payload, payloads, acc
        del x
        torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------------------------------
# simulated world and gloo

SIM_CODEC = "int8:block=256"
SIM_NUMEL_PER_RANK = 1 << 20


def simulated_world_times(torch, device, world_sizes=(8, 64, 256), numel=SIM_NUMEL_PER_RANK, codec=SIM_CODEC) -> dict:
    """Compressed all_reduce wall time per element of the per-rank tensor at each world size (all p ranks of
    one call, as threads of this process on ``device``), via ccoll.testing.simulated_world."""
    try:
        from ccoll.testing import simulated_world
    except ImportError as e:
        return {"status": "not available", "reason": f"ccoll.testing.simulated_world: {e}"}
    out = {"status": "measured", "codec": codec, "numel_per_rank": numel, "ns_per_element": {}}
    import ccoll

    for p in world_sizes:
        xs = [torch.full((numel,), float(r + 1), device=device) for r in range(p)]  # allocated outside the timing

        def fn(rank, group):
            ccoll.all_reduce(xs[rank], group=group, codec=codec)

        try:
            simulated_world(p, fn, device=device)  # warm-up: kernels built, buffers allocated
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            simulated_world(p, fn, device=device)
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            out["ns_per_element"][str(p)] = seconds / numel * 1e9
        except Exception as e:  # report, do not hide: a failure here is a finding
            out["ns_per_element"][str(p)] = None
            out.setdefault("errors", {})[str(p)] = f"{type(e).__name__}: {e}"
        del xs
    return out


GLOO_NUMEL = 100_003


def gloo_rank(rank: int, world_size: int, device_type: str) -> dict:
    """One gloo rank: all_reduce of a seeded tensor per codec on ``device_type``; returns result bytes."""
    import torch

    import ccoll

    device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
    results = {}
    for spec in _registry_specs():
        g = torch.Generator().manual_seed(1000 + rank)
        x = torch.randn(GLOO_NUMEL, generator=g).to(device)
        ccoll.all_reduce(x, codec=spec)
        results[spec] = x.cpu().view(torch.uint8).numpy().tobytes()
    return results


def gloo_check(torch, device_type: str) -> dict:
    """2 gloo processes on ``device_type`` tensors vs the same on CPU tensors: result bytes per codec."""
    from ccoll.launch import RankError, run_gloo

    try:
        cpu = run_gloo(2, gloo_rank, "cpu", timeout_s=240)
        dev = run_gloo(2, gloo_rank, device_type, timeout_s=240) if device_type != "cpu" else cpu
    except RankError as e:  # a rank raised or timed out
        return {"status": "failed", "reason": str(e)[-2000:]}
    equal = {spec: all(dev[r][spec] == cpu[r][spec] for r in range(2)) and dev[0][spec] == dev[1][spec]
             for spec in cpu[0]}
    return {"status": "equal" if all(equal.values()) else "mismatch", "device": device_type,
            "numel": GLOO_NUMEL, "equal": equal}


# --------------------------------------------------------------------------------------------------
# report


def build_report(env: dict, matrix: Matrix, extra: dict, seconds: float) -> dict:
    gloo = extra.get("gloo", {})
    sim = extra.get("simulated_world", {})
    failed = bool(matrix.mismatches) or gloo.get("status") not in (None, "equal") or bool(sim.get("errors"))
    return {
        "status": "failed" if failed else "passed",
        "exit_code": EXIT_MISMATCH if failed else EXIT_OK,
        "seconds": round(seconds, 1),
        "environment": env,
        "bytes": {"compared": matrix.compared, "mismatches": matrix.mismatches, "skipped": matrix.skipped,
                  "groups": matrix.groups},
        **extra,
    }


def summary_lines(report: dict) -> list[str]:
    b = report["bytes"]
    lines = ["", "### gpu-check summary", "", "| check | result |", "|---|---|",
             f"| bytes: {b['compared']} comparisons in {len(b['groups'])} (spec, dtype) groups | "
             f"{len(b['mismatches'])} mismatches |"]
    for s in b["skipped"]:
        lines.append(f"| skipped | {s} |")
    sim = report.get("simulated_world")
    if sim:
        if sim.get("status") == "measured":
            per = ", ".join(f"p={p}: {v:.3f} ns" if v is not None else f"p={p}: error" for p, v in sim["ns_per_element"].items())
            lines.append(f"| simulated world all_reduce ({sim['codec']}), time per element | {per} |")
        else:
            lines.append(f"| simulated world | {sim.get('status')}: {sim.get('reason', '')} |")
    gloo = report.get("gloo")
    if gloo:
        lines.append(f"| 2-process gloo on {gloo.get('device', '?')} tensors vs CPU | {gloo['status']} "
                     f"{gloo.get('equal', gloo.get('reason', ''))} |")
    tp = report.get("throughput")
    if tp:
        lines += ["", "| codec | dtype | encode GB/s | decode GB/s | decode_sum GB/s | enc/copy | dec/copy | sum/copy |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for r in tp:
            if "skipped" in r:
                lines.append(f"| {r['codec']} | {r['dtype']} | skipped: {r['skipped']} | | | | | |")
                continue
            c = r["copy_GBps"]
            lines.append(f"| {r['codec']} | {r['dtype']} | {r['encode_GBps']:.0f} | {r['decode_GBps']:.0f} | "
                         f"{r['decode_sum_GBps']:.0f} | {r['encode_GBps'] / c:.2f} | {r['decode_GBps'] / c:.2f} | "
                         f"{r['decode_sum_GBps'] / c:.2f} |")
    lines.append(f"\n# gpu-check {report['status']} in {report['seconds']:.0f} s (exit {report['exit_code']})")
    return lines


def write_report(report: dict, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1, default=str))
    print(f"# report: {path}")


def environment(torch, device_type: str) -> dict:
    env = {"python": sys.version.split()[0], "platform": platform.platform(), "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "device_type": device_type,
           "zfpy": zfpy_usable()}
    if device_type == "cuda":
        import cupy

        from ccoll import kernels

        from ccoll.errors import KernelError

        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, memory_GiB=props.total_memory >> 30, capability=f"{props.major}.{props.minor}",
                   cupy=cupy.__version__)
        try:
            target = kernels.device_target((props.major, props.minor))
            env.update(nvrtc=".".join(map(str, kernels.nvrtc().version)), nvrtc_library=kernels.nvrtc().path,
                       nvrtc_target=target, nvrtc_options=list(kernels.nvrtc_options(target)))
        except KernelError as e:
            env.update(nvrtc=f"unavailable: {e}")
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", default="results/gpu_check.json", help="where to write the JSON report")
    ap.add_argument("--quick", action="store_true", help="no 2^20+3 size, 64 MiB throughput, p up to 64")
    ap.add_argument("--iters", type=int, default=10, help="timed iterations per throughput figure")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-gloo", action="store_true")
    ap.add_argument("--cpu-selftest", action="store_true",
                    help="no GPU: the same matrix with the emulated backend as the device column, on CPU tensors")
    ap.add_argument("--specs", help="';'-separated subset of the codec specs (default: all deterministic ones)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    import torch

    skipped: list[str] = []
    specs = args.specs.split(";") if args.specs else check_specs()
    if args.cpu_selftest:
        device, device_backend = torch.device("cpu"), "emulated"
        if not emulated_available(skipped):
            print("gpu-check --cpu-selftest: needs the emulated backend (nvcc and g++)")
            return EXIT_NO_DEVICE
        refs_base = reference_factory(torch, emulated=False, zfpy=zfpy_usable(),
                                      skipped=skipped)
    else:
        reason = None
        if not torch.cuda.is_available():
            reason = (f"no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) reports "
                      f"torch.cuda.is_available() == False; run it on a GPU machine with its own python3, e.g. "
                      f"`make gpu-check PYTHON=python3` (nothing is installed), or use --cpu-selftest")
        elif importlib.util.find_spec("cupy") is None:
            reason = ("CuPy is not importable in this interpreter; it launches the kernels. Install "
                      "cupy-cuda13x (CUDA 13) or cupy-cuda12x, or carry its wheel; nothing is installed here")
        if reason:
            print(f"gpu-check: {reason}")
            write_report({"status": "no_cuda", "exit_code": EXIT_NO_DEVICE, "reason": reason}, args.report)
            return EXIT_NO_DEVICE
        device, device_backend = torch.device("cuda", 0), "cupy"
        refs_base = reference_factory(torch, emulated=emulated_available(skipped),
                                      zfpy=zfpy_usable(), skipped=skipped)
    env = environment(torch, device.type)
    print(f"# gpu-check: {json.dumps(env)}", flush=True)
    sizes = QUICK_SIZES if (args.quick or args.cpu_selftest) else SIZES
    matrix = run_matrix(torch, device_backend, device, refs_base, sizes, specs=specs)
    matrix.skipped[:0] = skipped
    extra: dict = {}
    if device.type == "cuda" and not args.skip_throughput:
        extra["throughput"] = throughput(torch, (64 if args.quick else 256) << 20, args.iters)
    world_sizes = (8, 64) if (args.quick or args.cpu_selftest) else (8, 64, 256)
    extra["simulated_world"] = simulated_world_times(
        torch, device, world_sizes, numel=(1 << 14) if args.cpu_selftest else SIM_NUMEL_PER_RANK)
    if not args.skip_gloo:
        extra["gloo"] = gloo_check(torch, device.type)
    report = build_report(env, matrix, extra, time.perf_counter() - t0)
    print("\n".join(summary_lines(report)))
    write_report(report, args.report)
    return report["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
