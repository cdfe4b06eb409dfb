"""Configured where DeepSpeed users configure: a ``"ccoll"`` block in the DeepSpeed config, honoured by
``deepspeed.initialize`` under ``ccoll-run`` with no CCOLL_POLICY and no change to the script; and one
training step counted as one under ZeRO-2/3 (DeepSpeed steps its inner optimizer once per parameter group:
a Hugging Face Trainer's two groups were counted as two steps, so ``warmup_steps`` ended early).

Real launches: ``python -m ccoll.run [--policy deepspeed] -- torchrun --nproc_per_node 2
zero_code_hf_ds_train.py`` — a Hugging Face Trainer with DeepSpeed ZeRO on 2 CPU gloo ranks
(DS_ACCELERATOR=cpu), a script that never imports ccoll for training. ~15-30 s per launch."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCRIPT = HERE / "zero_code_hf_ds_train.py"
sys.path.insert(0, str(HERE.parent / "dist"))
from launch import free_port  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 4


def _launch(tmp_path: pathlib.Path, stage: int, ccoll_args: list[str], script_args: list[str]) -> tuple[str, dict, list]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCOLL_")}
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", DS_BUILD_OPS="0", PYTHONPATH=str(REPO),
               PYTHONWARNINGS="ignore")
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "ccoll.run", *ccoll_args, "--stats", str(tmp_path / "stats.json"), "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(SCRIPT), str(stage), str(STEPS), str(out), *script_args]
    proc = subprocess.run(cmd, env=env, cwd=str(tmp_path), text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:]
    stats = [json.loads((tmp_path / f"stats.rank{r}.json").read_text())["stats"] for r in range(2)]
    return proc.stdout, json.loads(out.read_text()), stats


def _calls(rows: list[dict], op: str) -> tuple[int, int]:
    """(compressed, native) calls of dp ``op``."""
    mine = [r for r in rows if r["dim"] == "dp" and r["op"] == op]
    return (sum(r["calls"] for r in mine if r["codec"] != "native"),
            sum(r["calls"] for r in mine if r["codec"] == "native"))


def test_given_ds_json_with_ccoll_block_on_command_line_when_ccoll_run_without_policy_expect_zero2_dp_compressed(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
                              "gradient_accumulation_steps": "auto", "zero_optimization": {"stage": 2},
                              "steps_per_print": 10 ** 9, "ccoll": {"policy": "hybrid"}}))
    out, result, stats = _launch(tmp_path, 2, [], ["--deepspeed", str(ds)])
    assert result["policy"].endswith("hybrid.yaml")
    assert result["global_step"] == STEPS and result["ccoll_steps"] == STEPS  # not 2 per step
    for rows in stats:
        compressed, _ = _calls(rows, "all_reduce")
        assert compressed == STEPS, rows  # one int4 gradient all-reduce per step, on both ranks
    assert "ccoll: dp compressing" in out


def test_given_inline_policy_in_code_built_config_when_policy_deepspeed_expect_zero3_warmup_by_training_steps(tmp_path):
    """The script's config (a dict) has ``"ccoll": {"policy": {...}}`` with dp ``warmup_steps: 2``: of 4
    training steps, the first 2 reduce-scatter natively and the last 2 compressed, as many calls each."""
    out, result, stats = _launch(tmp_path, 3, ["--policy", "deepspeed"], [])
    assert result["policy"] == "DeepSpeed config 'ccoll' block"
    assert result["global_step"] == STEPS and result["ccoll_steps"] == STEPS
    for rows in stats:
        compressed, native = _calls(rows, "reduce_scatter")
        assert compressed == native > 0, rows


def test_given_ccoll_run_policy_and_a_different_ds_block_when_initialize_expect_policy_error_naming_both(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
                              "gradient_accumulation_steps": "auto", "zero_optimization": {"stage": 2},
                              "ccoll": {"policy": "hybrid"}}))
    with pytest.raises(AssertionError) as failed:
        _launch(tmp_path, 2, ["--policy", "naive"], ["--deepspeed", str(ds)])
    text = str(failed.value)
    assert "PolicyError" in text and "two policies" in text and "naive.yaml" in text and "hybrid.yaml" in text
