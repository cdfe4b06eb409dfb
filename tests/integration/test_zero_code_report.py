"""What a ``ccoll-run`` user sees, per rank, with scripts that never import ccoll (2 CPU ranks, gloo, torchrun
writing each rank's stderr to its own file): a plain all_reduce loop with no optimizer (zero_code_plain.py)
gets rank 0's announcement and exit table, or -- with a policy whose ``default:`` rule keeps the unplaced
WORLD group native -- exactly one warning in the whole launch naming that rule; a Hugging Face Trainer
(zero_code_hf_train.py) gets ccoll's figures in ``trainer.state.log_history``. One launch per test
(~10-20 s on the loaded 2-core machine)."""
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
sys.path.insert(0, str(HERE.parent / "dist"))
from launch import free_port  # noqa: E402

pytestmark = pytest.mark.slow

INT4 = "int4:block=64,round=nearest,seed=0"
INT4_RATIO = 32 / 4.5  # int4 with an fp32 scale per 64 values


def _launch(tmp_path: pathlib.Path, script: str, *script_args: str, policy: pathlib.Path) -> tuple[str, dict[int, str]]:
    """Run ``script`` on 2 ranks under ccoll-run; returns the launch's whole output and each rank's stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCOLL_")}
    env.update(CCOLL_POLICY=str(policy), CCOLL_STATS=str(tmp_path / "stats.json"), OMP_NUM_THREADS="1",
               PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    logs = tmp_path / "logs"
    cmd = [sys.executable, "-m", "ccoll.run", "--", sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
           "2", "--master_port", str(free_port()), "--log-dir", str(logs), "--redirects", "3", str(HERE / script),
           *script_args]
    proc = subprocess.run(cmd, env=env, cwd=str(tmp_path), text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=240)
    stderr = {int(p.parent.name): p.read_text() for p in logs.glob("*/attempt_0/*/stderr.log")}
    assert proc.returncode == 0, proc.stdout[-6000:] + "".join(stderr.values())[-6000:]
    assert sorted(stderr) == [0, 1], list(logs.rglob("*"))
    return proc.stdout + "".join(stderr.values()), stderr


def _table(err: str) -> list[list[str]]:
    """The exit table's rows (split on blanks) in one rank's stderr; [] if there is none."""
    lines = err.splitlines()
    heads = [i for i, ln in enumerate(lines) if ln.startswith("ccoll: traffic of rank ")]
    if not heads:
        return []
    assert len(heads) == 1, err
    assert lines[heads[0] + 1].split() == ["dim", "op", "codec", "calls", "raw", "wire", "ratio", "time"], err
    return [ln.split() for ln in lines[heads[0] + 2:] if ln.strip()]


def test_given_plain_allreduce_script_and_default_rule_when_ccoll_run_expect_rank0_announces_and_prints_table(tmp_path):
    policy = tmp_path / "default_int4.yaml"
    policy.write_text("version: 1\ndefault:\n  codec: int4:block=64\n")
    everything, err = _launch(tmp_path, "zero_code_plain.py", "--calls", "5", "--destroy", policy=policy)
    # rank 0: the announcement at the first compressed call (no optimizer step ever happens), then the table
    assert re.findall(r"^ccoll: default compressing: .*$", err[0], re.M) == [
        f"ccoll: default compressing: all_reduce {INT4} (first call: 1.05 MB -> 0.15 MB, 7.11x)"], err[0]
    assert err[0].index("ccoll: default compressing") < err[0].index("ccoll: traffic of rank 0")
    rows = _table(err[0])
    assert rows == [["default", "all_reduce", INT4, "5", "5.24", "MB", "737.28", "KB", "7.11x", rows[0][-2], "s"]]
    assert float(rows[0][-2]) > 0
    # rank 1: nothing (the same figures are in its stats file)
    assert "ccoll" not in err[1], err[1]
    assert "nothing was compressed" not in everything
    dumps = [json.loads((tmp_path / f"stats.rank{r}.json").read_text()) for r in range(2)]
    for dump in dumps:
        (row,) = dump["stats"]
        assert (row["dim"], row["op"], row["codec"], row["calls"]) == ("default", "all_reduce", INT4, 5)
        assert row["raw_bytes"] / row["wire_bytes"] == pytest.approx(INT4_RATIO)
        assert dump["summary"]["compressed"] is True


def test_given_plain_script_and_policy_without_compressing_default_rule_when_ccoll_run_expect_one_warning_and_table(tmp_path):
    everything, err = _launch(tmp_path, "zero_code_plain.py", "--calls", "3", policy=HYBRID)  # group left alive
    warnings = [ln for ln in everything.splitlines() if "nothing was compressed" in ln]
    assert len(warnings) == 1, everything[-4000:]
    (w,) = warnings
    assert w.startswith(f"ccoll: policy {HYBRID} compresses dp/pp/tp, but by the end of the run (0 optimizer steps) "
                        "nothing was compressed: no process group was placed on a parallel dimension"), w
    assert "the policy has no `default:` rule that compresses all_reduce" in w and "`default: {codec: int4:block=64}`" in w
    assert w in err[0]  # rank 0's, before its table
    assert err[0].index(w) < err[0].index("ccoll: traffic of rank 0")
    assert _table(err[0]) == [["default", "all_reduce", "native", "3", "3.15", "MB", "3.15", "MB", "1.00x",
                               _table(err[0])[0][-2], "s"]]
    assert "ccoll" not in err[1], err[1]
    dump = json.loads((tmp_path / "stats.rank0.json").read_text())
    assert dump["summary"]["compressed"] is False and "`default:` rule" in dump["summary"]["why"]


def test_given_hf_trainer_when_ccoll_run_expect_ccoll_figures_in_log_history_and_the_table(tmp_path):
    pytest.importorskip("transformers")
    everything, err = _launch(tmp_path, "zero_code_hf_train.py", str(tmp_path), policy=HYBRID)
    for r in range(2):
        history = json.loads((tmp_path / f"log_history.rank{r}.json").read_text())
        logged = [h for h in history if "loss" in h]
        assert [h["step"] for h in logged] == [2, 4], history  # logging_steps=2, max_steps=4
        for h in logged + [history[-1]]:  # the end-of-training metrics too
            assert h["ccoll/dp_ratio"] == pytest.approx(INT4_RATIO, rel=0.01), h
            assert 0 < h["ccoll/dp_wire_MB"] < h["ccoll/dp_raw_MB"]
        # cumulative: the second log carries the first log's traffic and that of two more steps
        assert logged[1]["ccoll/dp_raw_MB"] == pytest.approx(2 * logged[0]["ccoll/dp_raw_MB"])
    assert re.findall(r"^ccoll: dp compressing: all_reduce int4:block=64", everything, re.M) == \
        ["ccoll: dp compressing: all_reduce int4:block=64"]
    dp = [row for row in _table(err[0]) if row[0] == "dp"]
    assert [row[1:4] for row in dp] == [["all_reduce", INT4, "4"]] and dp[0][8] == "7.11x"  # one bucket per step
    assert "ccoll" not in err[1] and "nothing was compressed" not in everything
