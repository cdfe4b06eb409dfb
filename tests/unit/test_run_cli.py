"""``ccoll-run`` as users meet it (usage, flags, errors that say what was wrong and what is allowed, without
a stall) and the DeepSpeed config's ``"ccoll"`` block (ccoll/patch/dsconfig.py). The command runs as a real
subprocess; the block's reading and its conflict rule run in process."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
import types

import pytest

import ccoll.frameworks as frameworks
import ccoll.patch as patch
from ccoll.errors import PolicyError
from ccoll.patch import dsconfig
from ccoll.run import activation_env, deepspeed_config_in

REPO = pathlib.Path(__file__).resolve().parents[2]


def _ccoll_run(*args: str, env_extra: "dict | None" = None, cwd: "pathlib.Path | None" = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCOLL_")}
    env.update(PYTHONPATH=str(REPO), **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "ccoll.run", *args], env=env, text=True, capture_output=True,
                          timeout=120, cwd=cwd)


@pytest.fixture(autouse=True)
def _clean():
    patch.uninstall()
    yield
    patch.uninstall()


def test_given_help_or_no_command_when_ccoll_run_expect_usage_and_exit_0_or_2():
    helped = _ccoll_run("--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: ccoll-run") and "--policy" in helped.stdout
    bare = _ccoll_run()
    assert bare.returncode == 2 and "usage: ccoll-run" in bare.stderr and "no command" in bare.stderr


def test_given_no_policy_anywhere_when_ccoll_run_expect_exit_2_naming_every_way_once_prefixed(tmp_path):
    proc = _ccoll_run("--", sys.executable, "-c", "open('launched', 'w')", cwd=tmp_path)
    assert proc.returncode == 2 and not (tmp_path / "launched").exists()
    assert proc.stderr.count("ccoll-run:") == 1, proc.stderr  # once, not "ccoll-run: ccoll-run: ..."
    for hint in ("--policy", "CCOLL_POLICY", "hybrid", '"ccoll"', "--deepspeed_config", "--policy deepspeed"):
        assert hint in proc.stderr, (hint, proc.stderr)


def test_given_policy_and_stats_flags_when_ccoll_run_expect_shipped_name_resolved_and_paths_absolute(tmp_path):
    code = "import os; print(os.environ['CCOLL_POLICY']); print(os.environ['CCOLL_STATS'])"
    proc = _ccoll_run("--policy", "hybrid", "--stats", "logs/c.json", sys.executable, "-c", code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    policy, stats = proc.stdout.split()
    assert policy == str(REPO / "configs" / "hybrid.yaml") and stats == str(tmp_path / "logs" / "c.json")
    typo = _ccoll_run("--policy", "hybird", sys.executable, "-c", "pass")
    assert typo.returncode == 2 and "hybird" in typo.stderr and "hybrid" in typo.stderr and "Traceback" not in typo.stderr


def test_given_ds_json_named_on_command_line_when_resolving_expect_block_found_validated_or_refused(tmp_path):
    good, bad, none = tmp_path / "good.json", tmp_path / "bad.json", tmp_path / "none.json"
    good.write_text(json.dumps({"ccoll": {"policy": "naive"}}))
    bad.write_text(json.dumps({"ccoll": {"policy": {"version": 1, "dp": {"codec": "int3"}}}}))
    none.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    for command in (["deepspeed", "t.py", "--deepspeed_config", str(good)], ["python", "t.py", f"--deepspeed={good}"]):
        assert deepspeed_config_in(command) == str(good)
        assert activation_env({}, command=command)["CCOLL_POLICY"] == "deepspeed"
    with pytest.raises(PolicyError, match="int3"):
        activation_env({}, command=["t.py", "--deepspeed", str(bad)])
    with pytest.raises(PolicyError, match="no policy"):
        activation_env({}, command=["t.py", "--deepspeed", str(none)])


def test_given_rank_without_policy_under_activation_when_importing_torch_expect_policy_error_at_once(tmp_path):
    """mpirun -x PYTHONPATH without -x CCOLL_POLICY: the rank used to run uncompressed while the others
    waited 120 s for its policy fingerprint; now it stops at ``import torch`` and says why."""
    env = activation_env({"PYTHONPATH": str(REPO)}, policy="hybrid")
    del env["CCOLL_POLICY"]
    env["OMPI_COMM_WORLD_RANK"] = "3"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", "import torch; print('user code ran')"], env=env, text=True,
                          capture_output=True, timeout=120, cwd=tmp_path)
    assert proc.returncode != 0 and "user code ran" not in proc.stdout
    assert "PolicyError" in proc.stderr and "rank 3" in proc.stderr and "-x CCOLL_POLICY" in proc.stderr
    assert time.monotonic() - t0 < 60  # no fingerprint wait (120 s)


def test_given_ccoll_blocks_when_reading_expect_name_path_beside_json_mapping_or_typed_error(tmp_path):
    (tmp_path / "mine.yaml").write_text("version: 1\ndp: {codec: bf16}\n")
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"ccoll": {"policy": "mine.yaml"}}))
    assert dsconfig.load_policy(str(cfg)).rule("dp", "all_reduce").codec_obj.name == "bf16"  # beside the JSON
    assert dsconfig.load_policy({"ccoll": {"policy": "naive"}}).source.endswith("naive.yaml")
    assert dsconfig.load_policy({"zero_optimization": {"stage": 1}}) is None
    inline = dsconfig.load_policy({"ccoll": {"policy": {"version": 1, "tp": {"codec": "int8:block=256"}}}})
    assert inline.rule("tp", "all_reduce").compresses and not inline.rule("dp", "all_reduce").compresses
    for block, words in (("hybrid", "mapping"), ({"polcy": "hybrid"}, "unknown key(s) polcy"),
                         ({}, "names no policy"), ({"policy": 3}, "must be a name")):
        with pytest.raises(PolicyError, match=words.replace("(", r"\(").replace(")", r"\)")):
            dsconfig.load_policy({"ccoll": block})


def test_given_installed_policy_when_ds_block_agrees_or_not_expect_kept_or_policy_error():
    def initialize(*args, **kwargs):
        return "engine", kwargs

    Module = types.ModuleType("deepspeed")  # noqa: N806 - stands for the real module (a row of ccoll/frameworks)
    Module.initialize = initialize
    try:
        _honours_the_block(Module)
        patch.uninstall()
        assert Module.initialize is not initialize  # a ccoll-run row: patch.uninstall leaves it
    finally:
        frameworks.restore(when=(frameworks.CCOLL_RUN,))
    assert Module.initialize is initialize


def _honours_the_block(Module) -> None:  # noqa: N803
    dsconfig.wrap_initialize(Module)
    dsconfig.wrap_initialize(Module)  # idempotent: not wrapped twice
    assert Module.initialize.__ccoll_original__.__name__ == "initialize"
    assert Module.initialize(config={"ccoll": {"policy": "naive"}})[0] == "engine"
    assert patch.current_policy().source.endswith("naive.yaml")  # installed from the block
    assert Module.initialize(config_params={"ccoll": {"policy": "naive"}})[0] == "engine"  # same rules: kept
    with pytest.raises(PolicyError, match="two policies"):
        Module.initialize(config={"ccoll": {"policy": "hybrid"}})

    class Args:
        deepspeed_config = {"ccoll": {"policy": "hybrid"}}

    with pytest.raises(PolicyError, match="two policies"):
        Module.initialize(Args())  # args.deepspeed_config, DeepSpeed's third way
