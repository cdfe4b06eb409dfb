"""ccoll.tune's decision rules on given timing tables: budget, margin (native wins ties), never slower
than native, transport feasibility, and the size buckets written from the choices."""
from __future__ import annotations

import math

from ccoll.policy import Policy
from ccoll.tune import buckets, choose

SIZES = [1 << 16, 1 << 20, 1 << 23]
ERR = {"bf16": 0.002, "int8:block=256": 0.007, "int4:block=64": 0.1}


def _times(rows: dict) -> dict:
    """{(transport, spec): [us per size]} -> the tune table's {(transport, spec, size): us}."""
    return {(tr, spec, s): us for (tr, spec), col in rows.items() for s, us in zip(SIZES, col)}


def test_given_codecs_slower_or_within_margin_when_choosing_expect_native_and_faster_ones_chosen_per_size():
    t = _times({("torch", "native"): [100, 1000, 8000], ("torch", "bf16"): [97, 700, 4000],
                ("torch", "int8:block=256"): [300, 960, 3000]})
    native = {s: t[("torch", "native", s)] for s in SIZES}
    ch = choose(t, native, ERR, budget=0.01, sizes=SIZES, transports=["torch"], margin=0.05)
    # 64K: bf16 is 3% faster, inside the 5% margin: native wins; then the fastest in-budget codec
    assert ch["transport"] == "torch" and ch["per_size"] == [(SIZES[0], "native"), (SIZES[1], "bf16"),
                                                            (SIZES[2], "int8:block=256")]


def test_given_fastest_codec_over_budget_when_choosing_expect_it_excluded():
    t = _times({("torch", "native"): [100, 1000, 8000], ("torch", "int4:block=64"): [10, 100, 800],
                ("torch", "bf16"): [200, 990, 5000]})
    native = {s: t[("torch", "native", s)] for s in SIZES}
    ch = choose(t, native, ERR, budget=0.01, sizes=SIZES, transports=["torch"], margin=0.05)
    assert [spec for _, spec in ch["per_size"]] == ["native", "native", "bf16"]
    ch = choose(t, native, ERR, budget=0.2, sizes=SIZES, transports=["torch"], margin=0.05)
    assert [spec for _, spec in ch["per_size"]] == ["int4:block=64"] * 3


def test_given_mpi_faster_at_most_sizes_but_slower_than_torch_native_at_one_expect_torch_transport():
    t = _times({("torch", "native"): [100, 1000, 8000], ("mpi", "native"): [150, 500, 4000],
                ("mpi", "bf16"): [140, 400, 3000]})
    native = {s: t[("torch", "native", s)] for s in SIZES}
    ch = choose(t, native, ERR, budget=0.01, sizes=SIZES, transports=["torch", "mpi"], margin=0.05)
    assert ch["transport"] == "torch"  # at 64K nothing on MPI is as fast as torch's native
    t[("mpi", "native", SIZES[0])] = 60
    ch = choose(t, native, ERR, budget=0.01, sizes=SIZES, transports=["torch", "mpi"], margin=0.05)
    assert ch["transport"] == "mpi" and [s for _, s in ch["per_size"]] == ["native", "bf16", "bf16"]
    assert all(t[("mpi", spec, s)] <= native[s] for s, spec in ch["per_size"])


def test_given_missing_or_failed_times_when_choosing_expect_them_skipped():
    t = _times({("torch", "native"): [100, 1000, 8000], ("torch", "bf16"): [None, 10, math.inf]})
    native = {s: t[("torch", "native", s)] for s in SIZES}
    ch = choose(t, native, ERR, budget=0.01, sizes=SIZES, transports=["torch"], margin=0.05)
    assert [spec for _, spec in ch["per_size"]] == ["native", "bf16", "native"]


def test_given_choices_per_size_when_writing_buckets_expect_native_below_first_size_and_merged_runs():
    per_size = [(65536, "native"), (1 << 20, "bf16"), (1 << 23, "bf16"), (1 << 26, "int4:block=64")]
    assert buckets(per_size) == [{"below": 1 << 20, "codec": "native"}, {"below": 1 << 26, "codec": "bf16"},
                                 {"codec": "int4:block=64"}]
    assert buckets([(65536, "bf16")]) == [{"below": 65536, "codec": "native"}, {"codec": "bf16"}]
    assert buckets([(65536, "native"), (1 << 20, "native")]) == [{"codec": "native"}]
    p = Policy.from_dict({"version": 2, "dp": {"sizes": buckets(per_size)}})  # what tune writes, loads
    assert p.resolve("dp", "all_reduce", (1 << 18, __import__("torch").float32)).spec == "bf16"


def test_given_confirmation_gates_when_choosing_expect_gate_decides_vs_native_and_fastest_figure_ranks():
    """A candidate's slower pass decides whether it beats native; its faster pass ranks it among the
    candidates (one unlucky pass must not hand a size to a slower codec)."""
    t = _times({("torch", "native"): [100, 1000, 8000], ("torch", "int8:block=256"): [90, 700, 3650],
                ("torch", "bf16"): [85, 800, 3700]})
    gate = dict(t)
    gate[("torch", "int8:block=256", SIZES[2])] = 4000  # confirmed slower, still well under native
    gate[("torch", "bf16", SIZES[1])] = 990  # its second pass lost to native's margin
    native = {s: t[("torch", "native", s)] for s in SIZES}
    ch = choose(t, native, ERR, budget=0.01, sizes=SIZES, transports=["torch"], margin=0.05, gate=gate)
    assert [spec for _, spec in ch["per_size"]] == ["bf16", "int8:block=256", "int8:block=256"]
    gate[("torch", "int8:block=256", SIZES[1])] = 960  # both lose to native at 1 MiB on the second pass
    ch = choose(t, native, ERR, budget=0.01, sizes=SIZES, transports=["torch"], margin=0.05, gate=gate)
    assert [spec for _, spec in ch["per_size"]] == ["bf16", "native", "int8:block=256"]
