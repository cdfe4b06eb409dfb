"""The shipped ZFP policies (the paper's schemes): configs/zhybrid.yaml and configs/znaive.yaml."""
from __future__ import annotations

import pathlib

import torch

from ccoll import Policy
from ccoll.policy import DIMENSIONS, OPS

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"


def _ratio(codec, numel: int = 1 << 20) -> float:
    return numel * 4 / codec.encoded_nbytes(numel, torch.float32)


def test_given_shipped_zhybrid_when_loading_expect_zfp_low_rate_dp_with_ef_higher_rate_tp_pp_exact_weights():
    p = Policy.from_yaml(CONFIGS / "zhybrid.yaml")
    grad = torch.zeros(1 << 20)
    dp = p.resolve("dp", "all_reduce", grad)
    assert dp.spec.startswith("zfp:") and p.rule("dp", "all_reduce").error_feedback
    assert p.resolve("dp", "reduce_scatter", grad) == dp and p.rule("dp", "reduce_scatter").error_feedback
    for dim, op in (("tp", "all_reduce"), ("tp", "all_gather"), ("pp", "send_recv")):
        c = p.resolve(dim, op, grad)
        assert c.spec.startswith("zfp:") and not p.rule(dim, op).error_feedback, (dim, op)
        assert c.rate > dp.rate and _ratio(c) >= 2  # milder than DP, still compressing
    assert _ratio(dp) >= 6
    assert p.resolve("dp", "all_gather", grad) is None  # ZeRO parameter all-gather: exact
    for dim in ("dp", "tp", "pp"):
        assert p.resolve(dim, "broadcast", grad) is None
    assert p.resolve("pp", "send_recv", torch.zeros(1, 1, 512, 512, dtype=torch.float16)) is None  # NeoX mask
    assert p.resolve("pp", "send_recv", torch.zeros(512, 2, 256, dtype=torch.float16)) is not None
    assert p.resolve("default", "all_reduce", grad) is None


def test_given_shipped_znaive_when_loading_expect_zhybrids_dp_codec_on_every_dim_and_op_without_ef():
    p = Policy.from_yaml(CONFIGS / "znaive.yaml")
    z = Policy.from_yaml(CONFIGS / "zhybrid.yaml")
    specs = {p.rule(d, o).codec for d in DIMENSIONS for o in OPS}
    assert specs == {z.rule("dp", "all_reduce").codec}
    assert not any(p.rule(d, o).error_feedback for d in DIMENSIONS for o in OPS)
    assert p.resolve("dp", "all_gather", torch.zeros(1 << 16)).lossy  # even the weights
    assert p.resolve("dp", "all_reduce", torch.zeros(1023)) is None  # min_bytes 4 KiB
