"""Issue 39: feasible-or-refused predictions, the framework knobs on the command line, cluster files that name their
machine (and a template for yours), the scored protocol, --from-run over repeated runs, errors before output.
Expected numbers computed by hand."""
from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest
import yaml

from ccoll.errors import CcollError
from ccoll.model import Layout, flows, main
from ccoll.model.cli import _parser, build_layout
from ccoll.model.clusters import (TEMPLATE, ClusterError, load_cluster, missing_sources, node_from_dict,
                                  shipped_clusters, with_rails)
from ccoll.model.memory import InfeasibleLayout, alternatives, fits, require

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
#: 2 layers, TP 2, DP 2, PP 1, fp16 / bf16 (hand-countable flows)
SMALL = ["--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "16", "--vocab", "64", "--micro-batch", "2",
         "--micro-batches", "3", "--dp", "2", "--tp", "2", "--pp", "1"]


def _lay(*extra):
    return build_layout(_parser().parse_args(SMALL + list(extra)))[0]


def _flow(lay, dim, what):
    return [f for f in flows(lay) if f.dim == dim and f.what.startswith(what)]


# --- the knobs ----------------------------------------------------------------------------------------
def test_given_grad_dtype_option_when_bf16_training_expect_fp32_dp_gradients_twice_the_bytes():
    lay = _lay("--dtype", "bfloat16", "--grad-dtype", "float32")
    (g,) = _flow(lay, "dp", "gradients")
    assert (g.dtype, g.numel, g.op) == ("float32", lay.stage_params(0), "all_reduce")
    (p,) = _flow(lay, "dp", "parameters")
    assert p.dtype == "bfloat16"  # the parameter all-gather stays in the weights' dtype


def test_given_distributed_optimizer_or_zero_reduce_when_flows_expect_reduce_scatter_and_parameter_all_gather():
    lay = _lay("--distributed-optimizer")
    (g,) = _flow(lay, "dp", "gradients")
    (p,) = _flow(lay, "dp", "parameters")
    assert (lay.zero, g.op, p.op, p.numel, p.calls) == (1, "reduce_scatter", "all_gather",
                                                         -(-lay.stage_params(0) // 2), 1)
    assert _flow(_lay("--zero-reduce", "reduce_scatter"), "dp", "gradients")[0].op == "reduce_scatter"
    assert _flow(_lay(), "dp", "gradients")[0].op == "all_reduce"  # ZeRO-1's default
    with pytest.raises(CcollError, match="contradicts"):
        _lay("--distributed-optimizer", "--zero", "3")


def test_given_recompute_and_parallel_residual_options_when_flows_expect_tp_forward_all_reduces_per_micro_batch():
    # per micro-batch, TP forward all-reduces: 2 per layer x 2 layers + 1 (vocab-parallel embedding) = 5; with
    # recomputation the layers' run twice: 2 x 2 x 2 + 1 = 9; parallel residual: 1 per layer: 2 + 1 = 3 (x2: 5)
    for extra, per_mb in (((), 5), (("--recompute",), 9), (("--parallel-residual",), 3),
                          (("--recompute", "--parallel-residual"), 5)):
        (f,) = _flow(_lay(*extra), "tp", "activations (forward)")
        assert f.calls == 3 * per_mb, extra  # 3 micro-batches
    assert _lay("--recompute").recompute and not _lay("--no-recompute").recompute


def _sp(lay):
    """{(op, what): (numel, calls)} of the TP flows of stage 0."""
    return {(f.op, f.what): (f.numel, f.calls) for f in flows(lay) if f.dim == "tp" and f.stage == 0}


def test_given_sequence_parallel_option_when_flows_expect_reduce_scatter_all_gather_pairs_and_backward_regathers():
    """SMALL: 2 layers, b s h = 2 x 16 x 64 = 2048 elements, t = 2 (shard 1024), 3 micro-batches, one stage (it holds
    the vocab-parallel embedding and the LM head). Per micro-batch under sequence parallelism:
        forward   all-gather of the inputs of QKV and FC1 (2 per layer) + the LM head's = 5, numel 1024 (the shard)
                  reduce-scatter of the attention-dense and FC2 outputs (2 per layer) + the embedding's = 5, numel 2048
        backward  reduce-scatter of the 5 gathered inputs' gradients; all-gather of the 5 scattered outputs'
                  gradients; all-gather of the QKV, FC1 and LM-head inputs again for the weight gradients = 5
    x 3 micro-batches = 15 calls each. Without it: 5 forward + 5 backward all-reduces of 2048 per micro-batch.
    Ring elements a rank moves per micro-batch (t = 2): all-reduce 2 (t-1)/t x 2048 = 2048, reduce-scatter
    (t-1)/t x 2048 = 1024, all-gather (t-1) x 1024 = 1024: 10 x 2048 = 20480 without, 20 x 1024 = 20480 with (the same
    bytes) + 5 x 1024 re-gathered = 25600 (+25%)."""
    lay = _lay("--sequence-parallel")
    assert lay.sequence_parallel and not _lay().sequence_parallel and not _lay("--no-sequence-parallel").sequence_parallel
    sp = _sp(lay)
    assert sp == {("all_gather", "SP activations (forward)"): (1024, 15),
                  ("reduce_scatter", "SP activations (forward)"): (2048, 15),
                  ("reduce_scatter", "SP act. gradients (backward)"): (2048, 15),
                  ("all_gather", "SP act. gradients (backward)"): (1024, 15),
                  ("all_gather", "SP inputs re-gathered (wgrad)"): (1024, 15),
                  ("all_reduce", "vocab-parallel cross-entropy"): (32, 9)}  # b s fp32 values, unchanged
    assert _sp(_lay()) == {("all_reduce", "activations (forward)"): (2048, 15),
                           ("all_reduce", "activation gradients (backward)"): (2048, 15),
                           ("all_reduce", "vocab-parallel cross-entropy"): (32, 9)}
    ring = {"all_reduce": lambda n: n, "reduce_scatter": lambda n: n // 2, "all_gather": lambda n: n}  # t = 2

    def moved(d, skip=()):
        return sum(ring[op](n) * c for (op, what), (n, c) in d.items() if "entropy" not in what and what not in skip)

    assert moved(_sp(_lay())) == 3 * 20480
    assert moved(sp, skip=("SP inputs re-gathered (wgrad)",)) == 3 * 20480
    assert moved(sp) == 3 * 25600
    # recomputation replays the forward's 4 per layer: 2 x 2 x 2 + 1 = 9 gathers and 9 scatters per micro-batch;
    # parallel residual sums the two branch outputs before ONE reduce-scatter (forward 2 + 1, and its gradient's
    # all-gather 2 + 1), while both column-parallel inputs are still gathered: 16 x 1024 per micro-batch either
    # way (without: 3 forward + 5 backward all-reduces of 2048)
    rec = _sp(_lay("--sequence-parallel", "--recompute"))
    assert rec[("all_gather", "SP activations (forward)")] == (1024, 27)
    assert rec[("reduce_scatter", "SP activations (forward)")] == (2048, 27)
    assert rec[("reduce_scatter", "SP act. gradients (backward)")] == (2048, 15)
    par = _sp(_lay("--sequence-parallel", "--parallel-residual"))
    assert [par[k][1] for k in sorted(par) if "entropy" not in k[1]] == [9, 15, 15, 15, 9]
    assert moved(par, skip=("SP inputs re-gathered (wgrad)",)) == moved(_sp(_lay("--parallel-residual"))) == 3 * 16 * 1024
    with pytest.raises(CcollError, match="tp must divide"):
        _lay("--sequence-parallel", "--seq", "15")


def test_given_sequence_parallel_with_pipeline_when_flows_expect_the_shard_sent_and_stage_ends_counted():
    """SMALL at PP 2 (1 layer per stage): each TP rank sends its s/t shard, b s h / t = 1024 elements (Megatron's p2p
    shape under sequence parallelism), not 2048. Stage 0 holds the embedding (1 more forward reduce-scatter, and its
    gradient's all-gather), stage 1 the LM head (1 more forward all-gather, backward reduce-scatter and re-gather):
    per micro-batch stage 0: AG 2, RS 3 | RS 2, AG 3, re-gather 2; stage 1: AG 3, RS 2 | RS 3, AG 2, re-gather 3."""
    lay = _lay("--sequence-parallel", "--pp", "2")
    assert [f.numel for f in flows(lay) if f.dim == "pp"] == [1024, 1024]
    assert [f.numel for f in flows(_lay("--pp", "2")) if f.dim == "pp"] == [2048, 2048]
    for st, calls in ((0, [2, 3, 2, 3, 2]), (1, [3, 2, 3, 2, 3])):
        got = [f.calls for f in flows(lay) if f.dim == "tp" and f.stage == st and f.what.startswith("SP")]
        assert got == [3 * c for c in calls], st


def test_given_sequence_parallel_in_a_node_when_predicted_expect_tp_time_plus_the_regathers_only():
    """Inside a node a reduce-scatter + all-gather pair costs exactly what the all-reduce did (t = 2: 2 (a + W/(2B))
    both ways), so TP wire time grows only by the 15 re-gathers: 15 x (t-1) (a + 1024 x 4 bytes / B)."""
    from ccoll.model.timing import call_seconds, predict

    node = load_cluster("dgx-h100")
    base = predict(_lay(), node, None, mfu=0.4)
    sp = predict(_lay("--sequence-parallel"), node, None, mfu=0.4)
    regather = call_seconds("all_gather", 1024 * 4, 2, 2, True, node, False)
    assert regather == pytest.approx(node.intra_latency_us * 1e-6 + 4096 / (node.intra_data_gbps * 1e9 / 8))
    assert sp["link_s"]["tp"] - base["link_s"]["tp"] == pytest.approx(15 * regather)
    assert sp["compute_s"] == base["compute_s"] and sp["link_s"]["dp"] == base["link_s"]["dp"]


def test_given_flash_attention_option_when_built_expect_memory_only_and_refusal_lifted():
    """FlashAttention changes what a layer stores, not what it sends or computes: the same flows and FLOPs; and a
    layout the score term alone pushes past a GPU is admitted with it. SMALL at seq 4096 (s b h = 2 x 4096 x 64),
    fp32: the score term 5 a s / (h t) = 5 x 4 x 4096 / 128 = 640 against 10 + 12 = 22: one layer of one
    micro-batch holds 2 x 524288 x (22 + 640) bytes = 694 MB with scores, 23 MB without."""
    from ccoll.model import training_flops

    lay, fa = _lay("--seq", "4096"), _lay("--seq", "4096", "--flash-attention")
    assert fa.flash_attention and not lay.flash_attention
    assert flows(fa) == flows(lay) and training_flops(fa) == training_flops(lay)
    sbh = 4096 * 2 * 64
    from ccoll.model.memory import stage_bytes
    assert stage_bytes(lay, 0)["activations"] == pytest.approx(2 * 2 * sbh * 662)  # 2 layers, 1 stage, fp32
    assert stage_bytes(fa, 0)["activations"] == pytest.approx(2 * 2 * sbh * 22)
    node = dataclasses.replace(load_cluster("dgx-h100"), memory_gib=1.0)
    with pytest.raises(InfeasibleLayout, match="needs >= 1.6 GiB"):
        require(lay, node)
    assert require(fa, node)["fits"]


def test_given_preset_and_knobs_when_built_expect_the_presets_fields_overridden_only_where_given():
    args = _parser().parse_args(["--preset", "neox20b-v100", "--micro-batches", "16", "--grad-dtype", "float32",
                                 "--no-pp-mask", "--dp-bucket-mb", "100"])
    lay = build_layout(args)[0]
    assert (lay.tp, lay.pp, lay.dp, lay.micro_batch, lay.micro_batches) == (4, 4, 12, 1, 16)
    assert (lay.grad_dtype, lay.pp_mask, lay.dp_bucket_bytes, lay.recompute) == ("float32", False, 100 << 20, True)


def test_given_rails_and_rate_options_when_node_built_expect_node_rate_rails_times_rate():
    las = load_cluster("lassen")
    one = with_rails(las, rails=1)
    assert one.node_gbps == pytest.approx(97.6 * 0.99)  # the file's measured rate, one rail
    fast = with_rails(las, rails=4, rail_gbps=200)  # a given rate replaces the measured one (0.99 stays: the library)
    assert fast.node_gbps == pytest.approx(4 * 200 * (4096 / 4122) * 0.99)
    with pytest.raises(ClusterError, match="--rails"):
        with_rails(las, rails=0)


def test_given_rails_on_the_command_line_when_predicted_expect_the_wire_to_follow(capsys):
    common = ["--preset", "neox20b-v100", "--policy", str(CONFIGS / "hybrid.yaml")]
    assert main(common) == 0
    two = capsys.readouterr().out
    assert main(common + ["--rails", "1"]) == 0
    one = capsys.readouterr().out
    assert "2 x 100 Gbit/s rails" in two and "1 x 100 Gbit/s rails" in one

    def speedup(out):
        return float(out.split("speedup ")[1].split("x")[0])

    assert speedup(one) > speedup(two)  # one NIC per node: more wire to save
    assert main(["--rails", "2"] + SMALL) == 2
    assert "give --cluster" in capsys.readouterr().err


# --- feasible or refused ------------------------------------------------------------------------------
def test_given_infeasible_layout_when_predicted_expect_refusal_naming_layouts_that_fit():
    from ccoll.model.published import NEOX20B
    from ccoll.model.timing import predict

    las = load_cluster("lassen")
    with pytest.raises(InfeasibleLayout, match=r"needs >= 21\.4 GiB.*may fit: TP 2 x PP 4 x DP 24, micro-batch 1 x 128"):
        predict(NEOX20B, las, None, mfu=0.3)
    alts = alternatives(NEOX20B, las)
    assert alts and all(fits(a, las)["fits"] for a in alts)
    assert all(a.world == 192 and a.micro_batch * a.micro_batches * a.dp == 4 * 32 * 24 for a in alts)
    assert require(dataclasses.replace(NEOX20B, tp=4, dp=12, micro_batch=1), las)["fits"]
    predict(NEOX20B, las, None, mfu=0.3, check_memory=False)  # diagnostics may opt out, saying so


# --- cluster files ---------------------------------------------------------------------------------------
def test_given_shipped_cluster_files_expect_the_machine_named_and_every_figure_cited():
    for name in shipped_clusters():
        d = yaml.safe_load((CONFIGS / "clusters" / f"{name}.yaml").read_text())
        assert d.get("machine"), name
        assert missing_sources(d) == [], name
        assert load_cluster(name).machine == d["machine"]
    h8 = load_cluster("h800-8x400g-ib")
    assert (h8.rails_per_node, h8.rail_gbps) == (8, 400.0)
    with pytest.raises(ClusterError, match="h800-8x400g-ib.*cluster-template"):
        load_cluster("h800")


def test_given_cluster_template_when_written_expect_a_loadable_commented_file_and_no_overwrite(tmp_path, capsys):
    p = tmp_path / "my-node.yaml"
    assert main(["--cluster-template", str(p)]) == 0
    assert "wrote" in capsys.readouterr().out
    text = p.read_text()
    assert text == TEMPLATE and text.count("#") > 15
    node = load_cluster(str(p))
    assert (node.gpus_per_node, node.rails_per_node, node.memory_gib) == (8, 8, 80.0)
    assert missing_sources(yaml.safe_load(text)) == []
    assert main(["--cluster-template", str(p)]) == 2
    assert "exists" in capsys.readouterr().err


def test_given_bad_cluster_file_when_run_expect_refusal_before_anything_is_printed(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ngpu: y\ngpus_per_node: 4\n")
    assert main(SMALL + ["--cluster", str(bad)]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and "cluster-template" in cap.err
    d = yaml.safe_load(TEMPLATE)
    d["sources"] = ["not a mapping"]
    with pytest.raises(ClusterError, match="sources"):
        node_from_dict(d)


# --- errors name the command that makes a summary -------------------------------------------------------
def test_given_missing_summary_when_validate_or_from_run_expect_the_make_target(capsys, tmp_path):
    assert main(["--validate", "results/convergence/summary.json"]) == 2
    assert "`make convergence` writes it" in capsys.readouterr().err
    assert main(["--from-run", "results/shaped/1gbit/summary.json", "--ranks", "8"]) == 2
    assert "make e2e-shaped" in capsys.readouterr().err
    assert main(["--validate", str(tmp_path / "x.json")]) == 2
    assert "ccoll.convergence" in capsys.readouterr().err


# --- the scored protocol --------------------------------------------------------------------------------
def test_given_rows_made_by_the_model_when_scored_expect_eta_recovered_and_zero_error():
    from ccoll.model.published import SEED_LAYOUTS
    from ccoll.model.scored import fit_eta, score, synthetic_rows

    lays = [lay for _, lay in SEED_LAYOUTS[:2]]
    rows = synthetic_rows("lassen", lays, "zhybrid", eta=0.5, mfu=0.3)
    assert fit_eta(rows, 0.3) == pytest.approx(0.5, rel=1e-3)
    res = score(rows, 0.3)
    assert res["scored"] == 2 and res["hits"] == 2
    assert all(abs(r["error"]) < 1e-3 for r in res["rows"])
    assert [s["mfu"] for s in res["sensitivity"]] == pytest.approx([0.24, 0.36])
    # a published gain twice the model's: error -50%, a miss
    r0 = rows[0]
    gain = r0.base_step_s / r0.comp_step_s - 1
    doubled = dataclasses.replace(r0, comp_step_s=r0.base_step_s / (1 + 2 * gain))
    res = score([doubled, rows[1]], 0.3, eta=0.5)
    assert res["rows"][0]["error"] == pytest.approx(-0.5, abs=1e-6) and not res["rows"][0]["hit"]


def test_given_no_complete_public_row_when_published_expect_the_candidates_and_why(capsys):
    from ccoll.model.scored import CANDIDATES, print_scored

    print_scored(None, [])  # the ROWS shipped are scored: tests/unit/test_model_scored_rows.py
    out = capsys.readouterr().out
    assert "no scored rows yet" in out
    assert all(src in out for src, _ in CANDIDATES)


# --- --from-run over repeated runs ----------------------------------------------------------------------
def _runs(speedups: list[float], dp: int):
    from test_model import _summary_from_model

    from ccoll.model import RUNNER

    lay = Layout(layers=2, hidden=64, heads=4, seq=16, micro_batch=2, micro_batches=1, dp=dp, tp=1, pp=1, **RUNNER)
    out = []
    for sp in speedups:
        s = _summary_from_model(lay, 10, {"baseline": str(CONFIGS / "baseline.yaml"),
                                          "hybrid": str(CONFIGS / "hybrid.yaml")}, {"baseline": 10.0, "hybrid": 10.0 * sp})
        s["policies"]["hybrid"]["codec_in_run"] = {"encode_gbps": 1.0, "decode_gbps": 2.0}
        out.append(s)
    return out


def test_given_repeated_runs_when_from_runs_expect_spread_in_the_interval_and_the_naive_guess_scored(tmp_path, capsys):
    from ccoll.model.fromrun import from_run, from_runs

    cal = _runs([0.86, 0.90, 0.94], dp=2)
    meas = _runs([0.877, 0.983, 1.044], dp=4)  # issue 39's three 4-rank runs
    res = from_runs(cal, 4, measured=meas)
    e = res["policies"]["hybrid"]
    singles = [from_run(s, 4)["policies"]["hybrid"] for s in cal]
    p = sum(x["predicted_speedup"] for x in singles) / 3
    miss = sum(x["relative_error_at_measured_scale"] for x in singles) / 3
    half = miss + (0.94 - 0.86) / 2 / 0.90
    assert e["predicted_speedup"] == pytest.approx(p)
    assert e["interval"] == pytest.approx((p * (1 - half), p * (1 + half)))
    assert e["calibration"]["half_range"] == pytest.approx(0.04 / 0.90)
    m = (0.877 + 0.983 + 1.044) / 3
    assert e["measured"]["mean"] == pytest.approx(m)
    assert e["error"] == pytest.approx(p / m - 1) and e["naive_error"] == pytest.approx(0.90 / m - 1)
    assert e["covers"] == all(e["interval"][0] <= v <= e["interval"][1] for v in (0.877, 0.983, 1.044))
    assert e["spread_known"]
    one = from_runs(cal[:1], 4)["policies"]["hybrid"]
    assert not one["spread_known"] and one["calibration"]["half_range"] == 0.0
    with pytest.raises(CcollError, match="different scales"):
        from_runs([cal[0], meas[0]], 4)
    with pytest.raises(CcollError, match="not --ranks"):
        from_runs(cal, 8, measured=meas)
    paths = []
    for i, s in enumerate(cal + meas):
        paths.append(tmp_path / f"s{i}.json")
        paths[-1].write_text(json.dumps(s))
    assert main(["--from-run", *map(str, paths[:3]), "--ranks", "4", "--measured", *map(str, paths[3:])]) == 0
    out = capsys.readouterr().out
    assert "3 run(s) at 2 ranks" in out and "naive guess" in out and "run-to-run" in out
    assert main(["--from-run", str(paths[0]), "--ranks", "4"]) == 0
    assert "repeat the run" in capsys.readouterr().out


def test_given_the_measured_2_rank_and_4_rank_runs_when_from_runs_expect_the_readme_figures():
    """The README's --from-run figures: tests/unit/data's 2-rank run predicting the 4-rank run (--cpu-cores 2)."""
    from ccoll.model.cli import load_summary
    from ccoll.model.fromrun import from_runs

    data = pathlib.Path(__file__).parent / "data"
    res = from_runs([load_summary(str(data / "shaped_dp2_1gbit.json"))], 4, cores=2,
                    measured=[load_summary(str(data / "shaped_dp4_1gbit.json"))])
    e = res["policies"]["hybrid"]
    assert e["predicted_speedup"] == pytest.approx(0.940, abs=0.001)
    assert e["measured"]["mean"] == pytest.approx(0.877, abs=0.001)
    assert e["error"] == pytest.approx(0.072, abs=0.002) and e["naive_error"] == pytest.approx(-0.019, abs=0.002)
