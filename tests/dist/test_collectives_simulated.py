"""Every collective on the simulated world (ccoll.testing.simulated_world: p ranks as threads over the
in-memory transport), p = 2..64: the shared checks of collective_checks.py (bounds, bit-identical
replicas, async equal to sync) at small p, the reduce/gather collectives at large p, async handles'
futures, salts, and the simulated world's own failure handling. Small tensors: seconds per test."""
from __future__ import annotations

import pytest
import torch

import ccoll
from ccoll.errors import TransportError
from ccoll.stats import dimension
from ccoll.testing import simulated_world
from collective_checks import (
    SimEnv, available_specs, check_all_gather, check_all_reduce, check_all_to_all, check_async, check_broadcast,
    check_point_to_point, check_reduce_scatter, deterministic, roundtrip_bound,
)

#: every registered codec's example specs (Codec.example_specs): a new codec is checked here automatically
SPECS = available_specs()


def _all_checks(rank: int, group, specs: list[str]) -> bool:
    env = SimEnv(rank, group)
    for spec in specs:
        for check in (check_all_reduce, check_reduce_scatter, check_all_gather, check_broadcast,
                      check_all_to_all, check_point_to_point, check_async):
            check(env, spec)
    return True


@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_simulated_given_world_size_when_every_collective_and_codec_expect_within_bound_and_identical(p):
    assert simulated_world(p, _all_checks, SPECS, timeout_s=300) == [True] * p


def _large(rank: int, group, spec: str, inputs: list[torch.Tensor], m: int) -> dict:
    """all_reduce (sync and async with a future), reduce_scatter and all_gather of precomputed inputs."""
    p = group.size()
    x = inputs[rank]
    t = x.clone()
    ccoll.all_reduce(t, "sum", group, spec, min_bytes=0)
    a = x.clone()
    fut = ccoll.all_reduce(a, "sum", group, spec, async_op=True, min_bytes=0).get_future()
    (value,) = fut.wait()
    assert value is a
    rs = torch.empty(m)
    h = ccoll.reduce_scatter_tensor(rs, x, "sum", group, spec, async_op=True, min_bytes=0)
    assert h.get_future().wait() == [rs] and h.is_completed()
    ag = torch.empty(p, m)
    ccoll.all_gather_into_tensor(ag, x[rank * m:(rank + 1) * m], group, spec, min_bytes=0)
    return {"sync": t, "async": a, "rs": rs, "ag": ag}


@pytest.mark.parametrize("p,spec", [
    (16, "bf16"), (16, "int8:block=256"), (16, "int4:block=64"),
    pytest.param(64, "int8:block=256", marks=pytest.mark.slow), pytest.param(64, "bf16", marks=pytest.mark.slow),
])
def test_simulated_given_large_world_when_reducing_and_gathering_expect_bound_identical_replicas_and_futures(p, spec):
    m = 129  # per-rank chunk: p * m elements, not a multiple of any block
    c = ccoll.get_codec(spec)
    inputs = [torch.randn(p * m, generator=torch.Generator().manual_seed(k)) * (1 + k % 3) for k in range(p)]
    ref = sum(x.double() for x in inputs)
    out = simulated_world(p, _large, spec, inputs, m, timeout_s=300)
    # two round trips of each input chunk, plus fp32 accumulation
    bound = 2 * sum(roundtrip_bound(c, x) for x in inputs) + float(ref.abs().max()) * p * 2.0**-22
    for r in range(p):
        assert torch.equal(out[r]["sync"], out[0]["sync"]), f"rank {r} differs"
        assert torch.equal(out[r]["async"], out[0]["sync"]), "async all_reduce differs from sync"
        assert torch.equal(out[r]["ag"], out[0]["ag"])
        mine = ref[r * m:(r + 1) * m]
        assert float((out[r]["rs"].double() - mine).abs().max()) <= bound
    assert float((out[0]["sync"].double() - ref).abs().max()) <= bound
    for k in range(p):
        assert float((out[0]["ag"][k].double() - inputs[k][k * m:(k + 1) * m].double()).abs().max()) <= roundtrip_bound(c, inputs[k])


def _salted(rank: int, group, salt, same_input: bool) -> torch.Tensor:
    p = group.size()
    x = torch.linspace(-1, 1, 4096) * (1 if same_input else rank + 1)
    out = torch.empty(p, 4096)
    ccoll.all_gather_into_tensor(out, x, group, "int4:block=64,round=stochastic", min_bytes=0, salt=salt)
    return out


def test_simulated_given_salt_when_stochastic_rounding_expect_reproducible_rank_decorrelated_and_salt_dependent():
    a = simulated_world(4, _salted, 1234, True)
    b = simulated_world(4, _salted, 1234, True)
    c = simulated_world(4, _salted, 99, True)
    assert all(torch.equal(x, a[0]) for x in a), "replicas identical"
    assert torch.equal(a[0], b[0]), "the same salt reproduces the same bytes"
    assert not torch.equal(a[0], c[0]), "another salt draws other random numbers"
    # same input on every rank, same caller salt: the rank is mixed in, so slots differ
    assert not torch.equal(a[0][0], a[0][1]) and not torch.equal(a[0][1], a[0][2])
    # salt=None: a per-process-and-group call counter; two fresh worlds repeat the same sequence
    n1, n2 = simulated_world(4, _salted, None, True), simulated_world(4, _salted, None, True)
    assert torch.equal(n1[0], n2[0])


def _dims(rank: int, group) -> None:
    with dimension(f"dim{rank % 2}"):  # a context variable: each rank thread has its own
        ccoll.all_reduce(torch.ones(1000), "sum", group, "bf16", min_bytes=0)


def test_simulated_given_stats_dimension_per_rank_thread_expect_each_recorded_under_its_own():
    ccoll.reset_stats()
    simulated_world(4, _dims)
    rows = {(r["dim"], r["op"], r["codec"]): r["calls"] for r in ccoll.stats()}
    assert rows == {("dim0", "all_reduce", "bf16"): 2, ("dim1", "all_reduce", "bf16"): 2}
    ccoll.reset_stats()


def _mismatch(rank: int, group) -> None:
    t = torch.ones(100)
    if rank == 0:
        ccoll.all_reduce(t, "sum", group)
    else:
        ccoll.broadcast(t, 0, group)


def _raises_on_rank_2(rank: int, group) -> None:
    if rank == 2:
        raise ValueError("boom")
    ccoll.all_reduce(torch.ones(10), "sum", group)  # the others would wait for rank 2 for ever


def _stalls(rank: int, group) -> None:
    if rank == 0:
        ccoll.all_reduce(torch.ones(10), "sum", group)


def test_simulated_given_bugs_expect_typed_errors_naming_the_rank_and_no_hang():
    with pytest.raises(TransportError, match="same order"):
        simulated_world(3, _mismatch, timeout_s=20)
    with pytest.raises(ValueError, match="rank 2: boom"):
        simulated_world(4, _raises_on_rank_2, timeout_s=20)
    with pytest.raises(TransportError, match="waited"):
        simulated_world(2, _stalls, timeout_s=1)
