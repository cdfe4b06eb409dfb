"""The one-exchange all_reduce of small tensors (ccoll.collectives.small): which calls take it, and that
it is one quantization of each rank's input, decoded-and-summed alike on every rank (bit-identical
replicas), with working error feedback and a resumable residual. Real gloo ranks at p = 2; the
simulated world at p = 2 and 3 (where flat's algorithm stays)."""
from __future__ import annotations

import hashlib

import pytest
import torch

import ccoll
from ccoll.collectives import small
from ccoll.collectives.segments import SEGMENT_BYTES
from ccoll.testing import simulated_world
from collective_checks import data, roundtrip_bound
from launch import run_gloo

SPECS = ("int8:block=256", "bf16", "fp8:format=e4m3,block=32")
N = 3001  # not a multiple of any block or of p


# --- the rule -------------------------------------------------------------------------------------

def test_given_two_ranks_expect_one_exchange_whatever_the_size():
    c = ccoll.get_codec("int8:block=256")
    assert small.one_exchange(c, 2, 16, torch.float32)
    assert small.one_exchange(c, 2, SEGMENT_BYTES // 4, torch.float32)  # the largest single segment
    assert small.one_exchange(c, 2, SEGMENT_BYTES // 4 + 1, torch.float32)  # two segments: pipelined
    assert not small.one_exchange(c, 1, 16, torch.float32)


def test_given_more_than_two_ranks_expect_flat_whatever_the_size():
    """At p > 2 one exchange would receive p-1 whole encoded tensors instead of 2(p-1)/p of one: the
    rule cannot know whether the link makes that pay, so it keeps flat's algorithm."""
    c = ccoll.get_codec("int8:block=256")
    for p in (3, 4, 8, 64, 256):
        assert not small.one_exchange(c, p, 16, torch.float32), p


# --- on ranks --------------------------------------------------------------------------------------

def _expected(c: ccoll.Codec, inputs: list[torch.Tensor], avg: bool) -> torch.Tensor:
    """What every rank must hold: each input encoded once, the p payloads decoded-and-summed in rank
    order in fp32 (the codec's own decode_sum), rounded once to the input dtype."""
    n, dtype = inputs[0].numel(), inputs[0].dtype
    payloads = torch.empty(len(inputs), c.encoded_nbytes(n, dtype), dtype=torch.uint8)
    for k, x in enumerate(inputs):
        c.encode_rows(x.reshape(-1).contiguous(), payloads[k:k + 1], n)
    acc = c.decode_sum(payloads, n, dtype)
    if avg:
        acc.div_(len(inputs))
    return acc.to(dtype)


def _checks(rank: int, p: int, group, spec: str) -> dict:
    c = ccoll.get_codec(spec)
    assert small.one_exchange(c, p, N, torch.float32)
    out = {}
    # sum and avg, fp32 and (where taken) bf16: exactly one quantization of every input
    for op, dtype in (("sum", torch.float32), ("avg", torch.float32), ("sum", torch.bfloat16)):
        if dtype not in c.dtypes:
            continue
        t = data(1, rank, N, dtype)
        ccoll.all_reduce(t, op, group, spec, min_bytes=0)
        inputs = [data(1, k, N, dtype) for k in range(p)]
        out[f"{op}-{dtype}"] = hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()
        if c.deterministic:
            assert torch.equal(t, _expected(c, inputs, op == "avg")), (spec, op, dtype)
        ref = sum(x.double() for x in inputs) / (p if op == "avg" else 1)
        bound = sum(roundtrip_bound(c, x) for x in inputs) / (p if op == "avg" else 1)
        fp32 = sum(float(x.abs().max()) for x in inputs) * p * 2.0**-23  # accumulation in fp32
        rounding = float(ref.abs().max()) * 2.0**-8 * 2 if dtype == torch.bfloat16 else 0.0  # the result's
        bound += fp32 + rounding + 1e-30
        err = float((t.double() - ref).abs().max())
        assert err <= bound * 1.01, (spec, op, dtype, err, bound)
    # async: the same bytes as the sync call
    t = data(1, rank, N)
    ccoll.all_reduce(t, "sum", group, spec, async_op=True, min_bytes=0).wait()
    out["async"] = hashlib.sha256(t.numpy().tobytes()).hexdigest()
    assert out["async"] == out["sum-torch.float32"]
    # a non-contiguous view: results land in the view, the rest untouched
    base = data(2, rank, (31, 40))
    keep = base[:, 1::2].clone()
    view = base[:, ::2]
    ccoll.all_reduce(view, "sum", group, spec, min_bytes=0)
    assert torch.equal(base[:, 1::2], keep)
    out["view"] = hashlib.sha256(view.contiguous().numpy().tobytes()).hexdigest()
    return out


def _feedback(rank: int, p: int, group, spec: str, steps: int = 12) -> dict:
    """Error feedback compensates the one encode (residual ``(key, "whole")``), and a residual saved
    with ``state_dict`` and loaded into a fresh ErrorFeedback continues bit-identically."""
    x = data(70, rank, N)
    ref = sum(data(70, k, N).double() for k in range(p))
    ef = ccoll.ErrorFeedback()
    acc_ef, acc_plain = torch.zeros(N, dtype=torch.float64), torch.zeros(N, dtype=torch.float64)
    for _ in range(steps):
        t = x.clone()
        ccoll.all_reduce(t, "sum", group, spec, error_feedback=ef, key="w", min_bytes=0, salt=1)
        acc_ef += t.double()
        t = x.clone()
        ccoll.all_reduce(t, "sum", group, spec, min_bytes=0, salt=1)
        acc_plain += t.double()
    assert ef.keys() == [("w", "whole")] and ef.residual(("w", "whole")).numel() == N
    err_ef = float((acc_ef / steps - ref).norm() / ref.norm())
    err_plain = float((acc_plain / steps - ref).norm() / ref.norm())
    assert err_ef < 0.5 * err_plain, (spec, err_ef, err_plain)
    resumed = ccoll.ErrorFeedback()
    resumed.load_state_dict(ef.state_dict())
    go_on, again = [], []
    for fb, outs in ((ef, go_on), (resumed, again)):
        for s in range(3):
            t = x.clone()
            ccoll.all_reduce(t, "sum", group, spec, error_feedback=fb, key="w", min_bytes=0, salt=100 + s)
            outs.append(t)
    assert all(torch.equal(a, b) for a, b in zip(go_on, again))
    return {"err_ef": err_ef, "err_plain": err_plain,
            "digest": hashlib.sha256(torch.cat(go_on).numpy().tobytes()).hexdigest()}


def _gloo_rank(rank: int, p: int, specs: tuple) -> dict:
    group = None  # WORLD
    return {spec: {**_checks(rank, p, group, spec), "fb": _feedback(rank, p, group, spec)["digest"]} for spec in specs}


@pytest.mark.parametrize("p", [2])
def test_given_gloo_ranks_when_small_all_reduce_expect_one_quantization_identical_replicas_and_feedback(p):
    results = run_gloo(p, _gloo_rank, SPECS, timeout_s=240)
    assert all(r == results[0] for r in results), "ranks hold different bytes"


def _sim_rank(rank: int, group, specs: tuple) -> dict:
    p = group.ccoll_transport.world_size
    return {spec: _checks(rank, p, group, spec) for spec in specs}


def test_given_simulated_world_of_2_when_small_all_reduce_expect_identical_replicas():
    results = simulated_world(2, _sim_rank, ("int8:block=256", "bf16"), timeout_s=120)
    assert all(r == results[0] for r in results)


def test_given_three_ranks_when_small_all_reduce_expect_flat_residuals():
    """p = 3: flat's two exchanges, so its residual phases, not "whole"."""
    def rank_fn(rank, group):
        ef = ccoll.ErrorFeedback()
        ccoll.all_reduce(data(3, rank, 600), "sum", group, "int8:block=256", error_feedback=ef, key="k", min_bytes=0)
        return sorted(k[1] for k in ef.keys())

    kinds = simulated_world(3, rank_fn, timeout_s=60)
    assert all(k == kinds[0] for k in kinds) and set(kinds[0]) == {"rs", "ag"}


def test_given_two_ranks_when_a_tensor_of_several_segments_expect_each_segment_one_exchange(monkeypatch):
    """Beyond one segment, two ranks pipeline the one-exchange path: each segment encoded once (its own "whole"
    residual) and decoded-and-summed on its own, the same bytes sync and async, on both ranks."""
    import ccoll.collectives.segments as segmenting

    monkeypatch.setattr(segmenting, "SEGMENT_BYTES", 2 * 4 * 512)
    c = ccoll.get_codec("int8:block=256")
    cuts = segmenting.segments(4000, 2, 4, c.align_numel)
    assert len(cuts) == 4

    def rank_fn(rank, group):
        ef = ccoll.ErrorFeedback()
        t = data(3, rank, 4000)
        ccoll.all_reduce(t, "avg", group, c, error_feedback=ef, key="k", min_bytes=0)
        u = data(3, rank, 4000)
        ccoll.all_reduce(u, "avg", group, c, async_op=True, min_bytes=0).wait()
        return sorted(ef.keys(), key=str), t, u

    results = simulated_world(2, rank_fn, timeout_s=60)
    inputs = [data(3, k, 4000) for k in range(2)]
    want = torch.cat([_expected(c, [x[lo:lo + n] for x in inputs], avg=True) for lo, n, _ in cuts])
    for keys, t, u in results:
        assert keys == sorted([("k", "whole")] + [("k", "whole", s) for s in range(1, 4)], key=str)
        assert torch.equal(t, want) and torch.equal(u, want)
