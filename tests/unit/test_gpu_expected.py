"""ccoll/gpucheck/expected.json, the bytes a GPU machine is checked against, cannot go stale: its cases are
exactly the current matrix (a new codec, spec, dtype or input enters it or this fails), and a sample of
its digests -- one case of every spec, rotating through dtypes, inputs and sizes, and two codecs'
collectives -- is recomputed here with the reference backend. Regenerate with `make gpu-expected`."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ccoll.gpucheck import expected as gpu_expected
from ccoll.gpucheck import matrix

REGENERATE = "the committed digests are stale: run `make gpu-expected` and commit ccoll/gpucheck/expected.json"


@pytest.fixture(scope="module")
def doc():
    return gpu_expected.load()


def test_given_the_committed_file_expect_exactly_the_current_matrix(doc):
    assert doc["format"] == gpu_expected.FORMAT and doc["ops"] == list(gpu_expected.OPS)
    want = {gpu_expected.case_id(*c) for c in gpu_expected.cases(torch)}
    have = set(doc["cases"])
    assert have == want, f"{REGENERATE}; not in the file: {sorted(want - have)[:5]}, no longer in the matrix: " \
                         f"{sorted(have - want)[:5]}"
    assert set(doc["collectives"]["specs"]) == set(matrix._registry_specs()), REGENERATE
    assert (doc["collectives"]["world"], doc["collectives"]["numel"]) == (gpu_expected.COLL_WORLD, gpu_expected.COLL_NUMEL)
    assert all(len(v.split()) == len(gpu_expected.OPS) or v.startswith("refused") for v in doc["cases"].values())


def test_given_one_case_of_every_spec_recomputed_on_the_cpu_expect_the_committed_digests(doc):
    pytest.importorskip("zfpy", reason="the zfp reference is libzfp through zfpy")
    cpu = torch.device("cpu")
    stale = []
    for i, spec in enumerate(matrix.check_specs()):
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


_INPUT_DIGESTS = r"""
import sys, hashlib, torch
from ccoll.gpucheck import expected as gpu_expected, matrix
h = lambda t: hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]
out = [h(matrix.make_input(torch, k, n, d, seed=n))
       for k in matrix.INPUTS for n in (5, 4099) for d in matrix._dtypes(torch)]
out += [h(gpu_expected.collective_input(torch, r)) for r in range(gpu_expected.COLL_WORLD)]
out += [h(gpu_expected.feedback_input(torch, 3 * 4099, 4099, d)) for d in (torch.float32, torch.float64)]
g = torch.Generator().manual_seed(1)
out.append(h(torch.randn(4099, generator=g, dtype=torch.float64) * torch.exp(torch.randn(4099, generator=g, dtype=torch.float64))))
print(" ".join(out))
"""

#: glibc picks its libm variants (and torch its vector kernels) by the CPU; these switch both to the
#: plain x86-64 paths, as a host without FMA / AVX2 / AVX-512 (or a GPU host's different CPU) would run
_OTHER_CPU = {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2,-FMA,-AVX512F", "ATEN_CPU_CAPABILITY": "default"}


def test_given_another_cpus_libm_expect_the_same_input_bits():
    """The digests are computed here and compared on a GPU host whose CPU differs: every input they depend
    on must be the same bits on any CPU. torch.randn/exp are not (the last entry, kept as the control:
    when the switched-off paths change nothing on this CPU, the check proves nothing and is skipped)."""
    import os

    def run(extra):
        env = {**os.environ, **extra}
        proc = subprocess.run([sys.executable, "-c", _INPUT_DIGESTS],
                              capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    here, other = run({}), run(_OTHER_CPU)
    if here[-1] == other[-1]:
        pytest.skip("this CPU's libm variants agree with the baseline x86-64 ones: nothing to compare")
    assert here[:-1] == other[:-1], "an input of the carried digests depends on the CPU's libm/vector paths"


_NONFINITE_DIGESTS = r"""
import sys, torch
from ccoll.gpucheck import expected as gpu_expected
for case in gpu_expected.cases(torch, sys.argv[1].split(";")):
    if case[2] == "nonfinite":
        print(gpu_expected.case_id(*case), gpu_expected.case_digests(torch, *case, "torch", torch.device("cpu")), sep="\t")
"""


def test_given_another_cpus_vector_kernels_expect_the_same_nonfinite_digests(doc):
    """A NaN narrowed to bf16 by torch keeps another payload on its AVX-512 path (0xffff) than on the
    scalar one (0x7fc0), so payloads carrying float bits (casts, lossless) must be compared decoded for
    non-finite inputs (Codec.float_bits_on_wire), or the committed digests hold only on CPUs like this
    one. Recomputed under the baseline x86-64 paths, every such case must match the file."""
    import os

    import ccoll

    specs = [s for s in matrix.check_specs() if ccoll.get_codec(s).float_bits_on_wire]
    proc = subprocess.run([sys.executable, "-c", _NONFINITE_DIGESTS, ";".join(specs)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, **_OTHER_CPU})
    assert proc.returncode == 0, proc.stderr
    got = dict(line.split("\t", 1) for line in proc.stdout.split("\n") if line)
    assert len(got) >= 4 * len(specs)  # every spec's non-finite cases ran
    differ = [f"{cid}: {v} != {doc['cases'][cid]}" for cid, v in got.items() if v != doc["cases"][cid]]
    assert not differ, "digests depend on the CPU's vector kernels:\n" + "\n".join(differ[:10])
