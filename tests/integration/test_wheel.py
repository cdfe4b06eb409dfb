"""ccoll installed like any package: an sdist is built from the checkout, a wheel from that sdist, and the
wheel installed into a fresh virtual environment outside the checkout; everything then runs from a working
directory outside the checkout, with no PYTHONPATH:

- the sdist and the wheel carry every kernels/*.cu, common.cuh, the simt shim, every configs/**.yaml and the GPU
  check's digests (and every ccoll package of the checkout);
- ``ccoll-run`` (the fresh environment's console script) with ``CCOLL_POLICY=hybrid`` (a bare shipped name)
  launches a plain 2-rank DDP script under torchrun (gloo) and dp is compressed (the stats files);
- the installed sources compile: one real NVRTC compile for sm_90 of the smallest module (lossless) from the
  installed sources and include path, equal to the suite's cached build; every other module (quant, quant_rot, zfp)
  a hit in the suite's cache, whose keys are the sources' bytes, the options (include path normalised) and the NVRTC
  version -- a hit proves the installed sources are byte-identical to those the suite compiled (and
  ``make kernels-check`` verified), without compiling them a second time;
- the GPU check's CPU self-test runs from the installed package (``python -m ccoll.gpucheck --cpu-selftest``);
- ``python -m ccoll info`` reports the installed kernels and policies.

How the fresh environment gets torch without reinstalling it (~1 GB): ``python -m venv --without-pip``, then a
``.pth`` file in its site-packages naming the dev environment's site-packages. A directory added by a .pth line
is put on sys.path but is not itself a site directory, so the .pth files inside it -- among them the dev
environment's editable-install finder of ccoll -- are not processed: ``import ccoll`` finds only the wheel's
copy (asserted: ``ccoll.__file__`` is under the fresh environment). The wheel is installed with the dev
environment's pip, ``--no-index --no-deps --ignore-installed`` (the dependencies are the ones on that path; pip
must not see the dev environment's ccoll as "already installed", nor try to remove it).

The kernel cache (``CCOLL_BUILD_DIR``) is the suite's own (``ccoll.kernels.BUILD_DIR``: the checkout's build/):
every build there is keyed by content (host libraries by the sources' bytes, the options and nvcc's version; NVRTC
and simt likewise), so the installed package's builds are the checkout's where the sources are the same, and each
compile happens once per suite. Slow: building and installing take ~10 s; the DDP launch ~20-40 s; NVRTC of the
modules for sm_90 (~90 s on 2 cores, quant_rot ~60 s) only where the suite has not compiled them yet; the self-test
builds host libraries with nvcc only where the suite has not (skipped without nvcc: it falls back to the torch
backend, still from the installed package)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

DDP_SCRIPT = '''
import torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 16))
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
g = torch.Generator().manual_seed(rank)
for step in range(6):
    loss = ddp(torch.randn(32, 256, generator=g)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
'''

NVRTC_INSTALLED = '''
import sys, time
from ccoll import kernels
arch = sys.argv[1]
t = time.perf_counter()
real = kernels.compile_nvrtc("lossless", arch, verbose=True)  # NVRTC on the installed sources, really
cached = kernels.cached_nvrtc("lossless", arch, verbose=True)
print("REAL", len(real.cubin), f"{time.perf_counter() - t:.1f}", int(real.cubin == cached.cubin))
def no_compile(name, *args, **kw):
    raise SystemExit(f"MISS {name}: the installed sources or options differ from those the suite compiled")
kernels.compile_nvrtc = no_compile  # every other module must come from the suite's cache
for m in kernels.module_names():
    b = kernels.cached_nvrtc(m, arch, verbose=True)
    print("HIT", m, len(b.cubin), len(b.entries), flush=True)
print("KERNEL_DIR", kernels.KERNEL_DIR)
print("BUILD_DIR", kernels.BUILD_DIR)
print("OPTIONS", " ".join(kernels.module_options("quant", arch)))
'''


def _run(cmd, *, cwd, env, timeout=900) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-6000:]}"
    return proc.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Installed:
    """The built artifacts and the fresh environment with the wheel installed."""

    def __init__(self, root: Path):
        self.root = root
        self.work = root / "work"  # the working directory of every command: outside the checkout
        self.work.mkdir()
        from ccoll import kernels

        self.cache = kernels.BUILD_DIR  # CCOLL_BUILD_DIR: the suite's cache, keyed by content (see the docstring)
        self.timings: dict[str, float] = {}
        base = {k: v for k, v in os.environ.items()
                if not k.startswith("CCOLL_") and k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        t = time.perf_counter()
        dist = root / "dist"
        _run([sys.executable, "-c", f"from setuptools import build_meta as b; b.build_sdist({str(dist)!r})"],
             cwd=REPO, env=base)
        (self.sdist,) = dist.glob("ccoll-*.tar.gz")
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, self.sdist],
             cwd=self.work, env=base)
        (self.wheel,) = dist.glob("ccoll-*.whl")
        self.timings["sdist + wheel"] = time.perf_counter() - t
        t = time.perf_counter()
        self.venv = root / "venv"
        _run([sys.executable, "-m", "venv", "--without-pip", self.venv], cwd=self.work, env=base)
        self.python = self.venv / "bin" / "python"
        site = Path(_run([self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         cwd=self.work, env=base).strip())
        (site / "ccoll_dev_site.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        _run([self.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--ignore-installed", self.wheel],
             cwd=self.work, env=base)
        self.site = site
        self.timings["venv + install"] = time.perf_counter() - t
        self.env = {**base, "PATH": f"{self.venv / 'bin'}{os.pathsep}{base.get('PATH', '')}",
                    "VIRTUAL_ENV": str(self.venv), "CCOLL_BUILD_DIR": str(self.cache), "OMP_NUM_THREADS": "1",
                    "PYTHONWARNINGS": "ignore", "DS_ACCELERATOR": "cpu"}

    def run(self, *cmd, timeout=900, **env) -> str:
        return _run(cmd, cwd=self.work, env={**self.env, **env}, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    inst = Installed(tmp_path_factory.mktemp("wheel"))
    yield inst
    print(f"\n# test_wheel timings: {', '.join(f'{k} {v:.0f} s' for k, v in inst.timings.items())}")


def _shipped() -> dict[str, list[str]]:
    """Files the package must carry, as paths relative to kernels/ and configs/ of the checkout."""
    return {"kernels": sorted(str(p.relative_to(REPO / "kernels")) for p in (REPO / "kernels").rglob("*")
                              if p.is_file() and p.suffix in (".cu", ".cuh", ".h", ".cpp")),
            "configs": sorted(str(p.relative_to(REPO / "configs")) for p in (REPO / "configs").rglob("*.yaml"))}


def test_given_the_wheel_and_the_sdist_expect_every_kernel_source_config_and_package(installed):
    shipped = _shipped()
    assert {"quant.cu", "zfp.cu", "lossless.cu", "common.cuh", "simt/simt.h", "simt/simt_runtime.cpp"} <= set(
        shipped["kernels"])
    assert {"hybrid.yaml", "baseline.yaml", "clusters/lassen.yaml", "codecs/measured.yaml"} <= set(shipped["configs"])
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    missing = [f"ccoll/_kernels/{f}" for f in shipped["kernels"] if f"ccoll/_kernels/{f}" not in names]
    missing += [f"ccoll/_configs/{f}" for f in shipped["configs"] if f"ccoll/_configs/{f}" not in names]
    missing += [m for m in ("ccoll/gpucheck/expected.json", "ccoll/__main__.py", "ccoll/resources.py") if m not in names]
    modules = [str(p.relative_to(REPO)) for p in (REPO / "ccoll").rglob("*.py") if "__pycache__" not in p.parts]
    missing += [m for m in modules if m not in names]
    assert not missing, f"not in {installed.wheel.name}: {missing}"
    with tarfile.open(installed.sdist) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    missing = [f"{top}/{f}" for top, files in shipped.items() for f in files if f"{top}/{f}" not in members]
    assert not missing and "pyproject.toml" in members, f"not in {installed.sdist.name}: {missing}"


def test_given_the_fresh_environment_expect_the_wheels_ccoll_not_the_checkout(installed):
    out = installed.run(installed.python, "-c", "import ccoll, ccoll.resources as r; print(ccoll.__file__); "
                        "print(r.kernel_dir()); print(r.config_dir()); print(r.source_checkout())").split("\n")
    for path in out[:3]:
        assert Path(path).is_relative_to(installed.site), out
    assert out[3] == "None"
    info = json.loads(installed.run(installed.python, "-m", "ccoll", "info", "--json", CCOLL_POLICY="hybrid"))
    assert Path(info["kernels"]["dir"]).is_relative_to(installed.site)
    assert "hybrid" in info["policies"]["shipped"] and Path(info["policy"]["source"]).is_relative_to(installed.site)
    assert info["cache"]["dir"] == str(installed.cache) and info["ccoll"]["install"] == "installed package"


def test_given_ccoll_run_with_a_bare_policy_name_when_torchrun_ddp_expect_dp_compressed(installed):
    script = installed.root / "ddp_train.py"
    script.write_text(DDP_SCRIPT)
    stats = installed.root / "stats.json"
    t = time.perf_counter()
    out = installed.run(installed.venv / "bin" / "ccoll-run", installed.python, "-m", "torch.distributed.run",
                        "--nproc_per_node", "2", "--master_port", _free_port(), script,
                        CCOLL_POLICY="hybrid", CCOLL_STATS=str(stats), timeout=600)
    installed.timings["ccoll-run ddp"] = time.perf_counter() - t
    assert "rank 0 done" in out and "rank 1 done" in out, out[-3000:]
    for rank in range(2):
        dump = json.loads((installed.root / f"stats.rank{rank}.json").read_text())
        rows = [r for r in dump["stats"] if r["dim"] == "dp" and r["codec"] != "native"]
        assert rows and rows[0]["op"] == "all_reduce" and rows[0]["codec"].startswith("int4:block=64"), dump
        assert rows[0]["raw_bytes"] > 4 * rows[0]["wire_bytes"] > 0
        assert dump["summary"]["compressed"] is True


def test_given_the_installed_sources_expect_lossless_to_compile_and_every_module_to_be_the_suites_build(installed):
    """One real NVRTC compile (lossless, sm_90) from the installed sources and include path, equal to the build the
    suite cached; every module then a cache hit with compiling forbidden: the installed sources are the ones the
    suite compiled, byte for byte. The suite's builds are made here first where missing (the same key as `make
    kernels-check`'s, so test_kernels_build.py finds them too): each compile once per suite."""
    pytest.importorskip("nvidia", reason="NVRTC comes from the nvidia-cuda-nvrtc wheel (ccoll[dev])")
    from ccoll import kernels

    t = time.perf_counter()
    for m in kernels.module_names():
        kernels.cached_nvrtc(m, "sm_90", verbose=True)
    installed.timings["nvrtc sm_90 into the suite's cache"] = time.perf_counter() - t
    t = time.perf_counter()
    out = installed.run(installed.python, "-c", NVRTC_INSTALLED, "sm_90")
    installed.timings["installed: nvrtc lossless + cache hits"] = time.perf_counter() - t
    lines = [line.split(" ") for line in out.strip().splitlines()]
    values = {w[0]: w[1:] for w in lines if w[0] in ("REAL", "KERNEL_DIR", "BUILD_DIR")}
    kernel_dir = Path(values["KERNEL_DIR"][0])
    assert kernel_dir.is_relative_to(installed.site) and Path(values["BUILD_DIR"][0]) == installed.cache
    assert f"-I{kernel_dir}" in out.split("OPTIONS ", 1)[1].split()
    assert int(values["REAL"][0]) > 0 and values["REAL"][2] == "1", out  # the real compile == the suite's cubin
    hits = {w[1]: int(w[3]) for w in lines if w[0] == "HIT"}
    assert set(hits) == set(kernels.module_names()) and {"quant", "quant_rot", "zfp", "lossless"} <= set(hits), out
    assert all(n > 0 for n in hits.values()), hits


def test_given_the_installed_package_expect_the_gpu_checks_cpu_selftest_to_pass(installed):
    t = time.perf_counter()
    out = installed.run(installed.python, "-m", "ccoll.gpucheck", "--cpu-selftest", "--out", installed.root / "gc",
                        timeout=1800)
    installed.timings["gpu-check cpu self-test"] = time.perf_counter() - t
    assert "# cpu-selftest passed" in out, out[-3000:]
    if shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc"):  # the installed sources' host builds
        assert "device column = emulated backend" in out, out[-3000:]  # (the suite's, where the bytes are equal)
    report = json.loads((installed.root / "gc" / "run" / "gpu_check.json").read_text())
    assert report["exit_code"] == 0 and report["phases"]["bytes"]["equal"] == report["phases"]["bytes"]["cases"] > 0
