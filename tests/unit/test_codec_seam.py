"""What every codec declares instead of callers hard-coding it (ccoll/codecs/base.py): example specs, the
documented error bound, determinism, fixed or variable size. Checked for every registered codec, so a new
codec is held to its own declarations here and enters the distributed checks through the same registry."""
from __future__ import annotations

import pytest
import torch

import ccoll
from ccoll.codecs import CODECS, example_specs


def test_given_the_registry_expect_every_codec_declares_example_specs_of_itself():
    specs = example_specs()
    assert len(specs) == len(set(specs))
    for name in CODECS.names():
        own = CODECS.get(name).example_specs()
        assert own and all(ccoll.get_codec(s).name == name for s in own), name
    # what used to be left out of the checks is in
    joined = " ".join(specs)
    assert "fp8:format=e4m3" in joined and "fp8:format=e5m2" in joined and "lossless" in specs
    assert "rotate=hadamard" in joined and "round=stochastic" in joined and "dims=2" in joined


@pytest.mark.parametrize("spec", example_specs())
@pytest.mark.parametrize("dist", ["normal", "outliers", "tiny"])
def test_given_an_example_spec_when_round_tripping_expect_within_its_declared_bound(spec, dist):
    c = ccoll.get_codec(spec)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4099, generator=g)
    if dist == "outliers":
        x[::97] *= 1000
    elif dist == "tiny":
        x *= 2.0**-120
    for chunk in (x, x[1000:1777]):  # a chunk encoded alone stays within the bound declared for the whole
        y = c.decode(c.encode(chunk), chunk.numel(), chunk.dtype)
        err = float((y.double() - chunk.double()).abs().max())
        assert err <= c.error_bound(x), (spec, dist, err, c.error_bound(x))
    rel = c.relative_error_bound()
    if rel is not None and dist != "tiny":  # the relative bound leaves out subnormal floors (error_bound has them)
        assert err <= rel * float(x.abs().max()) or c.name == "zfp"  # zfp's envelope is empirical


@pytest.mark.parametrize("spec", example_specs())
def test_given_an_example_spec_expect_consistent_capability_flags(spec):
    c = ccoll.get_codec(spec)
    assert c.fixed_size is not c.variable_size
    assert c.deterministic is (c.params.get("round", "nearest") != "stochastic")
    x = torch.linspace(-1, 1, 1000)
    if c.deterministic:
        assert torch.equal(c.encode(x), c.encode(x))
    if not c.lossy:
        assert c.error_bound(x) == 0.0 and c.relative_error_bound() == 0.0
