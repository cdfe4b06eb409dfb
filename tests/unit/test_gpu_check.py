"""ccoll.gpucheck (`python -m ccoll.gpucheck`, `make gpu-check`) on a machine without a GPU: the clear exit-2 path, the digest
comparison (a corrupted backend, a changed digest and a missing one fail), the deadline (what is left is
"not run", exit 3), the report rewritten after every phase, and the carried cubin bundle (keyed by the
sources, loaded in place of an NVRTC build). `--cpu-selftest` runs all of it end to end as CI's check."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from ccoll import kernels
from ccoll.gpucheck import check as gpu_check
from ccoll.gpucheck import expected as gpu_expected
from ccoll.gpucheck import matrix

CPU = torch.device("cpu")
SPEC = "int4:block=24"  # small, no zfpy needed, deterministic


@pytest.fixture(scope="module")
def expected():
    return gpu_expected.load()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_given_no_cuda_when_running_gpu_check_expect_exit_2_a_clear_line_and_a_report(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ccoll.gpucheck", "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "gpu-check: no CUDA device" in proc.stdout and "pip" not in proc.stdout + proc.stderr
    assert json.loads((tmp_path / "r" / "gpu_check.json").read_text())["status"] == "no_cuda"


def test_given_each_input_kind_expect_the_values_it_promises():
    f32 = matrix.make_input(torch, "subnormal", 4099, torch.float32, seed=1)
    mag = f32.abs()
    assert bool(((mag > 0) & (mag < torch.finfo(torch.float32).tiny)).any())  # fp32 subnormals
    assert bool(((mag >= 2.0**-98) & (mag < 2.0**-97)).any())  # zfp's tiny-block edge
    f64 = matrix.make_input(torch, "subnormal", 4099, torch.float64, seed=1).abs()
    assert bool(((f64 > 0) & (f64 < torch.finfo(torch.float64).tiny)).any())
    bad = matrix.make_input(torch, "nonfinite", 255, torch.bfloat16, seed=2)
    assert bool(bad.isnan().any()) and bool((bad == float("inf")).any()) and bool((bad == float("-inf")).any())
    view = matrix.make_input(torch, "misaligned", 255, torch.float32, seed=3)
    assert view.data_ptr() % 16 != 0 and view.is_contiguous()


def test_given_the_committed_digests_when_the_torch_backend_runs_one_spec_expect_every_case_equal(tmp_path, expected):
    report = gpu_check.Report(tmp_path, gpu_check.Deadline(None))
    gpu_check.compare_bytes(torch, "torch", CPU, expected, report, [SPEC])
    bytes_ = json.loads((tmp_path / "gpu_check.json").read_text())["phases"]["bytes"]
    assert bytes_["status"] == "done" and bytes_["compared"] == bytes_["equal"] == bytes_["cases"] > 0, bytes_


def test_given_a_backend_that_corrupts_one_payload_byte_expect_the_op_named_as_a_mismatch(monkeypatch, expected):
    from ccoll.codecs.quant import BlockQuantCodec

    honest = BlockQuantCodec._encode_rows_torch

    def corrupt(self, src, out, row_numel, feedback, salt):  # every encode (one row or many) goes through it
        honest(self, src, out, row_numel, feedback, salt)
        out[:, -1] ^= 1

    monkeypatch.setattr(BlockQuantCodec, "_encode_rows_torch", corrupt)
    report = gpu_check.Report(None, gpu_check.Deadline(None))
    gpu_check.compare_bytes(torch, "torch", CPU, expected, report, [SPEC])
    phase = report.phase("bytes")
    assert phase["status"] == "failed" and len(phase["mismatches"]) == phase["cases"]
    assert all(": encode, " in m for m in phase["mismatches"]), phase["mismatches"][:3]
    assert report.finish() == gpu_check.EXIT_MISMATCH


def test_given_no_expected_file_expect_every_case_missing_and_a_failure_not_a_skip():
    report = gpu_check.Report(None, gpu_check.Deadline(None))
    gpu_check.compare_bytes(torch, "torch", CPU, {}, report, [SPEC])
    phase = report.phase("bytes")
    assert phase["status"] == "failed" and len(phase["missing"]) == phase["cases"] > 0
    assert report.finish() == gpu_check.EXIT_MISMATCH


def test_given_the_deadline_passed_expect_everything_not_run_exit_3_and_a_report_per_phase(tmp_path, expected):
    report = gpu_check.run(torch, CPU, "torch", tmp_path, gpu_check.Deadline(0.0), expected, [SPEC, "fp16"])
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert data["exit_code"] == report.data["exit_code"] == gpu_check.EXIT_INCOMPLETE and data["status"] == "incomplete"
    assert data["phases"]["bytes"]["not_run"] == data["phases"]["bytes"]["cases"] > 0
    assert data["phases"]["collectives"]["not_run"] == ["fp16"] and data["phases"]["collectives"]["status"] == "partial"
    assert "incomplete" in (tmp_path / "gpu_check.md").read_text()


def test_given_a_phase_ends_expect_the_report_on_disk_to_show_it(tmp_path, expected, monkeypatch):
    seen = []
    honest = gpu_check.compare_collectives

    def spy(torch_, device, expected_, report, *args, **kw):  # the bytes phase just ended
        seen.append(json.loads((tmp_path / "gpu_check.json").read_text())["phases"])
        return honest(torch_, device, expected_, report, *args, **kw)

    monkeypatch.setattr(gpu_check, "compare_collectives", spy)
    gpu_check.run(torch, CPU, "torch", tmp_path, gpu_check.Deadline(None), expected, [SPEC], world_sizes=())
    assert seen and seen[0]["bytes"]["status"] == "done" and seen[0]["collectives"]["status"] == "not run"


def test_given_a_bundled_cubin_expect_it_loaded_instead_of_nvrtc_and_a_source_edit_to_change_its_key(tmp_path, monkeypatch):
    monkeypatch.setattr(kernels, "BUILD_DIR", tmp_path)
    name = kernels.kernel_names()[0]
    path = kernels.bundle_path(name, "sm_90")
    path.parent.mkdir()
    path.write_bytes(b"cubin bytes")
    monkeypatch.setattr(kernels, "_cached_build", lambda *a: pytest.fail("compiled although a bundle matched"))
    assert kernels._module_image(name, (9, 0)) == (b"cubin bytes", f"bundle {path.name}")
    key = kernels.bundle_key(name, "sm_90")
    src = tmp_path / "kernels"
    src.mkdir()
    for dep in kernels._deps(name):
        (src / dep.name).write_bytes(dep.read_bytes())
    monkeypatch.setattr(kernels, "KERNEL_DIR", src)
    monkeypatch.setattr(kernels, "NVRTC_OPTIONS", tuple(f"-I{src}" if o.startswith("-I") else o
                                                        for o in kernels.NVRTC_OPTIONS))
    assert kernels.bundle_key(name, "sm_90") == key  # the checkout's path is not part of the key
    (src / f"{name}.cu").write_text((src / f"{name}.cu").read_text() + "\n// edited\n")
    assert kernels.bundle_key(name, "sm_90") != key
    assert kernels.bundle_key(name, "sm_80") != kernels.bundle_key(name, "sm_90")


def _wall_seconds(torch_, fn, iters):
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return max(time.perf_counter() - t0, 1e-9) / iters


def test_given_the_throughput_phase_on_cpu_tensors_expect_copy_first_every_registry_codec_and_the_rest_not_run():
    report = gpu_check.Report(None, gpu_check.Deadline(None))
    gpu_check.throughput(torch, 1 << 16, 1, report, device="cpu", backend="torch", seconds=_wall_seconds)
    rows = report.phase("throughput")["rows"]
    assert report.phase("throughput")["status"] == "done" and rows[0]["codec"] == "device copy"
    assert {r["codec"] for r in rows if r.get("status") == "measured"} == set(matrix._registry_specs())
    assert all(r["encode_of_copy"] > 0 for r in rows if r.get("status") == "measured")
    late = gpu_check.Report(None, gpu_check.Deadline(0.0))
    gpu_check.throughput(torch, 1 << 16, 1, late, device="cpu", backend="torch", seconds=_wall_seconds)
    assert late.phase("throughput")["status"] == "partial"
    assert "not run" in "\n".join(gpu_check.summary_lines(late.data))


@pytest.mark.slow
def test_given_cpu_selftest_expect_equal_bytes_and_each_negative_control_to_fail_as_it_must(tmp_path):
    rc = gpu_check.main(["--cpu-selftest", "--out", str(tmp_path), "--specs", "int4:block=24;fp16;zfp:rate=4,dims=2"])
    data = json.loads((tmp_path / "run" / "gpu_check.json").read_text())
    assert rc == 0 and data["status"] == "passed", data["phases"]["bytes"]
    assert data["phases"]["collectives"]["equal"] > 0
    assert json.loads((tmp_path / "tampered" / "gpu_check.json").read_text())["exit_code"] == 1
    assert json.loads((tmp_path / "deadline" / "gpu_check.json").read_text())["exit_code"] == 3
