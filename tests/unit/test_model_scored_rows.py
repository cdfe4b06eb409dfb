"""The scored protocol's published rows (ccoll.model.scored.ROWS): every row complete and cited, its predicted gain
frozen here (a model change that moves one must show up as a failing test), and -- reported separately, never
asserted -- which rows fall within the +-15% target. Today no public source examined gives a complete row
(``CANDIDATES`` says where each was read and what it lacks), so ``FROZEN`` is empty; adding a row to ``ROWS``
fails ``test_given_rows_expect_each_predicted_gain_frozen`` until its gain is frozen below."""
from __future__ import annotations

import dataclasses

import pytest

from ccoll.model.scored import CANDIDATES, ROWS, TARGET, Row, check_rows, print_scored, score

#: the protocol's compute figure for the rows (ccoll.model.published.MFU: Megatron-LM's V100 figure); a row set on
#: other GPUs must say which independent figure it uses, and this test with it
MFU = 0.30
#: row name -> predicted gain (speed-up - 1) at ``MFU`` with eta fitted on ROWS' uncompressed step times
FROZEN: dict[str, float] = {}


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
                   "MCR-DL", "SDP4Bit"):
        assert needle in named, needle
    if not ROWS:
        print_scored(None, ROWS)
        out = capsys.readouterr().out
        assert "no scored rows yet" in out and all(src in out for src, _ in CANDIDATES)
