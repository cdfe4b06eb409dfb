"""Policy: YAML -> frozen per-(dimension, op) rules; errors name file, dimension and key."""
from __future__ import annotations

import dataclasses
import pathlib

import pytest
import torch

from ccoll import Policy
from ccoll.errors import PolicyError
from ccoll.policy import DEFAULT_MIN_BYTES, DIMENSIONS, OPS, load

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
_BUCKETS = [{"below": "1MiB", "codec": "native"}, {"codec": "int4:block=64"}]


def P(**dims) -> Policy:
    return Policy.from_dict({"version": 1, **dims}, source="t.yaml")


def test_given_dim_codec_when_resolving_each_op_expect_that_codec_and_default_elsewhere():
    p = P(default={"codec": "bf16"}, dp={"codec": "fp16"})
    x = torch.zeros(4096)
    for op in OPS:
        assert p.resolve("dp", op, x).spec == "fp16"
        assert p.resolve("tp", op, x).spec == "bf16"
        assert p.resolve("ep", op, x).spec == "bf16"


def test_given_op_override_when_resolving_expect_lookup_order_op_dim_defaultop_default():
    p = P(default={"codec": "bf16", "min_bytes": 0, "ops": {"broadcast": {"codec": "native"}}},
          dp={"codec": "fp16", "ops": {"all_gather": {"codec": "none"}}})
    x = torch.zeros(64)
    assert p.resolve("dp", "all_gather", x).spec == "none"  # dp.ops.all_gather
    assert p.resolve("dp", "all_reduce", x).spec == "fp16"  # dp
    assert p.resolve("dp", "broadcast", x).spec == "fp16"  # dp beats default.ops
    assert p.resolve("tp", "broadcast", x) is None  # default.ops.broadcast: native
    assert p.rule("tp", "all_reduce").min_bytes == 0  # inherited from default


def test_given_no_codec_anywhere_when_resolving_expect_native_everywhere():
    p = P()
    for dim in DIMENSIONS:
        for op in OPS:
            r = p.rule(dim, op)
            assert r.codec == "native" and r.min_bytes == DEFAULT_MIN_BYTES
            assert p.resolve(dim, op, torch.zeros(1 << 20)) is None


@pytest.mark.parametrize("tensor", [
    torch.zeros(1),  # scalar reductions: loss, grad norm, overflow flag
    torch.zeros(1023),  # 4092 bytes < 4096
    torch.zeros(4096, dtype=torch.int32),
    torch.zeros(4096, dtype=torch.bool),
    torch.zeros(4096, dtype=torch.int64),
])
def test_given_scalar_small_or_integer_tensor_when_resolving_expect_native(tensor):
    p = P(default={"codec": "bf16", "min_bytes": 4096})
    assert p.resolve("dp", "all_reduce", tensor) is None


def test_given_min_bytes_when_size_crosses_it_expect_compression_starts_exactly_there():
    p = P(dp={"codec": "bf16", "min_bytes": "4KiB"})
    assert p.resolve("dp", "all_reduce", (1023, torch.float32)) is None
    assert p.resolve("dp", "all_reduce", (1024, torch.float32)).spec == "bf16"
    assert p.resolve("dp", "all_reduce", ((32, 32), torch.float32)).spec == "bf16"
    assert p.resolve("dp", "all_reduce", torch.zeros(2047, dtype=torch.bfloat16)) is None


def test_given_dtype_the_codec_does_not_take_when_resolving_expect_native():
    p = P(default={"codec": "fp16", "min_bytes": 0})
    assert p.resolve("dp", "all_reduce", torch.zeros(64, dtype=torch.bfloat16)) is None  # fp16 codec: no bf16
    assert p.resolve("dp", "all_reduce", torch.zeros(64, dtype=torch.float32)).spec == "fp16"


def test_given_exclude_by_dtype_and_ndim_when_resolving_expect_only_matching_tensors_exact():
    p = P(pp={"codec": "bf16", "min_bytes": 0, "exclude": [{"dtype": "float16", "ndim": 4}]})
    mask = torch.zeros(1, 1, 64, 64, dtype=torch.float16)
    act = torch.zeros(64, 2, 32, dtype=torch.float16)
    assert p.resolve("pp", "send_recv", mask) is None
    assert p.resolve("pp", "send_recv", ((1, 1, 64, 64), torch.float16)) is None
    # bf16 codec does not take fp16: use a codec that does to see the activation compressed
    p2 = P(pp={"codec": "none", "min_bytes": 0, "exclude": [{"dtype": "float16", "ndim": [4]}]})
    assert p2.resolve("pp", "send_recv", act).spec == "none"
    assert p2.resolve("pp", "send_recv", mask) is None


def test_given_warmup_steps_when_step_below_expect_native_then_codec():
    p = P(dp={"codec": "bf16", "warmup_steps": 3})
    x = torch.zeros(4096)
    assert [p.resolve("dp", "all_reduce", x, step=s) is not None for s in range(5)] == [False] * 3 + [True] * 2
    assert p.resolve("dp", "all_reduce", x) is not None  # step=None: warm-up not considered


def test_given_error_feedback_on_dim_when_normalised_expect_only_reducing_ops_carry_it():
    p = P(dp={"codec": "bf16", "error_feedback": True})
    assert p.rule("dp", "all_reduce").error_feedback and p.rule("dp", "reduce_scatter").error_feedback
    for op in ("all_gather", "broadcast", "all_to_all", "send_recv"):
        assert not p.rule("dp", op).error_feedback


@pytest.mark.parametrize("data, where, words", [
    ({"version": 1, "dp": {"ops": {"all_gather": {"codec": "bf16", "error_feedback": True}}}},
     "dp.ops.all_gather.error_feedback", ["reducing op", "all_reduce, reduce_scatter"]),
    ({"version": 1, "tp": {"codec": "none", "error_feedback": True}}, "tp.error_feedback", ["lossy"]),
    ({"version": 1, "dp": {"codec": "nosuch:rate=3"}}, "dp.codec", ["unknown codec", "bf16", "fp16", "none"]),
    ({"version": 1, "dp": {"codec": "bf16:rate=3"}}, "dp.codec", ["unknown parameter"]),
    ({"version": 1, "dp": {"cdec": "bf16"}}, "dp", ["'cdec'", "codec, min_bytes, error_feedback"]),
    ({"version": 1, "mp": {"codec": "bf16"}}, "top level", ["'mp'", "dp, tp, pp, ep, default"]),
    ({"version": 1, "pp": {"ops": {"sendrecv": {}}}}, "pp.ops", ["'sendrecv'", "send_recv"]),
    ({"version": 1, "dp": {"min_bytes": -1}}, "dp.min_bytes", [">= 0"]),
    ({"version": 1, "dp": {"min_bytes": "12 KB"}}, "dp.min_bytes", ["KiB"]),
    ({"version": 1, "dp": {"warmup_steps": 1.5}}, "dp.warmup_steps", ["optimizer steps"]),
    ({"version": 1, "dp": {"error_feedback": "yes please"}}, "dp.error_feedback", ["true or false"]),
    ({"version": 1, "pp": {"exclude": [{"dtype": "half"}]}}, "pp.exclude[0].dtype", ["float16", "bfloat16"]),
    ({"version": 1, "pp": {"exclude": [{}]}}, "pp.exclude[0]", ["dtype, ndim"]),
    ({"version": 3}, "version", ["version: 1", "version: 2"]),
    ({"dp": {}}, "version", ["version: 1"]),
    (None, "top level", ["version: 1"]),
    ([1, 2], "top level", ["mapping"]),
    # version 2: size buckets, transport, hierarchy
    ({"version": 1, "dp": {"sizes": _BUCKETS}}, "dp.sizes", ["version: 2"]),
    ({"version": 1, "tp": {"ops": {"all_reduce": {"transport": "mpi"}}}}, "tp.ops.all_reduce.transport", ["version: 2"]),
    ({"version": 2, "dp": {"codec": "bf16", "sizes": _BUCKETS}}, "dp", ["not both"]),
    ({"version": 2, "dp": {"sizes": []}}, "dp.sizes", ["non-empty list"]),
    ({"version": 2, "dp": {"sizes": {"below": 1, "codec": "bf16"}}}, "dp.sizes", ["list"]),
    ({"version": 2, "dp": {"sizes": [{"below": "1MiB", "codec": "bf16"}]}}, "dp.sizes[0].below", ["last size bucket"]),
    ({"version": 2, "dp": {"sizes": [{"codec": "bf16"}, {"codec": "fp16"}]}}, "dp.sizes[0]", ["only the last"]),
    ({"version": 2, "dp": {"sizes": [{"below": "2MiB", "codec": "bf16"}, {"below": "1MiB", "codec": "fp16"},
                                     {"codec": "native"}]}}, "dp.sizes[1].below", ["increase", "2097152"]),
    ({"version": 2, "dp": {"sizes": [{"below": "1MiB", "codec": "bf16"}, {"below": "1MiB", "codec": "fp16"},
                                     {"codec": "native"}]}}, "dp.sizes[1].below", ["increase"]),
    ({"version": 2, "dp": {"sizes": [{"below": "1 MB", "codec": "bf16"}, {"codec": "native"}]}}, "dp.sizes[0].below",
     ["below='1 MB'", "MiB"]),
    ({"version": 2, "dp": {"sizes": [{"below": 0, "codec": "bf16"}, {"codec": "native"}]}}, "dp.sizes[0].below",
     ["increase"]),
    ({"version": 2, "dp": {"sizes": [{"below": 10}, {"codec": "native"}]}}, "dp.sizes[0]", ["needs a codec"]),
    ({"version": 2, "dp": {"sizes": [{"below": 10, "codec": "nosuch"}, {"codec": "native"}]}}, "dp.sizes[0].codec",
     ["unknown codec"]),
    ({"version": 2, "dp": {"sizes": [{"upto": 10, "codec": "bf16"}, {"codec": "native"}]}}, "dp.sizes[0]",
     ["'upto'", "below, codec"]),
    ({"version": 2, "dp": {"sizes": [{"below": 10, "codec": "native"}, {"codec": "none"}], "error_feedback": True}},
     "dp.error_feedback", ["lossy"]),
    ({"version": 2, "dp": {"transport": "nccl"}}, "dp.transport", ["'nccl'", "torch, mpi"]),
    ({"version": 2, "pp": {"ops": {"send_recv": {"transport": "mpi"}}}}, "pp.ops.send_recv.transport", ["torch"]),
    ({"version": 2, "dp": {"hierarchy": "rack"}}, "dp.hierarchy", ["'rack'", "node"]),
    ({"version": 2, "dp": {"ops": {"broadcast": {"hierarchy": "node"}}}}, "dp.ops.broadcast.hierarchy",
     ["all_reduce, reduce_scatter, all_gather"]),
    ({"version": True}, "version", ["version: 1", "version: 2"]),
])
def test_given_invalid_policy_when_loading_expect_policyerror_naming_file_dimension_key(data, where, words):
    with pytest.raises(PolicyError) as e:
        Policy.from_dict(data, source="bad.yaml")
    msg = str(e.value)
    assert msg.startswith(f"policy bad.yaml: {where}:"), msg
    for w in words:
        assert w in msg, msg


def test_given_yaml_file_when_loading_expect_same_policy_as_dict_and_errors_name_the_path(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("version: 1\n# comment\ndp:\n  codec: bf16\n  min_bytes: 1MiB\n")
    p = Policy.from_yaml(f)
    assert p == Policy.from_dict({"version": 1, "dp": {"min_bytes": 1 << 20, "codec": "bf16"}})
    assert p.rule("dp", "all_reduce").min_bytes == 1 << 20
    f.write_text("version: 1\ndp: {codec: [\n")
    with pytest.raises(PolicyError, match=f"policy {f}: not valid YAML"):
        Policy.from_yaml(f)
    with pytest.raises(PolicyError, match="cannot read"):
        Policy.from_yaml(tmp_path / "missing.yaml")
    f.write_text("version: 1\ntp: {codec: bf16, error_feedback: 3}\n")
    with pytest.raises(PolicyError, match=rf"policy {f}: tp.error_feedback"):
        Policy.from_yaml(f)


def test_given_equivalent_layouts_when_fingerprinting_expect_equal_and_any_change_differs():
    a = P(dp={"codec": "bf16", "min_bytes": 4096})
    b = P(dp={"min_bytes": "4KiB", "codec": "bf16"}, default={"codec": "native"})
    c = P(dp={"codec": "bf16", "min_bytes": 4097})
    d = P(dp={"codec": "bf16", "min_bytes": 4096, "ops": {"send_recv": {"codec": "native"}}})
    assert a.fingerprint() == b.fingerprint()
    assert len({a.fingerprint(), c.fingerprint(), d.fingerprint()}) == 3
    assert len(a.fingerprint()) == 64


def test_given_policy_when_mutating_rule_expect_frozen():
    p = P(dp={"codec": "bf16"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.rule("dp", "all_reduce").min_bytes = 0  # type: ignore[misc]


def test_given_unknown_dim_or_op_when_resolving_expect_policyerror_listing_valid():
    p = P()
    with pytest.raises(PolicyError, match="dp, tp, pp, ep, default"):
        p.resolve("mp", "all_reduce", torch.zeros(8))
    with pytest.raises(PolicyError, match="send_recv"):
        p.resolve("dp", "send", torch.zeros(8))


def test_given_path_policy_or_dict_when_load_expect_policy_and_other_types_rejected(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("version: 1\n")
    assert load(str(f)) == load(f) == load({"version": 1}) == P()
    with pytest.raises(PolicyError, match="expected a Policy"):
        load(42)  # type: ignore[arg-type]


def test_given_shipped_baseline_when_loading_expect_every_op_native():
    p = Policy.from_yaml(CONFIGS / "baseline.yaml")
    assert all(p.rule(d, o).codec == "native" for d in DIMENSIONS for o in OPS)


def test_given_shipped_hybrid_when_loading_expect_aggressive_dp_with_ef_light_tp_pp_and_exact_weights():
    p = Policy.from_yaml(CONFIGS / "hybrid.yaml")
    grad = torch.zeros(1 << 20)
    dp = p.resolve("dp", "all_reduce", grad)
    assert p.rule("dp", "all_reduce").error_feedback
    fp32_bytes = grad.numel() * 4
    assert fp32_bytes / dp.encoded_nbytes(grad.numel(), torch.float32) >= 4
    for dim, op in (("tp", "all_reduce"), ("tp", "all_gather"), ("pp", "send_recv")):
        c = p.resolve(dim, op, grad)
        assert fp32_bytes / c.encoded_nbytes(grad.numel(), torch.float32) >= 2, (dim, op)
        assert not p.rule(dim, op).error_feedback
    assert p.resolve("dp", "all_gather", grad) is None  # ZeRO parameter all-gather: exact
    for dim in ("dp", "tp", "pp"):
        assert p.resolve(dim, "broadcast", grad) is None  # parameter broadcasts: exact
    assert p.resolve("pp", "send_recv", torch.zeros(1, 1, 512, 512, dtype=torch.float16)) is None  # NeoX mask
    assert p.resolve("pp", "send_recv", torch.zeros(512, 2, 256, dtype=torch.float16)) is not None  # fp16 acts
    assert p.resolve("default", "all_reduce", grad) is None


def test_given_shipped_naive_when_loading_expect_one_lossy_codec_on_every_dim_and_op():
    p = Policy.from_yaml(CONFIGS / "naive.yaml")
    specs = {p.rule(d, o).codec for d in DIMENSIONS for o in OPS}
    assert len(specs) == 1 and specs != {"native"}
    assert p.resolve("dp", "all_reduce", torch.zeros(1 << 16)).lossy
