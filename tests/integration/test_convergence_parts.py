"""The convergence tool's pieces that need no process group: data order, final-loss rule, report files."""
from __future__ import annotations

import json

import pytest
import torch

from ccoll.convergence.data import BatchSampler, load_corpus, stdlib_files
from ccoll.convergence.report import final_loss, write_all
from ccoll.convergence.runner import RunResult
from ccoll.errors import CcollError


def test_given_stdlib_when_listed_expect_sorted_python_sources():
    files = stdlib_files()
    assert len(files) > 50 and files == sorted(files) and all(f.endswith(".py") for f in files)


def test_given_same_seed_when_sampling_expect_identical_batches_and_dp_ranks_differ():
    corpus = load_corpus(max_nbytes=1 << 20)
    a, b = BatchSampler(corpus, 32, 4, seed=7), BatchSampler(corpus, 32, 4, seed=7)
    x0, y0 = a.micro_batch_at(3, 0, 1)
    x1, y1 = b.micro_batch_at(3, 0, 1)
    assert torch.equal(x0, x1) and torch.equal(y0, y1)
    assert torch.equal(x0[:, 1:], y0[:, :-1])  # labels are the inputs shifted by one byte
    assert not torch.equal(x0, a.micro_batch_at(3, 1, 1)[0])
    assert int(x0.max()) < 256 and x0.dtype == torch.long


def test_given_tiny_or_missing_data_when_loading_expect_clear_error(tmp_path):
    with pytest.raises(CcollError, match="cannot read"):
        load_corpus(str(tmp_path / "missing.txt"))
    small = tmp_path / "small.txt"
    small.write_bytes(b"abc")
    with pytest.raises(CcollError, match="seq_len"):
        BatchSampler(load_corpus(str(small)), 32, 2, seed=0)


def test_given_losses_when_final_loss_expect_mean_of_last_tenth():
    assert final_loss([9.0] * 90 + [1.0] * 10) == 1.0
    assert final_loss([5.0, 3.0]) == 3.0  # at least one step


def test_given_results_when_written_expect_delta_vs_baseline_and_ratios(tmp_path):
    b = {"dp": {"raw": 800, "wire": 800}, "tp": {"raw": 0, "wire": 0}, "pp": {"raw": 100, "wire": 100}}
    h = {"dp": {"raw": 800, "wire": 100}, "tp": {"raw": 0, "wire": 0}, "pp": {"raw": 100, "wire": 25}}
    runs = [RunResult("hybrid", [3.0, 2.02], 10.0, 1.0, h), RunResult("baseline", [3.0, 2.0], 12.0, 1.0, b)]
    meta = dict(steps=2, dp=2, tp=1, pp=2, seed=0, model=dict(hidden=8, layers=2, heads=2, seq_len=8),
                global_batch=4, data="x")
    s = write_all(runs, str(tmp_path), meta)
    assert s["baseline"] == "baseline"
    assert s["policies"]["hybrid"]["delta_vs_baseline_pct"] == pytest.approx(1.0)
    assert s["policies"]["hybrid"]["compression"] == {"dp": 8.0, "tp": None, "pp": 4.0}
    assert json.loads((tmp_path / "summary.json").read_text())["policies"]["baseline"]["steps"] == 2
    assert "+1.00%" in (tmp_path / "summary.md").read_text()


def test_given_layout_the_model_cannot_split_when_run_expect_exit_2_before_any_rank_starts(tmp_path, capsys):
    from ccoll.convergence.__main__ import main

    assert main(["--policies", "unpatched", "--tp", "3", "--out", str(tmp_path)]) == 2
    assert "tp=3 must divide heads=4" in capsys.readouterr().err
    assert main(["--policies", "unpatched", "--pp", "4", "--layers", "2", "--out", str(tmp_path)]) == 2
    assert "--layers 2 must be >= --pp 4" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_given_finished_run_dir_when_reused_expect_its_result_only_for_the_same_spec(tmp_path):
    from ccoll.convergence.runner import load_finished

    spec = dict(steps=2, dp=2, tp=1, pp=1, seed=7, seeds=[7], model=dict(hidden=8), policy="/p/hybrid.yaml")
    run_dir = tmp_path / "runs" / "hybrid" / "seed7"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps(dict(spec, run_dir=str(run_dir))))
    assert load_finished("hybrid", spec, str(run_dir)) is None  # no rank results yet: run it
    stats = [{"dim": "dp", "op": "all_reduce", "codec": "int4", "calls": 2, "raw_bytes": 64, "wire_bytes": 9}]
    for r in range(2):
        (run_dir / f"rank{r}.json").write_text(json.dumps(dict(
            rank=r, losses=[3.0, 2.5], val_losses=[[2, 2.6]], step_seconds=[1.0, 0.5], samples_per_step=4, stats=stats)))
    # the same run asked for by a comparison over more seeds: reused
    got = load_finished("hybrid", dict(spec, seeds=[7, 8, 9]), str(run_dir))
    assert got is not None and got.losses == [3.0, 2.5] and got.val_losses == [[2, 2.6]] and got.seed == 7
    assert got.samples_per_s == pytest.approx(8.0) and got.bytes["dp"] == {"raw": 128, "wire": 18}
    for changed in (dict(spec, steps=3), dict(spec, policy="/p/naive.yaml"), dict(spec, model=dict(hidden=16))):
        assert load_finished("hybrid", changed, str(run_dir)) is None


def test_given_policy_leaving_dp_native_when_shaped_comparison_expect_exit_2_before_any_run(tmp_path, capsys):
    import pathlib

    from ccoll.convergence.shaped import main as shaped_main

    baseline = pathlib.Path(__file__).resolve().parents[2] / "configs" / "baseline.yaml"
    assert shaped_main(["--policy", str(baseline), "--out", str(tmp_path)]) == 2
    assert "DP gradients are not compressed" in capsys.readouterr().err
    assert not (tmp_path / "1gbit").exists()
