"""What ccoll tells the user (ccoll.report, ccoll.hf), without a process group: the announcement at a
dimension's first compressed call (ccoll.stats' row hook), the exit table and ``ccoll.summary()``, the
"nothing compressed" warning's causes and its one copy from rank 0, and the HF Trainer callback's figures.
The exit behaviour runs in a child process activated as ccoll-run activates ranks (a few seconds each)."""
from __future__ import annotations

import logging
import pathlib
import subprocess
import sys
import types

import pytest

import ccoll
from ccoll import log, report
from ccoll import stats as stats_mod
from ccoll.policy import Policy

REPO = pathlib.Path(__file__).resolve().parents[2]
HYBRID = REPO / "configs" / "hybrid.yaml"
INT4 = "int4:block=64,round=nearest,seed=0"


@pytest.fixture
def fresh(monkeypatch):
    """An empty stats table, nothing announced or warned yet, and this process as rank 0."""
    ccoll.reset_stats()
    monkeypatch.setattr(report, "_announced", set())
    monkeypatch.setattr(log, "_warned", set())
    monkeypatch.setattr(log, "rank", lambda: 0)
    monkeypatch.setattr(report, "rank", lambda: 0)
    monkeypatch.setattr(report, "_current", [])
    yield
    ccoll.reset_stats()


def _user_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ccoll"]


def test_given_first_compressed_call_of_a_dim_when_recorded_expect_one_announcement_with_its_ratio(fresh, caplog):
    caplog.set_level(logging.INFO, logger="ccoll")
    stats_mod.record("all_reduce", "native", 4, 4, 0.0, dim="dp")  # a native row announces nothing
    stats_mod.record("all_reduce", INT4, 1_048_576, 147_456, 0.01, dim="dp")
    stats_mod.record("all_reduce", INT4, 1_048_576, 147_456, 0.01, dim="dp")  # not a new row
    stats_mod.record("reduce_scatter", INT4, 1_048_576, 147_456, 0.01, dim="dp")  # dp already announced
    stats_mod.record("all_reduce", "int8:block=256", 1_000_000, 253_906, 0.01, dim="tp")
    lines = _user_lines(caplog)
    assert lines == [f"ccoll: dp compressing: all_reduce {INT4} (first call: 1.05 MB -> 0.15 MB, 7.11x)",
                     "ccoll: tp compressing: all_reduce int8:block=256 (first call: 1.00 MB -> 0.25 MB, 3.94x)"]
    assert all(getattr(r, "ccoll_user", False) for r in caplog.records if r.name == "ccoll")


def test_given_stats_rows_when_reading_summary_expect_rows_and_a_table_with_dimension_totals(fresh):
    stats_mod.record("all_reduce", INT4, 1_048_576, 147_456, 0.25, dim="dp")
    stats_mod.record("all_reduce", "native", 400, 400, 0.5, dim="dp", calls=4)
    stats_mod.record("send", "int8:block=256", 2_000_000, 507_812, 0.125, dim="pp")
    s = ccoll.summary()
    assert isinstance(s, list) and s.rank == 0
    assert [(r["dim"], r["op"], r["codec"], r["calls"]) for r in s] == [
        ("dp", "all_reduce", INT4, 1), ("dp", "all_reduce", "native", 4), ("pp", "send", "int8:block=256", 1)]
    assert s[0]["ratio"] == pytest.approx(1_048_576 / 147_456) and s[1]["ratio"] == 1.0
    lines = str(s).splitlines()
    assert lines[0].startswith("ccoll: traffic of rank 0 (its own calls")
    assert lines[1].split() == ["dim", "op", "codec", "calls", "raw", "wire", "ratio", "time"]
    assert lines[2].split() == ["dp", "all_reduce", INT4, "1", "1.05", "MB", "147.46", "KB", "7.11x", "0.250", "s"]
    assert lines[3].split() == ["dp", "all_reduce", "native", "4", "400", "B", "400", "B", "1.00x", "0.500", "s"]
    # dp has two rows: a total over both, native calls included
    assert lines[4].split() == ["dp", "total", "5", "1.05", "MB", "147.86", "KB", "7.09x", "0.750", "s"]
    assert lines[5].split() == ["pp", "send", "int8:block=256", "1", "2.00", "MB", "507.81", "KB", "3.94x", "0.125", "s"]
    assert len(lines) == 6  # pp has one row: no total line


class _Resolver:
    """The automatic resolver's two answers the diagnosis reads: which sources it found, and what it tried."""

    def __init__(self, found):
        self.found = found

    def tried(self) -> str:
        return "DeviceMesh dims, deepspeed.utils.groups"


class _State:
    """What ccoll.report reads of a ccoll.patch installation (weakly referenced, as a real one)."""

    def __init__(self, policy: Policy, steps: int = 0):
        self.policy, self.resolver, self.steps = policy, _Resolver(set()), steps


def _state(policy: Policy, steps: int = 0) -> _State:
    return _State(policy, steps)


def test_given_unplaced_world_and_native_default_rule_when_diagnosing_expect_the_default_rule_named(fresh, monkeypatch):
    from ccoll import auto

    monkeypatch.setattr(auto, "attached", lambda: [])
    st = _state(Policy.from_yaml(HYBRID))
    report.on_install(st)
    stats_mod.record("all_reduce", "native", 1_048_576, 1_048_576, 0.01, dim="default")
    stats_mod.record("all_gather_list", "native", 8, 8, 0.01, dim="default")  # always exact: not a cause
    why = report.diagnose(st)
    assert "no process group was placed" in why and "DeviceMesh dims, deepspeed.utils.groups" in why
    assert "no `default:` rule that compresses all_reduce" in why and "`default: {codec: int4:block=64}`" in why
    assert "resolver=" in why and "min_bytes" not in why  # the one cause; list-form calls are no cause


def test_given_default_rule_compressing_but_calls_kept_exact_when_diagnosing_expect_min_bytes_cause(fresh, monkeypatch):
    from ccoll import auto

    monkeypatch.setattr(auto, "attached", lambda: [])
    st = _state(Policy.from_dict({"version": 1, "default": {"codec": "int4:block=64"}}))
    report.on_install(st)
    stats_mod.record("all_reduce", "native", 64, 64, 0.01, dim="default")
    why = report.diagnose(st)
    assert "`default:` rule" not in why and "every call on default was under min_bytes" in why


def test_given_user_hook_and_unplaced_world_with_only_exact_calls_when_diagnosing_expect_hook_not_resolver(fresh, monkeypatch):
    from ccoll import auto

    hooked = auto.Attached("ddp", 0, "user hook", "allreduce_hook")
    monkeypatch.setattr(auto, "attached", lambda: [hooked])
    st = _state(Policy.from_yaml(HYBRID))
    report.on_install(st)
    stats_mod.record("all_gather_list", "native", 8, 8, 0.01, dim="default")
    why = report.diagnose(st)
    assert "your own comm hook (allreduce_hook)" in why and "resolver=" not in why


def test_given_nothing_compressed_when_warning_expect_once_and_only_from_rank_0(fresh, monkeypatch, caplog):
    from ccoll import auto

    monkeypatch.setattr(auto, "attached", lambda: [])
    st = _state(Policy.from_yaml(HYBRID), steps=2)
    report.on_install(st)
    caplog.set_level(logging.INFO, logger="ccoll")
    monkeypatch.setattr(report, "rank", lambda: 1)
    report.warn_if_nothing(st)
    assert _user_lines(caplog) == []
    monkeypatch.setattr(report, "rank", lambda: 0)
    report.warn_if_nothing(st)
    report.warn_if_nothing(st, at_exit=True)  # the exit's check: already said
    lines = _user_lines(caplog)
    assert len(lines) == 1 and lines[0].startswith(f"ccoll: policy {HYBRID} compresses dp/pp/tp, but after 2 "
                                                   f"optimizer steps nothing was compressed: ")


# --- at exit, in a child process activated as ccoll-run activates a rank ---------------------------------
def _child(tmp_path, code: str, **env) -> subprocess.CompletedProcess:
    from ccoll.run import activation_env

    base = {k: v for k, v in __import__("os").environ.items() if not k.startswith("CCOLL_")}
    base.update(CCOLL_POLICY=str(HYBRID), PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore", **env)
    return subprocess.run([sys.executable, "-c", code], env=activation_env(base), cwd=str(tmp_path), text=True,
                          capture_output=True, timeout=120)


RECORD_DP = ("import torch, ccoll\n"
             f"ccoll.stats.record('all_reduce', {INT4!r}, 1_048_576, 147_456, 0.01, dim='dp')\n"
             "print('user code done')\n")


def test_given_traffic_on_a_dimension_when_process_exits_expect_announcement_then_table_on_stderr(tmp_path):
    proc = _child(tmp_path, RECORD_DP)
    assert proc.returncode == 0 and proc.stdout.strip() == "user code done", proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == f"ccoll: dp compressing: all_reduce {INT4} (first call: 1.05 MB -> 0.15 MB, 7.11x)"
    assert lines[1].startswith("ccoll: traffic of rank 0")
    assert lines[3].split()[:4] == ["dp", "all_reduce", INT4, "1"] and "7.11x" in lines[3]
    assert len(lines) == 4, proc.stderr  # no warning: something was compressed


def test_given_ccoll_log_off_when_process_exits_expect_nothing_printed(tmp_path):
    proc = _child(tmp_path, RECORD_DP, CCOLL_LOG="off")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_given_rank_1_when_process_exits_expect_no_table(tmp_path):
    proc = _child(tmp_path, RECORD_DP, RANK="1", WORLD_SIZE="2")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_given_process_that_recorded_nothing_when_exiting_expect_no_table_and_no_warning(tmp_path):
    proc = _child(tmp_path, "import torch, ccoll\nprint('launcher')\n")  # what torchrun's launcher is
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


# --- HF Trainer ------------------------------------------------------------------------------------------
def test_given_trainer_log_when_ccoll_callback_runs_expect_figures_in_logs_and_log_history(fresh):
    pytest.importorskip("transformers")
    from ccoll import hf

    stats_mod.record("all_reduce", INT4, 1_048_576, 147_456, 0.01, dim="dp")
    stats_mod.record("all_reduce", "native", 400, 400, 0.01, dim="dp", calls=4)
    logs = {"loss": 1.5}
    state = types.SimpleNamespace(global_step=7, log_history=[{"loss": 1.5, "step": 7}])
    hf.CcollCallback().on_log(None, state, None, logs=logs)
    assert logs["ccoll/dp_raw_MB"] == pytest.approx(1.048976) and logs["ccoll/dp_wire_MB"] == pytest.approx(0.147856)
    assert logs["ccoll/dp_ratio"] == pytest.approx(1_048_976 / 147_856)
    assert state.log_history[-1] == {"step": 7, **logs}


def test_given_trainer_with_callbacks_when_attaching_expect_ccoll_first_and_never_twice(fresh):
    pytest.importorskip("transformers")
    from ccoll import hf

    tensorboard, user = object(), hf.CcollCallback()
    trainer = types.SimpleNamespace(callback_handler=types.SimpleNamespace(callbacks=[tensorboard, user]))
    assert hf.attach(trainer) is user and trainer.callback_handler.callbacks == [user, tensorboard]
    assert hf.attach(trainer) is user and len(trainer.callback_handler.callbacks) == 2


def test_given_import_ccoll_when_reading_summary_and_hf_expect_transformers_imported_only_by_hf():
    code = ("import sys, ccoll\n"
            "s = ccoll.summary()\n"
            "before = 'transformers' in sys.modules\n"
            "import ccoll.hf\n"
            "print(type(s).__name__, before, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["Summary", "False", "True"]


def test_given_patch_installed_when_transformers_trainer_imported_expect_init_wrapped_then_restored():
    trainer_mod = pytest.importorskip("transformers.trainer")
    import inspect

    import ccoll.patch as patch

    original = trainer_mod.Trainer.__init__
    with patch.installed(str(HYBRID)):
        wrapped = trainer_mod.Trainer.__init__
        assert wrapped is not original and wrapped.__wrapped__ is original
        assert inspect.signature(wrapped) == inspect.signature(original)  # what frameworks read
    assert trainer_mod.Trainer.__init__ is original
