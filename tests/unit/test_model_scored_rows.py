"""The scored protocol's published rows (ccoll.model.scored.ROWS): every row complete and cited, its predicted gain
frozen here (a model change that moves one must show up as a failing test), and -- reported separately, never
asserted -- which rows fall within the +-15% target. The rows are FP8-LM's Table 5 (``CANDIDATES`` says where every
other source was read and what it lacks); they were ``BLOCKED`` until ccoll.model.memory learned FlashAttention and
sequence parallelism, which FP8-LM's runs use. Adding a row to ``ROWS`` fails
``test_given_rows_expect_each_predicted_gain_frozen`` until its gain is frozen below."""
from __future__ import annotations

import dataclasses

import pytest

from ccoll.model.scored import BLOCKED, CANDIDATES, ROWS, TARGET, Row, check_rows, print_scored, score

#: the protocol's compute figure for the rows (ccoll.model.published.MFU: Megatron-LM's V100 figure); a row set on
#: other GPUs must say which independent figure it uses, and this test with it
MFU = 0.30
#: row name -> predicted gain (speed-up - 1) at ``MFU`` with eta fitted on ROWS' uncompressed step times (the FP8-LM
#: rows carry their own MFU, so ``MFU`` does not reach them; eta 0.546). Published: -2.1%, -2.0%, -5.6% -- 0 of 3 within
#: +-15%; each row's ``note`` says what the score must be read with (the runs also changed the optimizer; the policy
#: puts every TP collective in FP8)
FROZEN: dict[str, float] = {"fp8lm-gpt7b": -0.004513, "fp8lm-gpt13b": 0.060678, "fp8lm-gpt175b": 0.184958}


@pytest.fixture(scope="module")
def scored():
    return score(ROWS, MFU) if ROWS else None


def test_given_rows_expect_each_complete_and_cited():
    assert check_rows(ROWS) == []


def test_given_rows_expect_each_predicted_gain_frozen(scored):
    got = {} if scored is None else {r["name"]: r["predicted_gain"] for r in scored["rows"] if "error" in r}
    assert set(got) == set(FROZEN), "freeze every scored row's predicted gain in FROZEN (and only those)"
    for name, gain in FROZEN.items():
        assert got[name] == pytest.approx(gain, rel=1e-3, abs=1e-4), name


def test_report_which_rows_are_within_target(scored, record_property):
    """Reported, not asserted: a miss is a finding to explain (its cause), never a reason to tune the model."""
    if scored is None:
        record_property("scored_rows", 0)
        return
    rows = [r for r in scored["rows"] if "error" in r]
    for r in rows:
        assert r["hit"] == (abs(r["error"]) <= TARGET)
    record_property("scored_rows", len(rows))
    record_property("within_target", ", ".join(r["name"] for r in rows if r["hit"]) or "none")
    record_property("misses", ", ".join(f"{r['name']} ({100 * r['error']:+.0f}%)" for r in rows if not r["hit"])
                    or "none")


def test_given_incomplete_rows_expect_check_rows_names_each_gap():
    from ccoll.model.published import SEED_LAYOUTS, NEOX20B

    lay = SEED_LAYOUTS[0][1]
    good = Row("ok", "Some et al. 2024, Table 3", lay, "lassen", 10.0, "zhybrid", 8.0)
    assert check_rows([good]) == []
    bad = [dataclasses.replace(good, name="a", source="Some et al. 2024"),        # no table or figure
           dataclasses.replace(good, name="b", cluster="no-such-node"),           # no node file
           dataclasses.replace(good, name="c", layout=NEOX20B),                   # does not fit a 16 GB V100
           dataclasses.replace(good, name="d", policy=None),                      # compressed time, no policy
           dataclasses.replace(good, name="e", comp_step_s=0.0),
           good, good]
    msgs = check_rows(bad)
    for name, what in (("a", "names no table or figure"), ("b", "no-such-node"), ("c", "does not fit"),
                       ("d", "needs the policy"), ("e", "must be > 0"), ("ok", "name used twice")):
        assert any(m.startswith(f"{name}:") and what in m for m in msgs), (name, msgs)


def test_given_no_complete_row_expect_candidates_name_where_each_was_read_and_what_it_lacks(capsys):
    for src, why in CANDIDATES:
        assert src.strip() and len(why) > 20, src
    named = " ".join(src for src, _ in CANDIDATES)
    for needle in ("ZeRO++", "1-bit Adam", "0/1 Adam", "1-bit LAMB", "Optimus-CC", "CocktailSGD", "2409.02423",
                   "MCR-DL", "SDP4Bit", "FP8-LM", "float8 all-gather", "LoCo", "COCCL"):
        assert needle in named, needle
    if not ROWS:
        print_scored(None, ROWS)
        out = capsys.readouterr().out
        assert "no scored rows yet" in out and all(src in out for src, _ in CANDIDATES)


def test_given_fp8lm_rows_expect_admitted_with_flash_attention_and_sequence_parallelism_and_their_published_gains():
    """FP8-LM Table 5's rows, in ROWS: their layouts (FlashAttention + sequence parallelism, as the authors' Megatron-LM
    scripts run them) fit ccoll.model.memory's lower bound, which stays below the 69.6-77.3 GB FP8-LM measured at 7B;
    without the two knobs the same layouts are refused (>= 89.9 GiB), as they were while the rows sat in BLOCKED."""
    from ccoll.model.clusters import load_cluster
    from ccoll.model.memory import GIB, fits

    fp8 = [r for r in ROWS if r.name.startswith("fp8lm-")]
    assert [r.name for r in fp8] == ["fp8lm-gpt7b", "fp8lm-gpt13b", "fp8lm-gpt175b"] and not BLOCKED
    assert check_rows(fp8) == []
    node = load_cluster("azure-nd-h100-v5")
    need = []
    for r in fp8:
        assert r.layout.flash_attention and r.layout.sequence_parallel and not r.layout.recompute
        f = fits(r.layout, node)
        assert f["fits"] and f["bytes"]["total"] < 69.6e9, r.name  # a lower bound below what the paper measured
        need.append(f["bytes"]["total"] / GIB)
        old = dataclasses.replace(r.layout, flash_attention=False, sequence_parallel=False)
        assert not fits(old, node)["fits"], r.name
        assert any("does not fit" in m for m in check_rows([dataclasses.replace(r, layout=old)]))
    assert need == pytest.approx([58.03, 54.79, 56.11], abs=0.01)
    # 7B (TP 1, PP 1): sequence parallelism is a no-op at t = 1 and FlashAttention takes the 5 a s / h score term
    # away: one micro-batch in flight, 32 layers of s b h (10 + 24/1) = 34 s b h bytes (s 2048, b 2, h 4096; bf16)
    sbh = 2048 * 2 * 4096
    assert fits(fp8[0].layout, node)["bytes"]["activations"] == pytest.approx(32 * 34 * sbh)
    # Table 5's samples/s, TE -> Ours at the same micro-batch: the wire (and optimizer) change made every row slower
    gains = {r.name: r.base_step_s / r.comp_step_s - 1 for r in fp8}
    assert gains == pytest.approx({"fp8lm-gpt7b": 219.8 / 224.5 - 1, "fp8lm-gpt13b": 109.5 / 111.7 - 1,
                                   "fp8lm-gpt175b": 27.1 / 28.7 - 1})
    # step time = Table 1's global batch (sequences of 2048) / samples per second
    assert [r.layout.micro_batch * r.layout.micro_batches * r.layout.dp for r in fp8] == [2048, 2048, 512]
    assert fp8[0].base_step_s == pytest.approx(9.1225, abs=1e-4)
    assert all(r.mfu is not None and "NeMo" in r.mfu_source and "optimizer" in r.note for r in fp8)


def test_given_scored_rows_when_printed_expect_the_table_the_fit_and_each_rows_note(scored, capsys):
    print_scored(scored, ROWS)
    out = capsys.readouterr().out
    assert f"fitted eta (fraction of the node file's link rates) = {scored['eta']:.3f}" in out
    for r in ROWS:
        assert f" {r.name} " in out and (not r.note or f"read {r.name} with: {r.note}" in out)
    assert f"{scored['hits']} of {scored['scored']} scored rows within +-15%" in out


def test_given_a_row_with_its_own_mfu_expect_it_predicted_there_whatever_the_protocols_mfu():
    from ccoll.model.published import SEED_LAYOUTS
    from ccoll.model.scored import fit_eta, synthetic_rows

    lays = [lay for _, lay in SEED_LAYOUTS[:2]]
    rows = [dataclasses.replace(r, mfu=0.3, mfu_source="the synthetic rows' own figure")
            for r in synthetic_rows("lassen", lays, "zhybrid", eta=0.5, mfu=0.3)]
    assert check_rows([dataclasses.replace(r, source="Table 1") for r in rows]) == []
    assert fit_eta(rows, 0.9) == pytest.approx(0.5, rel=1e-3)  # the protocol's 0.9 is not used for these rows
    res = score(rows, 0.9)
    assert all(abs(r["error"]) < 1e-3 and r["mfu"] == 0.3 for r in res["rows"])
    assert [r["mfu"] for s in res["sensitivity"] for r in s["rows"]] == pytest.approx([0.24, 0.24, 0.36, 0.36])
    bad = dataclasses.replace(rows[0], source="Table 1", mfu=0.3, mfu_source="")
    assert any("mfu_source" in m for m in check_rows([bad]))
