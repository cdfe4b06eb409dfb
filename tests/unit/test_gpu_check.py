"""tools/gpu_check.py (`make gpu-check`) on a machine without a GPU: the clear exit-2 path, and the same
comparison matrix, report and gloo check it runs on a GPU, with the emulated backend in the device column
(`--cpu-selftest`), so CI executes the code a GPU session relies on."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ccoll
from ccoll import kernels
from ccoll.errors import KernelError

TOOLS = Path(kernels.ROOT) / "tools"
sys.path.insert(0, str(TOOLS))
import gpu_check  # noqa: E402


def _require_emulated():
    try:
        for name in kernels.kernel_names():
            kernels.host_library(name)
    except (KernelError, OSError) as e:
        pytest.skip(f"no host build of kernels/*.cu (needs nvcc and g++): {str(e).splitlines()[0]}")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_given_no_cuda_when_running_gpu_check_expect_exit_2_a_clear_line_and_a_report(tmp_path):
    report = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, str(TOOLS / "gpu_check.py"), "--report", str(report)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "gpu-check: no CUDA device" in proc.stdout and "pip" not in proc.stdout + proc.stderr
    assert json.loads(report.read_text())["status"] == "no_cuda"


def test_given_each_input_kind_expect_the_values_it_promises():
    f32 = gpu_check.make_input(torch, "subnormal", 4099, torch.float32, seed=1)
    mag = f32.abs()
    assert bool(((mag > 0) & (mag < torch.finfo(torch.float32).tiny)).any())  # fp32 subnormals
    assert bool(((mag >= 2.0**-98) & (mag < 2.0**-97)).any())  # zfp's tiny-block edge
    f64 = gpu_check.make_input(torch, "subnormal", 4099, torch.float64, seed=1).abs()
    assert bool(((f64 > 0) & (f64 < torch.finfo(torch.float64).tiny)).any())
    bad = gpu_check.make_input(torch, "nonfinite", 255, torch.bfloat16, seed=2)
    assert bool(bad.isnan().any()) and bool((bad == float("inf")).any()) and bool((bad == float("-inf")).any())
    view = gpu_check.make_input(torch, "misaligned", 255, torch.float32, seed=3)
    assert view.data_ptr() % 16 != 0 and view.is_contiguous()


def test_given_a_device_backend_that_corrupts_one_byte_expect_the_matrix_to_report_it(monkeypatch):
    _require_emulated()
    from ccoll.codecs.quant import BlockQuantCodec

    honest = BlockQuantCodec._encode_rows_emulated

    def corrupt(self, src, out, row_numel, feedback, salt):  # every encode (one row or many) goes through it
        honest(self, src, out, row_numel, feedback, salt)
        out[:, -1] ^= 1

    ref = {"torch": ccoll.get_codec("int4:block=24", backend="torch")}
    cpu = torch.device("cpu")
    made, bad = gpu_check.compare_one(torch, "int4:block=24", torch.float32, "normal", 255, "emulated", ref, cpu)
    assert made == 7 and bad == []  # encode, decode, decode_sum, encode_rows x2 + residuals, decode_rows
    monkeypatch.setattr(BlockQuantCodec, "_encode_rows_emulated", corrupt)
    made, bad = gpu_check.compare_one(torch, "int4:block=24", torch.float32, "normal", 255, "emulated", ref, cpu)
    assert any("encode bytes differ" in b for b in bad), bad


def test_given_mismatches_or_a_failed_gloo_run_expect_a_failed_report_with_exit_1():
    clean = gpu_check.Matrix(compared=3)
    assert gpu_check.build_report({}, clean, {"gloo": {"status": "equal"}}, 1.0)["exit_code"] == 0
    dirty = gpu_check.Matrix(compared=3, mismatches=["zfp:rate=8 float32 subnormal n=5: encode bytes differ"])
    report = gpu_check.build_report({}, dirty, {}, 1.0)
    assert report["status"] == "failed" and report["exit_code"] == 1
    assert gpu_check.build_report({}, clean, {"gloo": {"status": "mismatch"}}, 1.0)["exit_code"] == 1
    assert "1 mismatches" in "\n".join(gpu_check.summary_lines(report))


@pytest.mark.slow
def test_given_cpu_selftest_expect_every_comparison_equal_and_one_json_report(tmp_path):
    _require_emulated()
    report = tmp_path / "gpu_check.json"
    specs = "zfp:rate=4,dims=2;int8:block=64,round=stochastic,seed=3;int4:block=24;fp16"
    rc = gpu_check.main(["--cpu-selftest", "--report", str(report), "--specs", specs])
    data = json.loads(report.read_text())
    assert rc == 0 and data["status"] == "passed", data["bytes"]["mismatches"][:5]
    groups = {(g["spec"], g["dtype"]) for g in data["bytes"]["groups"]}
    assert ("zfp:rate=4,dims=2", "float64") in groups and ("int4:block=24", "bfloat16") in groups
    assert all(g["inputs"] == list(gpu_check.INPUTS) and g["compared"] > 0 for g in data["bytes"]["groups"])
    assert data["gloo"]["status"] == "equal" and set(data["gloo"]["equal"]) == set(gpu_check.GLOO_SPECS)
    assert "simulated_world" in data


def test_given_no_zfpy_expect_zfp_compared_only_with_the_emulated_build_and_one_skip_line():
    skipped = []
    refs_for = gpu_check.reference_factory(torch, emulated=True, zfpy=False, skipped=skipped)
    assert sorted(refs_for("zfp:rate=8")) == ["emulated"] and sorted(refs_for("zfp:rate=4,dims=2")) == ["emulated"]
    assert sorted(refs_for("int8:block=64")) == ["emulated", "torch"]
    assert len(skipped) == 1 and "zfpy" in skipped[0]
