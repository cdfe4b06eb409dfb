"""Zero-code activation: ``CCOLL_POLICY=... python -m ccoll.run -- <launcher> <script>`` (what the
``ccoll-run`` console script runs) with real launchers -- torchrun, the deepspeed launcher, mpirun -- on 2
CPU ranks, running training scripts that never import ccoll. The ranks' CCOLL_STATS dumps must show the
gradients compressed on dp by the automatic resolver at the codec's ratio."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
HYBRID = REPO / "configs" / "hybrid.yaml"
sys.path.insert(0, str(HERE.parent / "dist"))
from launch import free_port  # noqa: E402


def _spec(s: str) -> str:
    from ccoll import get_codec

    return get_codec(s).spec


def _env(tmp_path: pathlib.Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCOLL_")}
    env.update(CCOLL_POLICY=str(HYBRID), CCOLL_STATS=str(tmp_path / "stats.json"), OMP_NUM_THREADS="1",
               DS_ACCELERATOR="cpu", DS_BUILD_OPS="0", PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    env.update(extra)
    return env


def _run(cmd: list[str], env: dict, cwd: pathlib.Path, timeout_s: float = 840) -> str:
    proc = subprocess.run([sys.executable, "-m", "ccoll.run", "--", *cmd], env=env, cwd=str(cwd), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout_s)
    assert proc.returncode == 0, proc.stdout[-6000:]
    return proc.stdout


def _dp_rows(tmp_path: pathlib.Path, world: int) -> list[dict]:
    out = []
    for rank in range(world):
        dumped = json.loads((tmp_path / f"stats.rank{rank}.json").read_text())
        assert dumped["rank"] == rank
        out.append({(r["dim"], r["op"], r["codec"]): r for r in dumped["stats"]})
    return out


@pytest.mark.slow
def test_given_torchrun_and_plain_script_when_ccoll_run_expect_world_mesh_dp_gradients_int4(tmp_path):
    out = _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                str(free_port()), str(HERE / "zero_code_train.py")], _env(tmp_path), tmp_path)
    assert out.count("replicas_identical True") == 2, out[-3000:]
    int4 = _spec("int4:block=64")
    for rows in _dp_rows(tmp_path, 2):
        row = rows[("dp", "all_reduce", int4)]
        assert row["calls"] == 2 * 3  # both weights' gradients, every step
        assert row["raw_bytes"] / row["wire_bytes"] == pytest.approx(32 / 4.5, rel=0.01)
        assert rows[("dp", "all_reduce", "native")]["calls"] == 2 * 3  # the biases: below min_bytes
        assert not [k for k in rows if k[0] == "default"]  # WORLD (the mesh's dp group) was placed on dp
    # the torchrun launcher process is activated too but joins no world: it must not leave an empty table
    assert not (tmp_path / "stats.json").exists()


@pytest.mark.slow
@pytest.mark.timeout(900)  # DeepSpeed's CPU init waits on a shared JIT-extension lock (minutes on a busy machine)
def test_given_deepspeed_launcher_and_plain_script_when_ccoll_run_expect_dp_gradients_int4(tmp_path):
    deepspeed_exe = shutil.which("deepspeed", path=os.path.dirname(sys.executable))
    if deepspeed_exe is None:
        pytest.skip("the deepspeed launcher is not installed in this environment")
    out = _run([deepspeed_exe, "--num_gpus", "2", "--master_port", str(free_port()),
                str(HERE / "zero_code_ds_train.py")], _env(tmp_path), tmp_path)
    assert out.count("final loss") == 2, out[-3000:]
    int4 = _spec("int4:block=64")
    for rows in _dp_rows(tmp_path, 2):
        row = rows[("dp", "all_reduce", int4)]
        assert row["calls"] >= 3  # DeepSpeed's flattened gradient bucket, once per step
        assert row["raw_bytes"] / row["wire_bytes"] == pytest.approx(32 / 4.5, rel=0.01)
        assert rows[("dp", "broadcast", "native")]["calls"] > 0  # initial parameter broadcast stays exact


@pytest.mark.slow
@pytest.mark.mpi
def test_given_mpirun_and_plain_script_when_ccoll_run_expect_dp_gradients_int4(tmp_path):
    from launch import mpiexec

    env = _env(tmp_path, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    _run([mpiexec(), "--allow-run-as-root", "--oversubscribe", "-n", "2", "-x", "CCOLL_POLICY", "-x", "PYTHONPATH",
          "-x", "CCOLL_STATS", "-x", "MASTER_ADDR", "-x", "MASTER_PORT", sys.executable,
          str(HERE / "zero_code_train.py")], env, tmp_path)
    int4 = _spec("int4:block=64")
    for rows in _dp_rows(tmp_path, 2):
        assert rows[("dp", "all_reduce", int4)]["calls"] == 2 * 3


# --- the activation itself, one process each (fast) ------------------------------------------------------
def _python(code: str, env: dict, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=str(cwd), text=True, capture_output=True,
                          timeout=120)


def _activated_env(tmp_path, **extra) -> dict:
    from ccoll.run import activation_env

    return activation_env(_env(tmp_path, **extra))


def test_given_activation_env_when_python_imports_torch_expect_patch_installed_before_user_code(tmp_path):
    code = ("import sys; assert 'ccoll' not in sys.modules; import torch; import ccoll.patch as p; "
            "print(p.is_installed(), type(p._STATE.resolver).__name__, p.current_policy().source)")
    proc = _python(code, _activated_env(tmp_path), tmp_path)
    assert proc.returncode == 0, proc.stderr
    installed, resolver, source = proc.stdout.split()
    assert installed == "True" and resolver == "AutoResolver" and source == str(HYBRID)


def test_given_activation_env_when_process_never_imports_torch_expect_nothing_imported(tmp_path):
    proc = _python("import sys; print('torch' in sys.modules, 'ccoll' in sys.modules)", _activated_env(tmp_path), tmp_path)
    assert proc.returncode == 0 and proc.stdout.split() == ["False", "False"], proc.stderr


def test_given_no_policy_when_sitecustomize_on_path_expect_nothing_installed(tmp_path):
    env = _activated_env(tmp_path)
    del env["CCOLL_POLICY"]
    proc = _python("import torch, sys; print('ccoll.patch' in sys.modules)", env, tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr


def test_given_existing_sitecustomize_when_activated_expect_it_still_runs(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['SITE_RAN'] = '1'\n")
    env = _activated_env(tmp_path)
    env["PYTHONPATH"] += os.pathsep + str(site)
    proc = _python("import os, torch, ccoll.patch as p; print(os.environ.get('SITE_RAN'), p.is_installed())", env, tmp_path)
    assert proc.returncode == 0 and proc.stdout.split() == ["1", "True"], proc.stderr


def test_given_policy_broken_after_launch_when_rank_imports_torch_expect_loud_failure(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ndp: {codec: int3}\n")
    env = _activated_env(tmp_path)
    env["CCOLL_POLICY"] = str(bad)
    proc = _python("import torch; print('user code ran')", env, tmp_path)
    assert proc.returncode != 0 and "user code ran" not in proc.stdout
    assert "PolicyError" in proc.stderr and "int3" in proc.stderr


def test_given_bad_or_missing_policy_when_ccoll_run_expect_exit_2_before_launching(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ntp: {codec: int3}\n")
    marker = tmp_path / "launched"
    cmd = [sys.executable, "-m", "ccoll.run", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    for policy in (str(bad), None):
        env = _env(tmp_path, CCOLL_POLICY=policy or "")
        proc = subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=120)
        assert proc.returncode == 2 and "ccoll-run:" in proc.stderr, proc.stderr
        assert not marker.exists()


def test_given_console_script_entry_when_reading_pyproject_expect_ccoll_run_main():
    import tomllib

    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert data["project"]["scripts"]["ccoll-run"] == "ccoll.run:main"
