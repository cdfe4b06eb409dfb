"""Zero code for the stacks most users are on: ``python -m ccoll.run -- torchrun --nproc_per_node 2 script``
with a script that never imports ccoll (zero_code_models_train.py) building plain DDP, DDP through
accelerate's ``Accelerator.prepare``, or FSDP2 ``fully_shard`` (2 CPU ranks, gloo). ccoll attaches its
hooks by itself (ccoll.auto); the stats files must show dp compressed at the codec's ratio, the loss must
stay close to the script's own uncompressed reference, the replicas identical; a user's own DDP hook is
left alone and said once. Each test is one launch (~15-30 s on the loaded 2-core machine)."""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
HYBRID = REPO / "configs" / "hybrid.yaml"
SCRIPT = HERE / "zero_code_models_train.py"
sys.path.insert(0, str(HERE.parent / "dist"))
from launch import free_port  # noqa: E402

pytestmark = pytest.mark.slow

LINE = re.compile(r"rank (\d) loss (\S+) ref_loss (\S+) param_delta (\S+) replicas_identical (True|False)")  # ranks may print on one line
INT4_RATIO = 32 / 4.5  # int4 with an fp32 scale per 64 values


def _launch(tmp_path: pathlib.Path, *script_args: str, policy: pathlib.Path = HYBRID) -> tuple[str, list[dict]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCOLL_")}
    env.update(CCOLL_POLICY=str(policy), CCOLL_STATS=str(tmp_path / "stats.json"), OMP_NUM_THREADS="1",
               PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "ccoll.run", "--", sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
           "2", "--master_port", str(free_port()), str(SCRIPT), *script_args]
    proc = subprocess.run(cmd, env=env, cwd=str(tmp_path), text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=240)
    assert proc.returncode == 0, proc.stdout[-6000:]
    dumps = [json.loads((tmp_path / f"stats.rank{r}.json").read_text()) for r in range(2)]
    assert not (tmp_path / "stats.json").exists()  # the torchrun launcher joins no world: no file
    return proc.stdout, dumps


def _results(out: str) -> list[tuple]:
    found = sorted((int(r), float(loss), float(ref), float(delta), ok == "True")
                   for r, loss, ref, delta, ok in LINE.findall(out))
    assert [f[0] for f in found] == [0, 1], out[-3000:]
    return found


def _dp(dump: dict, op: str) -> dict:
    rows = [r for r in dump["stats"] if r["dim"] == "dp" and r["op"] == op and r["codec"] != "native"]
    assert len(rows) == 1, dump
    return rows[0]


def _check_compressed_training(out: str, dumps: list[dict], op: str, calls: int) -> None:
    for _, loss, ref, delta, identical in _results(out):
        assert identical  # every rank decoded the same bytes
        assert abs(loss - ref) <= 0.01 * ref, (loss, ref)
        assert 0 < delta < 1e-2  # compressed (not bit-equal to the reference) yet close
    for dump in dumps:
        row = _dp(dump, op)
        assert row["codec"].startswith("int4:block=64") and row["calls"] == calls
        assert row["raw_bytes"] / row["wire_bytes"] == pytest.approx(INT4_RATIO, rel=0.01)
        assert dump["summary"]["compressed"] is True
    # what the user sees, from rank 0: one line for dp at its first compressed call, the table at exit
    assert len(re.findall(rf"ccoll: dp compressing: {op} int4:block=64\S* \(first call: ", out)) == 1, out[-3000:]
    assert out.count("ccoll: traffic of rank 0") == 1 and "ccoll: traffic of rank 1" not in out
    assert re.search(rf"^dp +{op} +int4:block=64\S* +{calls} .* 7\.\d\dx ", out, re.M), out[-3000:]
    assert "nothing was compressed" not in out


def test_given_plain_ddp_script_when_ccoll_run_torchrun_expect_dp_gradients_int4_and_loss_close(tmp_path):
    out, dumps = _launch(tmp_path, "ddp")
    _check_compressed_training(out, dumps, "all_reduce", calls=20)  # one bucket per step
    assert [m["status"] for m in dumps[0]["summary"]["models"]] == ["compressing"]


def test_given_accelerate_prepare_when_ccoll_run_torchrun_expect_dp_gradients_int4_and_loss_close(tmp_path):
    pytest.importorskip("accelerate")
    out, dumps = _launch(tmp_path, "accelerate")
    _check_compressed_training(out, dumps, "all_reduce", calls=20)


def test_given_fsdp2_fully_shard_when_ccoll_run_torchrun_expect_dp_reduce_scatter_int4_and_loss_close(tmp_path):
    out, dumps = _launch(tmp_path, "fsdp")
    _check_compressed_training(out, dumps, "reduce_scatter", calls=40)  # two sharded layers per step
    for dump in dumps:  # FSDP2's own parameter all-gathers (native under hybrid) are dp traffic, not default
        assert not [r for r in dump["stats"] if r["dim"] == "default"], dump["stats"]
        gathers = [r for r in dump["stats"] if r["dim"] == "dp" and r["op"] == "all_gather" and r["codec"] == "native"]
        assert gathers and gathers[0]["calls"] >= 40, dump["stats"]


def test_given_user_ddp_hook_when_ccoll_run_expect_hook_left_alone_said_once_and_stats_say_why(tmp_path):
    out, dumps = _launch(tmp_path, "ddp", "--user-hook")
    for _, loss, ref, delta, identical in _results(out):
        assert identical and delta == 0.0  # torch's allreduce_hook ran: exactly the uncompressed result
    assert out.count("has your comm hook allreduce_hook; ccoll leaves it alone") == 1, out[-3000:]
    for dump in dumps:
        assert not [r for r in dump["stats"] if r["codec"] != "native"]
        assert dump["summary"]["compressed"] is False
        assert "your own comm hook (allreduce_hook)" in dump["summary"]["why"]
    # the "nothing compressed" warning, once (rank 0), names the hook first; then that the hook's own
    # all_reduce ran on WORLD, which no dimension claims, under hybrid.yaml's native `default:` rule
    warnings = [ln for ln in out.splitlines() if "nothing was compressed" in ln]
    assert len(warnings) == 1, out[-3000:]
    assert 0 < warnings[0].index("your own comm hook (allreduce_hook)") < warnings[0].index(
        "no `default:` rule that compresses all_reduce"), warnings[0]


def test_given_policy_attach_ddp_false_when_ccoll_run_expect_nothing_compressed_and_file_says_opted_out(tmp_path):
    policy = tmp_path / "no_ddp.yaml"
    policy.write_text(HYBRID.read_text() + "\nattach: {ddp: false}\n")
    out, dumps = _launch(tmp_path, "ddp", "--steps", "3", policy=policy)
    for dump in dumps:  # DDP's C++ reducer ran alone: ccoll recorded nothing, yet the file is there
        assert dump["summary"]["compressed"] is False and "attach: {ddp: false}" in dump["summary"]["why"]
    assert "attach: {ddp: false}" in out
