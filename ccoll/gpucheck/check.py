"""`python -m ccoll.gpucheck` (`make gpu-check`): on a CUDA machine, in one command (< 4 minutes with the carried
bundle), time the GPU path and check it byte for byte, with nothing installed and nothing compiled there.

Runs with the interpreter it is started with: a pip-installed ccoll, or a checkout on PYTHONPATH
(``make gpu-check PYTHON=python3``): torch with CUDA, CuPy (cupy-cuda13x / cupy-cuda12x) and numpy. It needs
neither zfpy nor nvcc nor NVRTC nor a network:
- the expected bytes come from ccoll/gpucheck/expected.json, shipped with the package (``make gpu-expected``:
  digests of the torch backend's outputs, zfp through libzfp, computed on the CPU; see
  ccoll.gpucheck.expected), so every codec, zfp included, is compared; a case without an expected digest is a
  failure, never a skip;
- the kernels come from build/gpu/*.cubin (``make gpu-bundle``, carried), keyed by their sources, else NVRTC.

Phases, in this order; the JSON report (``--out DIR``: DIR/gpu_check.json, and DIR/gpu_check.md the summary)
is rewritten after each phase and every few seconds within one, so a killed run still leaves what it did:
1. throughput: encode / decode / decode_sum GB/s of input of every registry codec at 256 MiB of fp32 and
   bf16 (CUDA events after warm-up), beside the device copy bandwidth measured in the same run;
2. bytes: every case of the expected matrix (spec x dtype x input kind x size; encode, decode, decode_sum,
   encode_rows without and with error feedback -- payload and residuals --, decode_rows) on CUDA tensors
   with the cupy backend, digested and compared with the file;
3. collectives: all_reduce and all_gather_into_tensor of every registry codec on a simulated world
   (threads, in-memory transport, CUDA tensors) compared with the expected digests, then the all_reduce
   time per element at p = 8 and 64. No gloo: gloo does not take CUDA tensors for all_gather or send/recv.
``--deadline-s`` bounds the whole run: past it, the phase in progress stops between cases and what is left is
reported "not run".

Exit status: 0 everything ran and matched; 1 a mismatch, a missing expected digest or an error; 2 no CUDA
device / CuPy; 3 nothing failed but the deadline left something not run.

``--cpu-selftest`` (CI) runs the bytes and collectives phases on CPU tensors (the emulated host build in the
device column when nvcc and g++ exist, else the torch backend) against the committed digests, then its
negative controls: a changed digest and a missing one must each fail the run with exit 1, and a deadline of
zero must leave every phase "not run" with exit 3; each run's report is read back after every phase.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

EXIT_OK, EXIT_MISMATCH, EXIT_NO_DEVICE, EXIT_INCOMPLETE = 0, 1, 2, 3
from . import expected as ge
from .matrix import _dtype_name, _registry_specs


# --------------------------------------------------------------------------------------------------
# the run's clock and its report


class Deadline:
    """The run's global deadline (``--deadline-s``, from the start of the run)."""

    def __init__(self, seconds: float | None, t0: float | None = None):
        self.t0 = time.perf_counter() if t0 is None else t0
        self.seconds = seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def passed(self) -> bool:
        return self.seconds is not None and self.elapsed() >= self.seconds


class Report:
    """The JSON report in ``out``/gpu_check.json (plus the summary in gpu_check.md), rewritten atomically
    after every phase and at most every ``every_s`` seconds within one."""

    PHASES = ("throughput", "bytes", "collectives")

    def __init__(self, out: str | Path | None, deadline: Deadline, every_s: float = 5.0):
        self.out = Path(out) if out else None
        self.deadline = deadline
        self.every_s = every_s
        self._last = 0.0
        self.data: dict = {"status": "running", "exit_code": None, "seconds": 0.0,
                           "deadline_s": deadline.seconds, "environment": {},
                           "phases": {p: {"status": "not run"} for p in self.PHASES}}

    def phase(self, name: str) -> dict:
        return self.data["phases"][name]

    def write(self, force: bool = True) -> None:
        if self.out is None or (not force and time.perf_counter() - self._last < self.every_s):
            return
        self._last = time.perf_counter()
        self.data["seconds"] = round(self.deadline.elapsed(), 1)
        self.out.mkdir(parents=True, exist_ok=True)
        for name, text in (("gpu_check.json", json.dumps(self.data, indent=1, default=str)),
                           ("gpu_check.md", "\n".join(summary_lines(self.data)) + "\n")):
            tmp = self.out / f".{name}.tmp"
            tmp.write_text(text)
            os.replace(tmp, self.out / name)

    def finish(self) -> int:
        phases = self.data["phases"].values()
        failed = any(p["status"] == "failed" for p in phases)
        incomplete = any(p["status"] in ("not run", "partial") for p in phases)
        self.data["status"] = "failed" if failed else "incomplete" if incomplete else "passed"
        self.data["exit_code"] = EXIT_MISMATCH if failed else EXIT_INCOMPLETE if incomplete else EXIT_OK
        self.write()
        return self.data["exit_code"]


# --------------------------------------------------------------------------------------------------
# phase 1: throughput (CUDA only)

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


def throughput(torch, nbytes: int, iters: int, report: Report, device="cuda", backend: str = "cupy",
               seconds=_gpu_seconds) -> None:
    """GB/s of input bytes: encode reads nbytes, decode writes nbytes, decode_sum decodes TP_ROWS payloads
    of nbytes each (counted TP_ROWS * nbytes); the device copy of the same tensor counts its nbytes once
    too (it reads and writes them). ``*_of_copy``: the fraction of that copy bandwidth, measured in this run.
    ``device`` / ``backend`` / ``seconds`` (the timer) default to the GPU; the unit tests run it on the CPU."""
    import ccoll
    from ccoll.errors import CcollError

    phase = report.phase("throughput")
    phase.update(status="running", nbytes=nbytes, iters=iters, rows=[])
    specs = _registry_specs()
    for dtype in (torch.float32, torch.bfloat16):
        numel = nbytes // torch.tensor([], dtype=dtype).element_size()
        x = torch.randn(numel, device=device).to(dtype)
        dst = torch.empty_like(x)
        copy = nbytes / seconds(torch, lambda: dst.copy_(x), iters) / 1e9  # input bytes, as the codecs'
        phase["rows"].append({"codec": "device copy", "dtype": _dtype_name(dtype), "copy_GBps": copy})
        del dst
        for spec in specs:
            row = {"codec": spec, "dtype": _dtype_name(dtype)}
            codec = ccoll.get_codec(spec, backend=backend)
            if dtype not in codec.dtypes:
                continue
            phase["rows"].append(row)
            if report.deadline.passed():
                row["status"] = "not run"
                continue
            try:
                payload = codec.encode(x)
                payloads = payload.unsqueeze(0).expand(TP_ROWS, -1).contiguous()
                acc = torch.empty(numel, dtype=torch.float32, device=device)
                enc = nbytes / seconds(torch, lambda: codec.encode(x), iters) / 1e9
                dec = nbytes / seconds(torch, lambda: codec.decode(payload, numel, dtype), iters) / 1e9
                dsum = TP_ROWS * nbytes / seconds(
                    torch, lambda: codec.decode_sum(payloads, numel, dtype, out=acc), iters) / 1e9
            except CcollError as e:
                row.update(status="failed", error=f"{type(e).__name__}: {str(e)[:500]}")
                continue
            row.update(status="measured", encode_GBps=enc, decode_GBps=dec, decode_sum_GBps=dsum, copy_GBps=copy,
                       encode_of_copy=enc / copy, decode_of_copy=dec / copy, decode_sum_of_copy=dsum / copy)
            del payload, payloads, acc
            report.write(force=False)
        del x
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    statuses = {r.get("status") for r in phase["rows"] if "status" in r}
    phase["status"] = "failed" if "failed" in statuses else "partial" if "not run" in statuses else "done"
    report.write()


# --------------------------------------------------------------------------------------------------
# phase 2: bytes against the carried digests


def compare_bytes(torch, backend: str, device, expected: dict, report: Report, specs=None) -> None:
    """Every case of the matrix on ``backend`` / ``device``, digested and compared with ``expected["cases"]``.
    A case the file lacks, a digest that differs, a refusal that differs and an exception are failures."""

    phase = report.phase("bytes")
    want_all = expected.get("cases", {})
    phase.update(status="running", backend=backend, expected_cases=len(want_all), ops=list(ge.OPS), compared=0,
                 equal=0, mismatches=[], missing=[], errors=[], not_run=0, groups={})
    todo = list(ge.cases(torch, specs))
    phase["cases"] = len(todo)
    for i, (spec, dtype, kind, n) in enumerate(todo):
        if report.deadline.passed():
            phase["not_run"] = len(todo) - i
            break
        cid = ge.case_id(spec, dtype, kind, n)
        group = phase["groups"].setdefault(f"{spec}|{_dtype_name(dtype)}", {"compared": 0, "failed": 0})
        want = want_all.get(cid)
        try:
            got = ge.case_digests(torch, spec, dtype, kind, n, backend, device)
        except Exception as e:  # noqa: BLE001 - a failed build or launch is a finding: reported, run goes on
            phase["errors"].append(f"{cid}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
            group["failed"] += 1
            continue
        phase["compared"] += 1
        group["compared"] += 1
        if want is None:
            phase["missing"].append(f"{cid}: no expected digest (run `make gpu-expected` where zfpy is)")
            group["failed"] += 1
        elif got != want:
            if got.startswith("refused") or want.startswith("refused"):
                differ = f"expected {want!r}, got {got!r}"
            else:
                differ = ", ".join(op for op, g, w in zip(ge.OPS, got.split(), want.split()) if g != w)
            phase["mismatches"].append(f"{cid}: {differ}")
            group["failed"] += 1
        else:
            phase["equal"] += 1
        report.write(force=False)
    failed = phase["mismatches"] or phase["missing"] or phase["errors"]
    phase["status"] = "failed" if failed else "partial" if phase["not_run"] else "done"
    report.write()


# --------------------------------------------------------------------------------------------------
# phase 3: collectives on the simulated world

SIM_CODEC = "int8:block=256"
SIM_NUMEL_PER_RANK = 1 << 20


def compare_collectives(torch, device, expected: dict, report: Report, specs=None,
                        world_sizes=(8, 64), sim_numel=SIM_NUMEL_PER_RANK) -> None:
    """all_reduce / all_gather of each registry codec on a simulated world of ``device`` tensors, each rank's
    result digest against ``expected["collectives"]``; then all_reduce wall time per element at each of
    ``world_sizes`` (all p ranks as threads of this process on one device)."""

    phase = report.phase("collectives")
    want_all = expected.get("collectives", {}).get("specs", {})
    phase.update(status="running", world=ge.COLL_WORLD, numel=ge.COLL_NUMEL, ops=list(ge.COLL_OPS), compared=0,
                 equal=0, mismatches=[], missing=[], errors=[], not_run=[], ns_per_element={})
    todo = _registry_specs() if specs is None else [s for s in specs if s in _registry_specs()]
    for spec in todo:
        if report.deadline.passed():
            phase["not_run"].append(spec)
            continue
        try:
            got = ge.collective_digests(torch, spec, device)
        except Exception as e:  # noqa: BLE001 - reported, the run goes on
            phase["errors"].append(f"{spec}: {type(e).__name__}: {str(e)[:300]}")
            continue
        want = want_all.get(spec)
        for op in ge.COLL_OPS:
            phase["compared"] += 1
            if want is None or op not in want:
                phase["missing"].append(f"{spec} {op}: no expected digest")
            elif got[op] != want[op]:
                phase["mismatches"].append(f"{spec} {op}: ranks' results differ (got {got[op]}, expected {want[op]})")
            else:
                phase["equal"] += 1
        report.write(force=False)
    if not phase["not_run"]:
        phase["ns_per_element"] = simulated_world_times(torch, device, report, world_sizes, sim_numel)
    failed = phase["mismatches"] or phase["missing"] or phase["errors"]
    phase["status"] = "failed" if failed else "partial" if phase["not_run"] else "done"
    report.write()


def simulated_world_times(torch, device, report: Report, world_sizes, numel, codec=SIM_CODEC) -> dict:
    """Compressed all_reduce wall time per element of the per-rank tensor at each world size (p ranks as
    threads of this process on ``device``); "not run" past the deadline, the error text on failure."""
    import ccoll
    from ccoll.testing import simulated_world

    out = {"codec": codec, "numel_per_rank": numel}
    for p in world_sizes:
        if report.deadline.passed():
            out[str(p)] = "not run"
            continue
        xs = [torch.full((numel,), float(r + 1), device=device) for r in range(p)]  # allocated outside the timing

        def fn(rank, group):
            ccoll.all_reduce(xs[rank], group=group, codec=codec, min_bytes=0)

        def sync():
            if device.type == "cuda":
                torch.cuda.synchronize()

        try:
            simulated_world(p, fn, device=device, timeout_s=60)  # warm-up: modules loaded, buffers allocated
            sync()
            t0 = time.perf_counter()
            simulated_world(p, fn, device=device, timeout_s=60)
            sync()
            out[str(p)] = (time.perf_counter() - t0) / numel * 1e9
        except Exception as e:  # noqa: BLE001 - a finding, reported
            out[str(p)] = f"error: {type(e).__name__}: {str(e)[:300]}"
        del xs
    return out


# --------------------------------------------------------------------------------------------------
# summary


def _fmt(v) -> str:
    return f"{v:.0f}" if isinstance(v, (int, float)) else "-"


def summary_lines(data: dict) -> list[str]:
    ph = data["phases"]
    lines = ["### gpu-check", "", f"status: {data['status']} after {data['seconds']:.0f} s "
             f"(deadline {data.get('deadline_s')} s, exit {data.get('exit_code')})", ""]
    tp = ph["throughput"]
    lines += [f"#### 1. throughput: {tp['status']}", ""]
    if tp.get("rows"):
        lines += ["| codec | dtype | encode GB/s | decode GB/s | decode_sum GB/s | enc/copy | dec/copy | copy GB/s |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for r in tp["rows"]:
            if r.get("status") in ("not run", "failed"):
                lines.append(f"| {r['codec']} | {r['dtype']} | {r['status']} {r.get('error', '')} | | | | | |")
                continue
            lines.append(f"| {r['codec']} | {r['dtype']} | {_fmt(r.get('encode_GBps'))} | {_fmt(r.get('decode_GBps'))} | "
                         f"{_fmt(r.get('decode_sum_GBps'))} | {r.get('encode_of_copy', 1):.2f} | "
                         f"{r.get('decode_of_copy', 1):.2f} | {_fmt(r.get('copy_GBps'))} |")
    for name in ("bytes", "collectives"):
        p = ph[name]
        lines += ["", f"#### {2 if name == 'bytes' else 3}. {name}: {p['status']}", ""]
        if "compared" in p:
            not_run = p["not_run"] if isinstance(p["not_run"], int) else len(p["not_run"])
            lines.append(f"{p['compared']} compared, {p['equal']} equal, {len(p['mismatches'])} mismatches, "
                         f"{len(p['missing'])} without expected digest, {len(p['errors'])} errors, {not_run} not run")
            for line in (p["mismatches"] + p["missing"] + p["errors"])[:20]:
                lines.append(f"- {line}")
        if p.get("ns_per_element"):
            lines.append(f"all_reduce time per element: {p['ns_per_element']}")
    return lines


# --------------------------------------------------------------------------------------------------
# environment and the run


def environment(torch, device_type: str) -> dict:
    from ccoll import kernels

    env = {"python": sys.version.split()[0], "platform": platform.platform(), "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "device_type": device_type}
    manifest = kernels.bundle_dir() / "manifest.json"
    env["bundle"] = json.loads(manifest.read_text()) if manifest.exists() else "none (build/gpu/manifest.json)"
    if device_type == "cuda":
        import cupy

        props = torch.cuda.get_device_properties(0)
        arch = f"sm_{props.major}{props.minor}"
        env.update(gpu=props.name, memory_GiB=props.total_memory >> 30, capability=f"{props.major}.{props.minor}",
                   cupy=cupy.__version__,
                   bundle_matches={n: kernels.bundle_path(n, arch).exists() for n in kernels.module_names()})
    return env


def run(torch, device, backend: str, out, deadline: Deadline, expected: dict, specs=None, tp_nbytes=256 << 20,
        iters=10, world_sizes=(8, 64), sim_numel=SIM_NUMEL_PER_RANK, env_extra=None) -> Report:
    report = Report(out, deadline)
    report.data["environment"] = {**environment(torch, device.type), **(env_extra or {})}
    report.write()
    print(f"# gpu-check: {json.dumps(report.data['environment'], default=str)}", flush=True)
    from ccoll import kernels

    def modules(done: str | None = None) -> None:  # where each kernel module came from: the bundle, or NVRTC
        report.data["kernel_modules"] = {n: o for (n, _), o in kernels.module_origin.items()}
        if done:
            print(f"# {done}: {report.phase(done)['status']} at {deadline.elapsed():.0f} s", flush=True)

    if device.type == "cuda":
        throughput(torch, tp_nbytes, iters, report)
    else:
        report.phase("throughput").update(status="skipped", reason="no CUDA device (CPU self-test)")
    modules("throughput")
    report.write()
    compare_bytes(torch, backend, device, expected, report, specs)
    modules("bytes")
    compare_collectives(torch, device, expected, report, specs, world_sizes, sim_numel)
    modules("collectives")
    report.finish()
    return report


def _no_device_reason(torch) -> str | None:
    if not torch.cuda.is_available():
        return (f"no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) reports "
                f"torch.cuda.is_available() == False; run it on a GPU machine with its own python3, e.g. "
                f"`make gpu-check PYTHON=python3` (nothing is installed), or use --cpu-selftest")
    if importlib.util.find_spec("cupy") is None:
        return ("CuPy is not importable in this interpreter; it launches the kernels. Install "
                "cupy-cuda13x (CUDA 13) or cupy-cuda12x, or carry its wheel; nothing is installed here")
    return None


def _selftest_backend() -> str:
    """The CPU self-test's device column: the emulated host build when it builds here, else torch."""
    from ccoll import kernels

    try:
        for name in kernels.kernel_names():
            kernels.host_library(name)
        return "emulated"
    except Exception:  # noqa: BLE001 - no nvcc / g++: the torch backend still exercises the comparison
        return "torch"


#: the CPU self-test's default specs: one per codec family, fp64 and stochastic among them
SELFTEST_SPECS = "zfp:rate=4,dims=2;int8:block=64,round=stochastic,seed=3;int4:block=24;fp16"


def cpu_selftest(torch, out: Path, expected: dict, specs: list[str]) -> int:
    """The positive run, then the negative controls (module docstring); 0 only if each behaved."""
    import copy


    cpu, backend = torch.device("cpu"), _selftest_backend()
    print(f"# cpu-selftest: device column = {backend} backend, specs {specs}")
    problems = []

    def read(sub):
        return json.loads((out / sub / "gpu_check.json").read_text())

    rc = run(torch, cpu, backend, out / "run", Deadline(None), expected, specs, world_sizes=(4,), sim_numel=1 << 12,
             env_extra={"selftest": "positive"}).data["exit_code"]
    if rc != EXIT_OK:
        problems.append(f"the positive run exited {rc}, not 0")
    first = next(ge.case_id(*c) for c in ge.cases(torch, specs[:1]))
    tampered = copy.deepcopy(expected)
    digests = tampered["cases"][first].split()
    digests[0] = "0" * len(digests[0])
    tampered["cases"][first] = " ".join(digests)
    second = [ge.case_id(*c) for c in ge.cases(torch, specs[-1:])][-1]
    del tampered["cases"][second]
    rc = run(torch, cpu, backend, out / "tampered", Deadline(None), tampered, specs, world_sizes=(),
             env_extra={"selftest": "one digest changed, one removed"}).data["exit_code"]
    got = read("tampered")["phases"]["bytes"]
    if rc != EXIT_MISMATCH or not any(m.startswith(f"{first}: encode") for m in got["mismatches"]) \
            or not any(m.startswith(f"{second}:") for m in got["missing"]):
        problems.append(f"the tampered digests did not fail as they must (exit {rc}; mismatches "
                        f"{got['mismatches'][:3]}, missing {got['missing'][:3]})")
    rc = run(torch, cpu, backend, out / "deadline", Deadline(0.0), expected, specs,
             env_extra={"selftest": "deadline 0"}).data["exit_code"]
    got = read("deadline")
    if rc != EXIT_INCOMPLETE or got["phases"]["bytes"]["not_run"] != got["phases"]["bytes"]["cases"] \
            or got["phases"]["collectives"]["status"] != "partial":
        problems.append(f"deadline 0 did not stop cleanly with everything 'not run' (exit {rc})")
    for line in problems:
        print(f"# cpu-selftest FAILED: {line}")
    print(f"# cpu-selftest {'passed' if not problems else 'failed'}; reports under {out}")
    return EXIT_OK if not problems else EXIT_MISMATCH


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/gpu_check", help="directory of the report (gpu_check.json, .md)")
    ap.add_argument("--deadline-s", type=float, default=180.0,
                    help="stop cleanly after this many seconds from the start, the rest reported 'not run'")
    ap.add_argument("--expected", default=None, help="expected digests (default: the shipped ccoll/gpucheck/expected.json)")
    ap.add_argument("--iters", type=int, default=10, help="timed iterations per throughput figure")
    ap.add_argument("--tp-mib", type=int, default=256, help="MiB of input per throughput figure")
    ap.add_argument("--specs", help="';'-separated subset of the codec specs (default: the whole matrix)")
    ap.add_argument("--cpu-selftest", action="store_true",
                    help="no GPU: bytes and collectives on CPU tensors vs the digests, then the negative controls")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    import torch


    out = Path(args.out)
    try:
        expected = ge.load(args.expected or ge.EXPECTED)
    except (OSError, ValueError) as e:  # without the file nothing can be compared: a failure, not a skip
        print(f"gpu-check: no expected digests ({e}); run `make gpu-expected` where zfpy is, and commit it")
        expected = {}
    if args.cpu_selftest:
        specs = (args.specs or SELFTEST_SPECS).split(";")
        return cpu_selftest(torch, out, expected, specs)
    reason = _no_device_reason(torch)
    if reason:
        print(f"gpu-check: {reason}")
        report = Report(out, Deadline(args.deadline_s, t0))
        report.data.update(status="no_cuda", exit_code=EXIT_NO_DEVICE, reason=reason)
        report.write()
        return EXIT_NO_DEVICE
    report = run(torch, torch.device("cuda", 0), "cupy", out, Deadline(args.deadline_s, t0), expected,
                 args.specs.split(";") if args.specs else None, tp_nbytes=args.tp_mib << 20, iters=args.iters)
    print("\n".join(summary_lines(report.data)))
    print(f"# report: {out / 'gpu_check.json'}")
    return report.data["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
