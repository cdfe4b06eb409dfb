"""docs/TORCH_CONTRACTS.md stays true: every public function of torch.distributed is listed, each verdict
matches what ccoll.patch really wraps (its table of rows), and every test it names exists."""
from __future__ import annotations

import inspect
import os
import re
import warnings

import torch.distributed as dist

from ccoll.patch import WRAPPED, wrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(REPO, "docs", "TORCH_CONTRACTS.md")
VERDICTS = ("compressed", "exact", "refused", "untouched")
_ROW = re.compile(r"^\| `(?P<name>[A-Za-z_]+)` \| (?P<verdict>\w+) \| (?P<ops>[^|]*) \|[^|]*\| `(?P<test>[^`]+)` \|$")
_TEST = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def _table() -> dict[str, tuple[str, str, str]]:
    rows = {}
    with open(DOC) as f:
        for line in f:
            m = _ROW.match(line.strip())
            if m:
                assert m["name"] not in rows, f"{m['name']} listed twice"
                rows[m["name"]] = (m["verdict"], m["ops"].strip(), m["test"])
    return rows


def _public_functions() -> set[str]:
    c10d = dist.distributed_c10d
    with warnings.catch_warnings():  # reading the deprecated ``reduce_op`` alias warns
        warnings.simplefilter("ignore", FutureWarning)
        return {n for n in c10d.__all__ if inspect.isfunction(getattr(c10d, n))} | {
            n for n in dir(dist) if not n.startswith("_") and inspect.isfunction(getattr(dist, n))
            and getattr(dist, n).__module__ == c10d.__name__}


def test_given_torch_public_api_when_reading_the_contracts_table_expect_every_function_listed_and_verdicts_matching_the_patch():
    table = _table()
    missing = sorted(_public_functions() - set(table))
    assert not missing, f"torch.distributed functions docs/TORCH_CONTRACTS.md does not list: {missing}"
    assert not sorted(set(WRAPPED) - set(table)), "wrapped but not in the table"
    for name, (verdict, ops, _) in table.items():
        assert verdict in VERDICTS, (name, verdict)
        if name == "batch_isend_irecv":  # its own shape (ccoll/patch/batch.py), compressing
            assert verdict == "compressed"
            continue
        row = wrap.ROWS.get(name)
        if row is None:
            assert verdict in ("untouched", "refused"), f"{name}: not wrapped, so not {verdict}"
            continue
        assert verdict == ("exact" if row.exact else "compressed"), f"{name}: the table says {verdict}"
        assert ops == f"{row.op} / {row.stat_op or row.op}", f"{name}: ops {ops!r} but the row has {row.op} / {row.stat_op}"


def test_given_contracts_table_when_naming_tests_expect_each_named_test_to_exist():
    with open(DOC) as f:
        named = set(_TEST.findall(f.read()))
    assert named
    for path, test in sorted(named):
        with open(os.path.join(REPO, path)) as f:
            assert re.search(rf"^def {test}\(", f.read(), re.M), f"{path}::{test} does not exist"


def test_given_contracts_table_when_reading_its_summary_expect_counts_equal_to_the_rows():
    table, public = _table(), _public_functions()
    with open(DOC) as f:
        text = " ".join(f.read().split())
    m = re.search(r"Summary: (\d+) public functions compressed \(\+(\d+) private old names\), (\d+) exact, "
                  r"(\d+) refused as a whole .*?, (\d+) untouched — (\d+) public functions", text)
    assert m, "the summary line changed shape"
    counts = {v: sum(1 for n, (verdict, _, _) in table.items() if n in public and verdict == v) for v in VERDICTS}
    private = sum(1 for n in table if n not in public)
    assert [int(g) for g in m.groups()] == [counts["compressed"], private, counts["exact"], counts["refused"],
                                            counts["untouched"], len(public)]
