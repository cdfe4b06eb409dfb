"""`python -m ccoll.bench.hooks` on a tiny run (2 gloo ranks on loopback, a 0.3 MiB model, 6 steps, 2 rounds):
the table's columns, the JSON's fields, the wire ratios where they are known exactly (the fp16 hook's 2x,
PowerSGD's from its P and Q sizes, ccoll's int8 from its codec), finite losses and the uncompressed runs
bit-identical from round to round; and bad arguments refused in one line with exit status 2. No timing
thresholds."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.slow  # one tiny training of four variants x two rounds on fresh gloo ranks: ~15-30 s

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VARIANTS = ["none", "fp16", "powersgd r1", "ccoll int8:block=64"]
ROW_KEYS = {"variant", "step_s", "speedup", "wire_ratio", "wire_ratio_run", "heldout_loss", "heldout_vs_none",
            "time_to_target_s", "step_at_target", "time_to_target_per_round_s", "step_s_per_round",
            "steps_run", "identical_across_rounds"}
RUN_KEYS = {"variant", "round", "grad_bytes", "step_s", "train_loss", "heldout_loss", "heldout_loss_initial",
            "sent_bytes", "digest"}


def _hooks(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ccoll.bench.hooks", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, PYTHONWARNINGS="ignore"))


def _powersgd_ratio(hidden: int, rank: int) -> float:
    """Elements a native all_reduce sends over those PowerSGD sends: P (n x r) and Q (m x r) per weight
    matrix worth compressing ((n + m) r x 2 < n m, torch's min_compression_rate 2), the rest as is."""
    from ccoll.bench.hooks import CLASSES, HIDDEN_LAYERS, IN_DIM

    shapes = [(hidden, IN_DIM)] + [(hidden, hidden)] * (HIDDEN_LAYERS - 1) + [(CLASSES, hidden)]
    native = sent = 0
    for n, m in shapes:
        r = min(n, m, rank)
        native += n * m + n  # the weight and its bias
        sent += ((n + m) * r if (n + m) * r * 2 < n * m else n * m) + n
    return native / sent


def test_given_tiny_run_when_comparing_hooks_expect_table_json_exact_ratios_and_identical_rounds(tmp_path):
    out, png = tmp_path / "hooks.json", tmp_path / "hooks.png"
    r = _hooks("--size-mb", "0.3", "--steps", "6", "--target-step", "4", "--max-steps", "8", "--rounds", "2", "--hooks", "none,fp16,powersgd",
               "--powersgd-ranks", "1", "--codecs", "int8:block=64", "--min-bytes", "0", "--json", str(out),
               "--plot", str(png))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "load average" in lines[0]
    head = next(i for i, line in enumerate(lines) if line.startswith("| variant"))
    assert lines[head] == "| variant | s/step | speedup | wire | held-out | vs none | to target (s) |"
    assert [line.split("|")[1].strip() for line in lines[head + 2:head + 2 + len(VARIANTS)]] == VARIANTS
    assert png.stat().st_size > 0

    doc = json.loads(out.read_text())
    meta = doc["meta"]
    assert meta["ranks"] == 2 and meta["link"] == "loopback" and meta["steps"] == 6 and meta["rounds"] == 2
    assert len(meta["load_average_start"]) == len(meta["load_average_end"]) == 3
    assert doc["target"]["step"] == 4 and len(doc["target"]["heldout_loss_per_round"]) == 2
    rows = {row["variant"]: row for row in doc["variants"]}
    assert list(rows) == VARIANTS
    for row in rows.values():
        assert set(row) == ROW_KEYS, row["variant"]
        assert row["step_s"] > 0 and math.isfinite(row["heldout_loss"]) and len(row["step_s_per_round"]) == 2
    # every variant of every round: six steps, then more (up to 8) only while the target is not reached;
    # finite losses; rounds in the rotated order
    assert len(doc["runs"]) == 2 * len(VARIANTS)
    assert [run["variant"] for run in doc["runs"]] == VARIANTS + VARIANTS[1:] + VARIANTS[:1]
    target = doc["target"]["heldout_loss_per_round"][0]
    for run in doc["runs"]:
        assert set(run) == RUN_KEYS
        k = len(run["step_s"])
        assert 6 <= k <= 8 and len(run["heldout_loss"]) == len(run["sent_bytes"]) == len(run["train_loss"]) == k
        if k > 6:
            assert min(run["heldout_loss"][:k - 1]) > target
        assert all(math.isfinite(x) for x in run["heldout_loss"] + run["train_loss"])
    assert [len(run["step_s"]) for run in doc["runs"] if run["variant"] == "none"] == [6, 6]

    # wire ratios, exactly
    hidden, grad_bytes = meta["hidden"], doc["runs"][0]["grad_bytes"]
    assert grad_bytes == 4 * meta["params"]
    assert rows["none"]["wire_ratio"] == rows["none"]["wire_ratio_run"] == 1.0
    assert rows["fp16"]["wire_ratio"] == rows["fp16"]["wire_ratio_run"] == 2.0
    assert rows["powersgd r1"]["wire_ratio"] == pytest.approx(_powersgd_ratio(hidden, 1), rel=1e-12)
    # PowerSGD all-reduces uncompressed before start_powerSGD_iter (2): two native steps of six
    psgd_sent = 2 * grad_bytes + 4 * grad_bytes / rows["powersgd r1"]["wire_ratio"]
    assert rows["powersgd r1"]["wire_ratio_run"] == pytest.approx(6 * grad_bytes / psgd_sent, rel=1e-12)
    from ccoll.codecs import get_codec
    from ccoll.collectives.small import one_exchange

    c, n = get_codec("int8:block=64"), grad_bytes // 4
    assert n % (2 * c.align_numel) == 0  # no padding in ccoll's packed bucket: the codec's ratio alone
    wire = c.encoded_nbytes(n, torch.float32) if one_exchange(c, 2, n, torch.float32) else \
        2 * c.encoded_nbytes(n // 2, torch.float32)
    assert rows["ccoll int8:block=64"]["wire_ratio"] == pytest.approx(grad_bytes / wire, rel=1e-12)

    # same seed, same data: the uncompressed runs of both rounds are bit-identical, and the target is theirs
    none = [run for run in doc["runs"] if run["variant"] == "none"]
    assert none[0]["heldout_loss"] == none[1]["heldout_loss"] and none[0]["digest"] == none[1]["digest"]
    assert rows["none"]["identical_across_rounds"] is True
    assert doc["target"]["heldout_loss_per_round"] == [none[0]["heldout_loss"][3]] * 2
    # none reaches its own loss at step 4 (or earlier, were its curve not monotone) by definition
    assert rows["none"]["step_at_target"] <= 4
    for run, t in zip(none, rows["none"]["time_to_target_per_round_s"]):
        assert 0 < t <= sum(run["step_s"][:4]) * (1 + 1e-12)

@pytest.mark.parametrize("args, says", [
    (["--steps", "0"], "--steps"),
    (["--steps", "10", "--target-step", "11"], "--target-step"),
    (["--steps", "10", "--max-steps", "9"], "--max-steps"),
    (["--hooks", "fp16,fp32"], "fp32"),
    (["--hooks", "fp16"], "include none"),
    (["--codecs", "int9:block=64"], "int9"),
    (["--ranks", "1"], "--ranks"),
    (["--rate", "fast"], "fast"),
    (["--ccoll-bucket-mb", "0"], "--ccoll-bucket-mb"),
    (["--bogus"], "--bogus"),
])
def test_given_bad_argument_when_parsing_expect_one_line_and_exit_2(args, says, capsys):
    from ccoll.bench.hooks import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("ccoll.bench.hooks: error:") and says in err


def test_given_bad_argument_when_run_as_a_program_expect_exit_2():
    r = _hooks("--steps", "0", timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and not r.stdout


def test_given_ccoll_bucket_mb_when_parsing_expect_it_for_ccoll_only_defaulting_to_bucket_mb():
    from ccoll.bench.hooks import parse_args

    a = parse_args([])
    assert (a.bucket_mb, a.ccoll_bucket_mb) == (25.0, 25.0)
    a = parse_args(["--bucket-mb", "10"])
    assert (a.bucket_mb, a.ccoll_bucket_mb) == (10.0, 10.0)
    a = parse_args(["--ccoll-bucket-mb", "6"])
    assert (a.bucket_mb, a.ccoll_bucket_mb) == (25.0, 6.0)


def test_given_ccoll_bucket_mb_when_running_expect_ccoll_runs_on_those_buckets_and_meta_says_so(tmp_path, monkeypatch):
    """In process, DDP replaced by a recorder: the bucket_cap_mb each variant's DDP gets."""
    import torch.nn.parallel

    from ccoll.bench import hooks

    seen = []

    class Recorder(Exception):
        pass

    def fake_ddp(model, bucket_cap_mb=None, **kw):
        seen.append(bucket_cap_mb)
        raise Recorder

    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", fake_ddp)
    cfg = {"hidden": 64, "bucket_mb": 25.0, "ccoll_bucket_mb": 6.0, "seed": 1, "min_bytes": None, "powersgd_start": 2}
    for v in (hooks.Variant("none"), hooks.Variant("powersgd", 1), hooks.Variant("ccoll", "int8:block=64")):
        with pytest.raises(Recorder):
            hooks._run_variant(v, cfg, [], None, None)
    assert seen == [25.0, 25.0, 6.0]
