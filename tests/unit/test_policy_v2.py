"""Policy grammar v2: size buckets (``sizes:``), ``transport:`` and ``hierarchy:``; v1 files unchanged."""
from __future__ import annotations

import pathlib

import pytest
import torch

from ccoll import Policy
from ccoll.policy import DIMENSIONS, OPS

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
KiB, MiB = 1 << 10, 1 << 20
BUCKETS = [{"below": "1MiB", "codec": "native"}, {"below": "32MiB", "codec": "int8:block=256"},
           {"codec": "int4:block=64"}]


def _v2(**dims) -> Policy:
    return Policy.from_dict({"version": 2, **dims}, source="t.yaml")


def _spec(policy: Policy, dim: str, op: str, nbytes: int, dtype=torch.float32):
    codec = policy.resolve(dim, op, (nbytes // dtype.itemsize, dtype))
    return None if codec is None else codec.spec.split(",")[0]


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_given_shipped_v1_file_when_loaded_or_relabelled_v2_expect_same_rules_and_fingerprint(path):
    import yaml

    v1 = Policy.from_yaml(path)
    data = yaml.safe_load(path.read_text())
    assert data["version"] == 1
    d = v1.to_dict()
    assert d["version"] == 1
    assert not any(k in rule for ops in d.values() if isinstance(ops, dict) for rule in ops.values()
                   for k in ("sizes", "transport", "hierarchy"))  # v1's normalised form has no v2 keys
    assert Policy.from_dict({**data, "version": 2}) == v1
    for dim in DIMENSIONS:
        for op in OPS:
            r = v1.rule(dim, op)
            assert (r.sizes, r.transport, r.hierarchy) == ((), "torch", None)


def test_given_size_buckets_when_resolving_expect_first_bucket_whose_below_exceeds_nbytes():
    p = _v2(dp={"sizes": BUCKETS, "error_feedback": True})
    assert _spec(p, "dp", "all_reduce", 64 * KiB) is None                 # native bucket
    assert _spec(p, "dp", "all_reduce", MiB - 4) is None
    assert _spec(p, "dp", "all_reduce", MiB) == "int8:block=256"         # below is exclusive
    assert _spec(p, "dp", "all_reduce", 32 * MiB - 4) == "int8:block=256"
    assert _spec(p, "dp", "all_reduce", 32 * MiB) == "int4:block=64"
    assert _spec(p, "dp", "all_reduce", 1 << 30) == "int4:block=64"
    # a tensor and a (shape, dtype) pair agree; bf16 tensors bucket by their own byte size
    t = torch.zeros(4, MiB // 16)  # 1 MiB of fp32
    assert p.resolve("dp", "all_reduce", t).spec.startswith("int8")
    assert p.resolve("dp", "all_reduce", t.to(torch.bfloat16)) is None   # 512 KiB
    r = p.rule("dp", "all_reduce")
    assert r.error_feedback and r.compresses and r.codec.startswith("int4")  # codec: the largest bucket's
    assert p.to_dict()["version"] == 2 and [b.get("below") for b in p.to_dict()["dp"]["all_reduce"]["sizes"]] == \
        [MiB, 32 * MiB, None]


def test_given_buckets_when_min_bytes_warmup_or_exclude_apply_expect_them_to_win_over_the_bucket():
    p = _v2(pp={"sizes": [{"below": "1KiB", "codec": "bf16"}, {"codec": "int8:block=256"}], "min_bytes": "64KiB",
                "warmup_steps": 3, "exclude": [{"dtype": "float16", "ndim": 4}]})
    assert _spec(p, "pp", "send_recv", 32 * KiB) is None  # below min_bytes although a bucket compresses
    x = torch.zeros(1, 1, 256, 256, dtype=torch.float16)
    assert p.resolve("pp", "send_recv", x) is None
    assert p.resolve("pp", "send_recv", torch.zeros(65536), step=2) is None
    assert p.resolve("pp", "send_recv", torch.zeros(65536), step=3).spec.startswith("int8")


def test_given_buckets_that_collapse_when_loaded_expect_same_fingerprint_as_the_simple_rule():
    one = _v2(dp={"sizes": [{"codec": "bf16"}]})
    merged = _v2(dp={"sizes": [{"below": 4096, "codec": "bf16"}, {"below": "1MiB", "codec": "bf16"}, {"codec": "bf16"}]})
    simple = Policy.from_dict({"version": 1, "dp": {"codec": "bf16"}})
    assert one == merged == simple
    two = _v2(dp={"sizes": [{"below": 4096, "codec": "native"}, {"below": "1MiB", "codec": "native"},
                            {"codec": "bf16"}]})
    assert [(b.below, b.codec) for b in two.rule("dp", "all_reduce").sizes] == [(MiB, "native"), (None, "bf16")]


def test_given_sizes_and_codec_at_different_levels_expect_the_most_specific_level_to_win():
    p = _v2(default={"sizes": BUCKETS}, dp={"codec": "bf16", "ops": {"all_gather": {"sizes": BUCKETS}}})
    assert _spec(p, "dp", "all_reduce", 64 * MiB) == "bf16"           # dp.codec beats default.sizes
    assert _spec(p, "dp", "all_gather", 64 * MiB) == "int4:block=64"  # dp.ops.all_gather.sizes beats dp.codec
    assert _spec(p, "tp", "all_reduce", 2 * MiB) == "int8:block=256"  # default.sizes


def test_given_transport_and_hierarchy_on_a_dimension_expect_them_on_the_ops_that_have_them_only():
    p = _v2(dp={"codec": "int4:block=64", "transport": "mpi", "hierarchy": "node",
                "ops": {"all_gather": {"hierarchy": "none"}}})
    assert [p.rule("dp", op).transport for op in OPS] == ["mpi"] * 5 + ["torch"]  # send_recv stays on torch
    assert {op: p.rule("dp", op).hierarchy for op in OPS} == {
        "all_reduce": "node", "all_gather": None, "reduce_scatter": "node", "broadcast": None, "all_to_all": None,
        "send_recv": None}
    assert p.rule("tp", "all_reduce").transport == "torch" and p.rule("tp", "all_reduce").hierarchy is None
    # transport/hierarchy change behaviour, so they change the fingerprint
    assert p != _v2(dp={"codec": "int4:block=64", "hierarchy": "node", "ops": {"all_gather": {"hierarchy": "none"}}})


# bad v2 files: in test_policy.py's table of invalid policies (same check, one place)


def test_given_v2_yaml_file_when_loaded_expect_sizes_with_units_and_comments_ignored(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("version: 2\n# tuned\ndp:\n  sizes:\n    - {below: 1MiB, codec: native}  # small: latency\n"
                 "    - {codec: int4:block=64}\n  transport: mpi\n  error_feedback: true\n")
    p = Policy.from_yaml(f)
    assert _spec(p, "dp", "reduce_scatter", 2 * MiB) == "int4:block=64" and p.rule("dp", "reduce_scatter").transport == "mpi"
    assert "<1048576:native|int4:block=64" in p.describe() and "@mpi" in p.describe()


def test_given_rules_when_asking_passthrough_expect_exactly_the_pairs_torch_always_runs_alone():
    """``Policy.passthrough`` is the patch's short path (one set lookup, torch's call, counted): a pair in it
    must never compress at any size, nor move to the MPI transport; every other pair must be left out."""
    base = Policy.from_yaml(pathlib.Path(__file__).parents[2] / "configs" / "baseline.yaml")
    assert base.passthrough == {(d, op) for d in DIMENSIONS for op in OPS}
    p = _v2(dp={"codec": "native", "transport": "mpi"},
            tp={"sizes": [{"below": "1MiB", "codec": "native"}, {"codec": "int8:block=64"}]})
    for d in DIMENSIONS:
        for op in OPS:
            r = p.rule(d, op)
            assert ((d, op) in p.passthrough) == (not r.compresses and r.transport == "torch"), (d, op)
    assert ("dp", "all_reduce") not in p.passthrough and ("dp", "send_recv") in p.passthrough  # send_recv: torch
    assert ("tp", "all_reduce") not in p.passthrough  # compresses at 1 MiB and above
    assert ("pp", "all_reduce") in p.passthrough
