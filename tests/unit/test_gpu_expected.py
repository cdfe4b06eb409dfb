"""tools/gpu_expected.json, the bytes a GPU machine is checked against, cannot go stale: its cases are
exactly the current matrix (a new codec, spec, dtype or input enters it or this fails), and a sample of
its digests -- one case of every spec, rotating through dtypes, inputs and sizes, and two codecs'
collectives -- is recomputed here with the reference backend. Regenerate with `make gpu-expected`."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from ccoll import kernels

sys.path.insert(0, str(Path(kernels.ROOT) / "tools"))
import gpu_check  # noqa: E402
import gpu_expected  # noqa: E402

REGENERATE = "the committed digests are stale: run `make gpu-expected` and commit tools/gpu_expected.json"


@pytest.fixture(scope="module")
def doc():
    return gpu_expected.load()


def test_given_the_committed_file_expect_exactly_the_current_matrix(doc):
    assert doc["format"] == gpu_expected.FORMAT and doc["ops"] == list(gpu_expected.OPS)
    want = {gpu_expected.case_id(*c) for c in gpu_expected.cases(torch)}
    have = set(doc["cases"])
    assert have == want, f"{REGENERATE}; not in the file: {sorted(want - have)[:5]}, no longer in the matrix: " \
                         f"{sorted(have - want)[:5]}"
    assert set(doc["collectives"]["specs"]) == set(gpu_check._registry_specs()), REGENERATE
    assert (doc["collectives"]["world"], doc["collectives"]["numel"]) == (gpu_expected.COLL_WORLD, gpu_expected.COLL_NUMEL)
    assert all(len(v.split()) == len(gpu_expected.OPS) or v.startswith("refused") for v in doc["cases"].values())


def test_given_one_case_of_every_spec_recomputed_on_the_cpu_expect_the_committed_digests(doc):
    pytest.importorskip("zfpy", reason="the zfp reference is libzfp through zfpy")
    cpu = torch.device("cpu")
    stale = []
    for i, spec in enumerate(gpu_check.check_specs()):
        cases = list(gpu_expected.cases(torch, [spec]))
        case = cases[(7 * i) % len(cases)]  # rotates through dtypes, input kinds and sizes across specs
        got = gpu_expected.case_digests(torch, *case, gpu_expected.REFERENCE_BACKEND, cpu)
        cid = gpu_expected.case_id(*case)
        if got != doc["cases"][cid]:
            stale.append(f"{cid}: {got} != {doc['cases'][cid]}")
    assert not stale, f"{REGENERATE}:\n" + "\n".join(stale[:10])


@pytest.mark.parametrize("spec", ["int8:block=256,round=stochastic", "zfp:rate=8"])
def test_given_a_collective_recomputed_on_the_cpu_expect_the_committed_digests(doc, spec):
    if spec.startswith("zfp"):
        pytest.importorskip("zfpy", reason="the zfp reference is libzfp through zfpy")
    got = gpu_expected.collective_digests(torch, spec, torch.device("cpu"))
    assert got == doc["collectives"]["specs"][spec], REGENERATE
