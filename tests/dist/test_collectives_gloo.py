"""ccoll collectives on real gloo process groups (2, 3 and 4 ranks, one spawned group each; plus 1).

All checks live in collective_checks.py and run inside the ranks; these tests launch the groups and
compare figures across world sizes (error must not grow with p)."""
from __future__ import annotations

import os

import pytest
import torch

import ccoll
from collective_checks import GlooEnv, available_specs, data, expect_equal, run_all
from launch import run_gloo

_reports: dict[int, dict] = {}


def _transport_checks(env: GlooEnv) -> None:
    """Transport-level: the point-to-point exchanges (receives first: gloo's default from 1 MiB per peer, and
    the all-to-all fallback) move the same bytes as torch's collectives, also with a user's own tag-0 message
    in flight between the same ranks; [p, nbytes] row buffers (what the collectives pass) move the same bytes
    as their 1-D form, in all_to_all and in all_gather (a [1, nbytes] row or a 1-D input into rows); buffers
    that are not contiguous uint8 are refused with a typed error."""
    import torch.distributed as dist

    from ccoll.errors import TransportError
    from ccoll.transports import for_group
    from ccoll.transports.torch_dist import P2P_MIN_NBYTES, TorchTransport

    p, r = env.world, env.rank
    auto = for_group(None)
    native, p2p = TorchTransport(None, exchange_impl="native"), TorchTransport(None, exchange_impl="p2p")
    assert auto is for_group(None) and auto.world_size == p and auto.rank == r
    assert (auto.exchange_impl, auto.p2p_min_nbytes, p2p.p2p_min_nbytes) == ("p2p", P2P_MIN_NBYTES, 0)
    # CCOLL_EXCHANGE overrides "auto" (not an explicit choice); a value it does not know is a typed error
    os.environ["CCOLL_EXCHANGE"] = "native"
    try:
        assert TorchTransport(None).exchange_impl == "native"
        assert TorchTransport(None, exchange_impl="p2p").exchange_impl == "p2p"
        os.environ["CCOLL_EXCHANGE"] = "fast"
        try:
            TorchTransport(None)
        except TransportError as e:
            assert "CCOLL_EXCHANGE" in str(e), e
        else:
            raise AssertionError("CCOLL_EXCHANGE=fast accepted")
    finally:
        del os.environ["CCOLL_EXCHANGE"]
    # the default's large exchanges (point to point) against torch's collectives, with a user's tag-0
    # message to the next rank posted before them and completed after
    big = torch.arange(p * P2P_MIN_NBYTES, dtype=torch.int64).to(torch.uint8).view(p, -1) + r
    got, want = torch.empty_like(big), torch.empty_like(big)
    peer_to, peer_from = (r + 1) % p, (r - 1) % p
    user_in, user_out = torch.empty(3, dtype=torch.uint8), torch.full((3,), 100 + r, dtype=torch.uint8)
    user_recv = dist.irecv(user_in, peer_from, tag=0)
    auto.all_to_all(got, big)
    native.all_to_all(want, big)
    expect_equal(env, "all_to_all from 1 MiB per peer, point to point", got, want)
    gathered, gathered_native = torch.empty_like(big), torch.empty_like(big)
    auto.all_gather(gathered, big[r:r + 1])
    native.all_gather(gathered_native, big[r:r + 1])
    expect_equal(env, "all_gather from 1 MiB per peer, point to point", gathered, gathered_native)
    dist.isend(user_out, peer_to, tag=0).wait()
    user_recv.wait()
    expect_equal(env, "a user's tag-0 message beside the exchanges", user_in,
                 torch.full((3,), 100 + peer_from, dtype=torch.uint8))
    inp = torch.arange(p * 37, dtype=torch.uint8) + r
    a, b = torch.empty_like(inp), torch.empty_like(inp)
    native.all_to_all(a, inp)
    p2p.all_to_all(b, inp)
    expect_equal(env, "p2p all_to_all fallback", b, a)
    expect_equal(env, "all_to_all bytes", a.view(p, 37)[:, 0], torch.tensor([k + 37 * r for k in range(p)], dtype=torch.uint8))
    p2p.all_to_all(b, inp, async_op=True).wait()
    expect_equal(env, "p2p all_to_all async", b, a)
    # async exchanges are posted on ccoll's posting thread, in program order: several in flight at once, of
    # both kinds, waited for in reverse, move the bytes torch's collectives move
    outs = [(torch.empty_like(big), torch.empty_like(big)) for _ in range(3)]
    handles = []
    for k, (o_a2a, o_ag) in enumerate(outs):
        handles.append(auto.all_to_all(o_a2a, big + k, async_op=True))
        handles.append(auto.all_gather(o_ag, big[r:r + 1] + k, async_op=True))
    for h in reversed(handles):
        h.wait()
        assert h.is_completed()
    for k, (o_a2a, o_ag) in enumerate(outs):
        expect_equal(env, f"async point-to-point all_to_all {k} of 3 in flight", o_a2a, want + k)
        expect_equal(env, f"async point-to-point all_gather {k} of 3 in flight", o_ag, gathered_native + k)
    rows2d = torch.empty(p, 37, dtype=torch.uint8)
    native.all_to_all(rows2d, inp.view(p, 37))
    expect_equal(env, "all_to_all of [p, n] rows", rows2d.view(-1), a)
    mine = torch.arange(5, dtype=torch.uint8) + 10 * r
    flat_out, rows_out, row_in_out = (torch.empty(p * 5, dtype=torch.uint8), torch.empty(p, 5, dtype=torch.uint8),
                                      torch.empty(p, 5, dtype=torch.uint8))
    native.all_gather(flat_out, mine)
    native.all_gather(rows_out, mine.view(1, 5))
    native.all_gather(row_in_out, mine)
    expect_equal(env, "all_gather of a [1, n] row into [p, n]", rows_out.view(-1), flat_out)
    expect_equal(env, "all_gather of a 1-D input into [p, n]", row_in_out.view(-1), flat_out)
    expect_equal(env, "all_gather bytes", flat_out.view(p, 5)[:, 0], torch.tensor([10 * k for k in range(p)], dtype=torch.uint8))
    for bad in (torch.empty(p * 4), torch.empty(p, 8, dtype=torch.uint8)[:, ::2]):
        try:
            native.all_gather(bad, torch.empty(4, dtype=torch.uint8))
        except TransportError:
            pass
        else:
            raise AssertionError(f"{bad.dtype} buffer of strides {bad.stride()} accepted by a byte transport")
    try:
        native.all_gather(torch.empty(p * 4), torch.empty(4))
    except TransportError:
        pass
    else:
        raise AssertionError("float buffer accepted by a byte transport")


def _gloo_group(rank: int, world_size: int) -> dict:
    env = GlooEnv()
    return run_all(env, extra=_transport_checks)


def _report(p: int) -> dict:
    if p not in _reports:
        reports = run_gloo(p, _gloo_group, timeout_s=240)
        _reports[p] = reports[0]
        assert all(rep["specs"] == reports[0]["specs"] for rep in reports)
    return _reports[p]


@pytest.mark.parametrize("p", [2, 3, 4])
def test_gloo_given_world_size_when_every_collective_and_codec_expect_within_bound_and_identical(p):
    report = _report(p)
    assert report["specs"] == available_specs()


@pytest.mark.parametrize("p", [2, 3, 4])
def test_gloo_given_repeated_all_reduce_when_error_feedback_expect_smaller_time_averaged_error(p):
    ef = _report(p)["error_feedback"]
    assert ef["err_ef"] < 0.5 * ef["err_plain"], ef


def test_gloo_given_more_ranks_when_all_reduce_expect_relative_error_does_not_grow():
    """Two codec round trips whatever p (flat's algorithm at every p): going from 2 to 4 ranks must not
    grow the relative error the way per-hop recompression would (that would be ~sqrt(3)x for 3 hops of
    independent errors)."""
    e2, e4 = _report(2)["rel_err"], _report(4)["rel_err"]
    assert e2 and set(e2) == set(e4)
    for spec in e2:
        assert e4[spec] <= 1.3 * e2[spec], (spec, e2[spec], e4[spec])


def test_gloo_given_two_ranks_when_one_exchange_expect_error_not_above_flats():
    """On two ranks a single-segment all_reduce takes one exchange: each input quantized once and the sum
    exact in fp32, against flat's peer chunk quantized and the reduced sum quantized again, so its
    error is not larger (about sqrt(2/3) of flat's for independent errors)."""
    flat, one = _report(2)["rel_err"], _report(2)["rel_err_one_exchange"]
    assert flat and set(flat) == set(one)
    for spec in flat:
        assert one[spec] <= flat[spec], (spec, one[spec], flat[spec])


def _world_one(rank: int, world_size: int) -> None:
    """World size 1: nothing travels, so even a lossy codec leaves the data exact."""
    env = GlooEnv()
    spec = [s for s in available_specs() if ccoll.get_codec(s).lossy][0]
    x = data(80, 0, 5000)
    t = x.clone()
    ccoll.all_reduce(t, "sum", None, spec, min_bytes=0)
    expect_equal(env, "p=1 all_reduce", t, x)
    ccoll.all_reduce(t, "avg", None, spec, min_bytes=0, async_op=True).wait()
    expect_equal(env, "p=1 all_reduce avg async", t, x)
    out = torch.empty(5000)
    ccoll.all_gather_into_tensor(out, x, None, spec, min_bytes=0)
    expect_equal(env, "p=1 all_gather", out, x)
    ccoll.reduce_scatter_tensor(out, x, "sum", None, spec, min_bytes=0)
    expect_equal(env, "p=1 reduce_scatter", out, x)
    ccoll.all_to_all_single(out, x, None, spec, min_bytes=0)
    expect_equal(env, "p=1 all_to_all", out, x)
    ccoll.broadcast(t, 0, None, spec, min_bytes=0)
    expect_equal(env, "p=1 broadcast", t, x)


def test_gloo_given_world_size_one_when_lossy_codec_expect_exact_noop():
    run_gloo(1, _world_one, timeout_s=60)


def _raises(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("boom from rank 1")
    import torch.distributed as dist

    dist.barrier()  # rank 0 waits for a peer that is gone: the launcher must not hang


def test_launch_given_failing_rank_expect_its_traceback_and_no_hang():
    from launch import RankError

    with pytest.raises(RankError, match="boom from rank 1"):
        run_gloo(2, _raises, timeout_s=30)
