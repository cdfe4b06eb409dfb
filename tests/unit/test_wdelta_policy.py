"""The ``weight_delta:`` policy key (ccoll.policy) and ccoll.wdelta's argument checks (no process group)."""
from __future__ import annotations

import pathlib

import pytest
import torch

from ccoll import Policy
from ccoll.errors import PolicyError
from ccoll.wdelta import WeightDelta

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"


def _policy(dp: dict) -> Policy:
    return Policy.from_dict({"version": 1, "dp": dp})


def test_given_weight_delta_on_all_gather_when_loaded_then_only_all_gather_carries_it():
    p = _policy({"codec": "int4:block=64", "ops": {"all_gather": {"codec": "int8:block=256", "weight_delta": 50}}})
    assert p.rule("dp", "all_gather").weight_delta == 50
    assert all(p.rule("dp", op).weight_delta == 0 for op in ("all_reduce", "reduce_scatter", "broadcast"))
    assert p.rule("tp", "all_gather").weight_delta == 0
    assert "all_gather=" in p.describe() and "+delta/50" in p.describe()


def test_given_dimension_level_weight_delta_when_loaded_then_it_means_the_all_gather():
    p = _policy({"codec": "int8:block=256", "weight_delta": 10})
    assert p.rule("dp", "all_gather").weight_delta == 10
    assert p.rule("dp", "all_reduce").weight_delta == 0


def test_given_no_or_false_weight_delta_when_fingerprinted_then_unchanged_and_on_differs():
    plain = _policy({"codec": "int8:block=256"})
    off = _policy({"codec": "int8:block=256", "ops": {"all_gather": {"weight_delta": False}}})
    on = _policy({"codec": "int8:block=256", "ops": {"all_gather": {"weight_delta": 100}}})
    assert plain.fingerprint() == off.fingerprint()
    assert on.fingerprint() != plain.fingerprint()


@pytest.mark.parametrize("dp, message", [
    ({"codec": "int8:block=256", "ops": {"all_gather": {"weight_delta": True}}}, "refresh interval"),
    ({"codec": "int8:block=256", "ops": {"all_gather": {"weight_delta": -1}}}, "refresh interval"),
    ({"codec": "int8:block=256", "ops": {"all_gather": {"weight_delta": "100"}}}, "refresh interval"),
    ({"codec": "int8:block=256", "ops": {"reduce_scatter": {"weight_delta": 10}}}, "all_gather only"),
    ({"ops": {"all_gather": {"codec": "native", "weight_delta": 10}}}, "lossy codec"),
    ({"ops": {"all_gather": {"codec": "none", "weight_delta": 10}}}, "lossy codec"),
])
def test_given_bad_weight_delta_when_loaded_then_policy_error_names_the_key(dp, message):
    with pytest.raises(PolicyError, match=message) as e:
        _policy(dp)
    assert "weight_delta" in str(e.value)


def test_given_shipped_hybrid_wdelta_when_loaded_then_dp_all_gather_is_int8_delta_rest_as_hybrid():
    wd, hybrid = Policy.from_yaml(CONFIGS / "hybrid_wdelta.yaml"), Policy.from_yaml(CONFIGS / "hybrid.yaml")
    rule = wd.rule("dp", "all_gather")
    assert rule.codec.startswith("int8:block=256") and rule.weight_delta >= 1
    for dim in ("dp", "tp", "pp", "ep", "default"):
        for op in ("all_reduce", "reduce_scatter", "broadcast", "all_to_all", "send_recv"):
            assert wd.rule(dim, op) == hybrid.rule(dim, op), (dim, op)


@pytest.mark.parametrize("kwargs, message", [
    ({"key": None, "step": 0, "refresh_steps": 10}, "key="),
    ({"key": "k", "step": 0, "refresh_steps": 0}, "refresh_steps"),
    ({"key": "k", "step": 0, "refresh_steps": True}, "refresh_steps"),
])
def test_given_bad_arguments_when_weight_delta_gather_then_policy_error(kwargs, message):
    x = torch.zeros(8)
    with pytest.raises(PolicyError, match=message):
        WeightDelta().all_gather_into_tensor(torch.zeros(16), x, codec="int8:block=256", **kwargs)


def test_given_weight_delta_with_v2_size_buckets_when_loaded_then_lossy_buckets_carry_it_and_native_only_is_refused():
    buckets = [{"below": "1MiB", "codec": "native"}, {"codec": "int8:block=256"}]
    p = Policy.from_dict({"version": 2, "dp": {"ops": {"all_gather": {"sizes": buckets, "weight_delta": 20}}}})
    rule = p.rule("dp", "all_gather")
    assert rule.weight_delta == 20 and rule.codec_for(4 << 20) is not None and rule.codec_for(1024) is None
    with pytest.raises(PolicyError, match="weight_delta"):
        Policy.from_dict({"version": 2, "dp": {"ops": {"all_gather": {
            "sizes": [{"below": "1MiB", "codec": "native"}, {"codec": "none"}], "weight_delta": 20}}}})
