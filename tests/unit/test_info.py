"""``python -m ccoll info``: runs anywhere with exit 0, says where the kernels, policies and build cache are
(paths that exist), reports each probe's failure as text instead of failing, and imports neither CuPy, mpi4py
nor deepspeed by being imported."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ccoll import info

KEYS = {"ccoll", "kernels", "policies", "cache", "torch", "cupy", "mpi", "zfpy", "nvcc", "nvrtc", "cxx", "backends",
        "policy"}


def _run(*args, cwd, **env):
    full = {k: v for k, v in os.environ.items() if k not in ("CCOLL_POLICY", "PYTHONPATH")} | env
    proc = subprocess.run([sys.executable, "-m", "ccoll", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=full)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_given_a_shipped_policy_when_run_from_elsewhere_expect_json_with_paths_that_exist(tmp_path):
    r = json.loads(_run("info", "--json", cwd=tmp_path, CCOLL_POLICY="hybrid"))
    assert set(r) == KEYS
    kdir = Path(r["kernels"]["dir"])
    assert kdir.is_dir() and {"quant.cu", "zfp.cu", "lossless.cu"} <= set(r["kernels"]["sources"])
    assert r["kernels"]["headers"] == ["common.cuh"] and (Path(r["kernels"]["simt_shim"]) / "simt.h").is_file()
    assert all((kdir / f).is_file() for f in r["kernels"]["sources"])
    pdir = Path(r["policies"]["dir"])
    assert {"hybrid", "baseline", "naive"} <= set(r["policies"]["shipped"])
    assert all((pdir / f"{name}.yaml").is_file() for name in r["policies"]["shipped"])
    assert "lassen" in r["policies"]["clusters"]
    assert set(r["cache"]["cached"]) == set(info.CACHE_PARTS) and r["cache"]["dir"]
    assert r["ccoll"]["version"] and Path(r["ccoll"]["location"], "__init__.py").is_file()
    assert isinstance(r["torch"]["cuda_available"], bool) and r["torch"]["version"]
    assert set(r["backends"]) == {"torch", "emulated", "cupy", "simt"}
    assert all(isinstance(v["ok"], bool) and v["why"] for v in r["backends"].values())
    assert r["backends"]["torch"]["ok"]
    pol = r["policy"]
    assert pol["spec"] == "hybrid" and Path(pol["source"]).is_file() and Path(pol["source"]).parent == pdir
    assert any(line.startswith("dp: all_reduce=int4") for line in pol["describe"])


def test_given_text_output_expect_one_line_per_probe_and_the_backends(tmp_path):
    out = _run("info", cwd=tmp_path, CCOLL_POLICY="hybrid")
    heads = [line.split()[0] for line in out.splitlines() if line and not line.startswith((" ", "-"))]
    for head in ("ccoll", "python", "kernels", "policies", "clusters", "build", "torch", "cupy", "mpi4py", "zfpy",
                 "nvcc", "nvrtc", "c++", "backends", "policy"):
        assert head in heads, out
    assert "CCOLL_POLICY=hybrid -> " in out and "  torch      yes" in out
    assert len(out.splitlines()) < 40


def test_given_a_bad_policy_expect_the_reason_not_a_crash(tmp_path):
    r = json.loads(_run("info", "--json", cwd=tmp_path, CCOLL_POLICY="no-such-policy"))
    assert "PolicyError" in r["policy"]["error"] and "no-such-policy" in r["policy"]["error"]
    assert "unavailable: PolicyError" in _run("info", cwd=tmp_path, CCOLL_POLICY="no-such-policy")
    assert json.loads(_run("info", "--json", cwd=tmp_path))["policy"] is None


def test_given_a_probe_that_raises_expect_its_error_reported_and_the_backend_explained(monkeypatch):
    def broken():
        raise FileNotFoundError("nvcc not here")

    monkeypatch.setitem(info.PROBES, "nvcc", broken)
    r = info.collect()
    assert r["nvcc"] == {"error": "FileNotFoundError: nvcc not here"}
    assert not r["backends"]["emulated"]["ok"] and "nvcc not here" in r["backends"]["emulated"]["why"]
    text = info.format_text(r)
    assert "nvcc         unavailable: FileNotFoundError: nvcc not here" in text
    assert "  emulated   NO " in text


def test_given_import_or_a_report_without_them_expect_no_cupy_mpi4py_or_deepspeed_imported(monkeypatch):
    code = ("import sys, ccoll.info as i; print(sorted(m for m in ('cupy', 'mpi4py', 'deepspeed') if m in sys.modules)); "
            "i.PROBES.pop('mpi'); i.PROBES.pop('cupy'); i.collect(); "
            "print(sorted(m for m in ('cupy', 'mpi4py', 'deepspeed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[]", "[]"]


@pytest.mark.parametrize("args,code", [(["nope"], 2), ([], 2), (["--help"], 0)])
def test_given_the_command_line_expect_usage_and_exit_codes(args, code, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ccoll", *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == code and "info" in proc.stdout + proc.stderr
