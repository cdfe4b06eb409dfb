"""The parts of the collectives layer that need no process group: reduce-op names, handles, error
feedback state, transport selection errors. Multi-rank behaviour is in tests/dist."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import ccoll
from ccoll.errors import TransportError
from ccoll.transports import Handle, for_group, is_mpi_comm, op_name


@pytest.mark.parametrize(
    "given, expected",
    [("sum", "sum"), ("AVG", "avg"), ("mean", "avg"), ("prod", "product"), ("product", "product"),
     (dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg"), (dist.ReduceOp.MAX, "max"),
     (dist.ReduceOp.MIN, "min"), (dist.ReduceOp.PRODUCT, "product")],
)
def test_op_name_given_string_or_reduce_op_expect_canonical_name(given, expected):
    assert op_name(given) == expected


@pytest.mark.parametrize("bad", ["median", dist.ReduceOp.BAND, 3])
def test_op_name_given_unsupported_op_expect_transport_error_listing_ops(bad):
    with pytest.raises(TransportError, match="sum, avg, max, min, product"):
        op_name(bad)


def _ef_encode(ef, key, x, codec, salt: int = 0):
    """One compensated encode the way the collectives do it: the key's residual buffer
    (``call.feedback_buffer``) handed to the batched ``encode_rows`` as ``feedback=``."""
    from ccoll.collectives.call import feedback_buffer, rows

    flat = x.reshape(-1).contiguous()
    out = rows(1, codec.encoded_nbytes(flat.numel(), flat.dtype), flat.device)
    fb = feedback_buffer(ef, key, flat.numel(), flat.dtype, flat.device, codec)
    codec.encode_rows(flat, out, flat.numel(), feedback=fb, salt=salt)
    return out.view(-1)


def test_handle_given_then_when_waited_twice_expect_it_runs_once_and_result_returned():
    calls = []
    h = Handle((), lambda: calls.append(1) or "decoded")
    assert h.is_completed()
    assert h.wait() is True and h.wait() is True
    assert calls == [1] and h.result() == "decoded"


def test_handle_given_nested_handles_expect_inner_then_before_outer():
    order = []
    inner = Handle((), lambda: order.append("inner"))
    outer = Handle([inner], lambda: order.append("outer"))
    assert outer.is_completed()
    outer.wait()
    assert order == ["inner", "outer"]


def test_for_group_given_no_process_group_expect_typed_error():
    assert not dist.is_initialized()
    with pytest.raises(TransportError, match="init_process_group"):
        for_group(None)
    with pytest.raises(TransportError, match="init_process_group"):
        ccoll.all_reduce(torch.ones(4), codec="bf16")


def test_is_mpi_comm_given_torch_objects_expect_false_without_importing_mpi4py():
    import sys

    assert not is_mpi_comm(None) and not is_mpi_comm(torch.ones(1))
    assert "mpi4py" not in sys.modules


def test_error_feedback_given_repeated_encodes_expect_sum_of_decodes_tracks_sum_of_inputs():
    """Telescoping: sum_t decode_t = sum_t x_t - residual_T, so the accumulated error stays one
    step's error however many steps run (without feedback it grows linearly)."""
    codec = ccoll.get_codec("bf16")
    ef = ccoll.ErrorFeedback()
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    steps = 50
    with_ef = torch.zeros(4096, dtype=torch.float64)
    without = torch.zeros(4096, dtype=torch.float64)
    for _ in range(steps):
        with_ef += codec.decode(_ef_encode(ef, "w", x, codec), x.numel(), x.dtype).double()
        without += codec.decode(codec.encode(x), x.numel(), x.dtype).double()
    exact = x.double() * steps
    one_step = float(x.abs().max()) * 2.0**-8
    assert float((with_ef - exact).abs().max()) <= one_step
    assert torch.allclose(with_ef - exact, -ef.residual("w").double(), atol=1e-4)
    assert float((without - exact).abs().max()) > 5 * one_step


def test_error_feedback_given_changed_shape_or_codec_expect_residual_restarts():
    bf16, fp16 = ccoll.get_codec("bf16"), ccoll.get_codec("fp16")
    ef = ccoll.ErrorFeedback()
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    _ef_encode(ef, "w", x, bf16)
    first = ef.residual("w").clone()
    # another codec: the old residual would be the wrong correction; it restarts from zero
    payload = _ef_encode(ef, "w", x, fp16)
    assert torch.equal(payload, fp16.encode(x))
    assert not torch.equal(ef.residual("w"), first)
    # another numel under the same key
    _ef_encode(ef, "w", x[:10], bf16)
    assert ef.residual("w").numel() == 10


def test_error_feedback_given_non_finite_input_expect_residual_stays_finite():
    codec = ccoll.get_codec("bf16")
    ef = ccoll.ErrorFeedback()
    x = torch.randn(256)
    x[3] = float("inf")
    _ef_encode(ef, "g", x, codec)
    assert torch.isfinite(ef.residual("g")).all()
    y = torch.randn(256)
    payload = _ef_encode(ef, "g", y, codec)
    assert torch.isfinite(codec.decode(payload, 256, torch.float32)).all()


def test_error_feedback_given_exact_codec_expect_zero_residual_and_unmodified_payload():
    codec = ccoll.get_codec("none")
    ef = ccoll.ErrorFeedback()
    x = torch.randn(333)
    payload = _ef_encode(ef, "k", x, codec)
    assert torch.equal(payload, codec.encode(x)) and not ef.residual("k").any()


def test_error_feedback_given_reset_of_logical_key_expect_all_derived_keys_dropped():
    codec = ccoll.get_codec("bf16")
    ef = ccoll.ErrorFeedback()
    for k in [("w", "rs", 0), ("w", "rs", 1), ("w", "ag"), ("b", "ag")]:
        _ef_encode(ef, k, torch.randn(8), codec)
    ef.reset("w")
    assert ef.keys() == [("b", "ag")]
    ef.reset()
    assert len(ef) == 0


def test_error_feedback_given_placed_view_expect_stored_values_moved_in_and_view_kept_until_reset():
    """place(): a caller's view becomes the key's residual (the stored values copied in when made for the
    same numel, dtype, device and codec; zeros otherwise), so an encode into the caller's buffer is the
    key's residual and its checkpoint; reset and load_state_dict bump the generation callers re-place on."""
    codec = ccoll.get_codec("int8:block=64")
    ef = ccoll.ErrorFeedback()
    ef.buffer("a", 64, torch.float32, "cpu", codec).fill_(0.5)
    ef.buffer("b", 32, torch.float32, "cpu", codec).fill_(0.25)  # another numel: not moved
    packed = torch.full((192,), 9.0)
    ef.place("a", packed[:64], torch.float32, codec)
    ef.place("b", packed[64:128], torch.float32, codec)
    assert torch.equal(packed[:64], torch.full((64,), 0.5)) and not packed[64:128].any()
    assert torch.equal(packed[128:], torch.full((64,), 9.0))
    packed[:64].add_(1)
    assert ef.residual("a").data_ptr() == packed.data_ptr() and torch.equal(ef.residual("a"), torch.full((64,), 1.5))
    assert torch.equal(dict((k, t) for k, _, t in ef.state_dict()["residuals"])["a"], torch.full((64,), 1.5))
    generation = ef.generation
    ef.load_state_dict(ef.state_dict())
    assert ef.generation == generation + 1 and ef.residual("a").data_ptr() != packed.data_ptr()
    ef.reset("a")
    assert ef.generation == generation + 2 and ef.keys() == ["b"]


def test_stats_given_lazily_timed_calls_expect_seconds_read_only_when_the_table_is():
    """CUDA calls record event-timed seconds (ccoll.streams.LazySeconds); recording must never wait
    for them: only completed ones are folded in on the hot path, the rest when stats are read."""
    from ccoll.stats import record, reset_stats, stats

    class Lazy:
        def __init__(self, done):
            self.done, self.reads = done, 0

        def ready(self):
            return self.done

        def seconds(self):
            self.reads += 1
            return 0.5

    reset_stats()
    pending = [Lazy(False) for _ in range(300)]
    for lz in pending:
        record("all_reduce", "bf16", 100, 50, lz, dim="dp")
    assert all(lz.reads == 0 for lz in pending), "nothing read on the hot path while not ready"
    (row,) = stats()
    assert row["seconds"] == 150.0 and row["calls"] == 300 and "_pending" not in row
    reset_stats()


# --- the one passthrough decision (ccoll.collectives.call.decide) ------------------------------------

class _Group:
    """Just what decide() reads of a transport."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size


def _exact_layouts() -> dict:
    import warnings

    warnings.simplefilter("ignore", UserWarning)
    dense = torch.randn(64, 64)
    q = torch.quantize_per_tensor(dense, scale=0.1, zero_point=0, dtype=torch.qint8)
    return {
        "sparse_coo": dense.to_sparse(),
        "sparse_csr": dense.to_sparse_csr(),
        "complex64": torch.randn(4096, dtype=torch.complex64),
        "quantized": q,
    }


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("what", list(_exact_layouts()))
def test_decide_given_sparse_complex_or_quantized_tensor_expect_exact_native_path(what):
    """Issue 19: codecs take dense real floats; any other layout must take the native call."""
    from ccoll.collectives.call import decide

    t = _exact_layouts()[what]
    assert decide("bf16", t, op="sum", min_bytes=0, transport=_Group(0, 2)) is None
    assert decide("int8:block=64", t, min_bytes=0) is None


def test_decide_given_each_passthrough_rule_expect_none_and_otherwise_the_cached_codec():
    from ccoll.collectives.call import as_codec, decide
    from ccoll.defaults import DEFAULT_MIN_BYTES

    x = torch.randn(4096)
    c = decide("int8:block=64", x, op="avg", min_bytes=0, transport=_Group(1, 4))
    assert c is as_codec("int8:block=64") and c.spec.startswith("int8")
    assert decide(None, x, min_bytes=0) is None
    assert decide("bf16", x, min_bytes=0, transport=_Group(0, 1)) is None  # world size 1
    assert decide("bf16", x, min_bytes=0, transport=_Group(-1, 4)) is None  # outside the group
    assert decide("bf16", torch.ones(4096, dtype=torch.int32), min_bytes=0) is None
    assert decide("bf16", torch.empty(0), min_bytes=0) is None
    assert decide("bf16", x, op="max", min_bytes=0) is None
    assert decide("bf16", x, min_bytes=4 * 4096 + 1) is None
    assert DEFAULT_MIN_BYTES == 8192  # derived in ccoll/defaults.py from python -m ccoll.bench.overhead
    assert decide("bf16", x[:2047]) is None  # the default threshold (8 KiB)
    assert decide("bf16", x[:2048]) is not None
    assert decide("int8:block=64", torch.randn(4096, dtype=torch.float64), min_bytes=0) is None  # not its dtype
    # the pair form a policy uses before there is a group
    assert decide("bf16", ((32, 32), torch.float32), min_bytes=4096) is not None
    assert decide("bf16", (1023, torch.float32), min_bytes=4096) is None


def test_residual_keys_given_phase_and_segment_expect_round_trip_and_short_first_segment_key():
    from ccoll.feedback import parse_residual_key, residual_key

    assert residual_key("w", "rs") == ("w", "rs")
    assert residual_key(("ddp", "a"), "ag", 3) == (("ddp", "a"), "ag", 3)
    for key, phase, seg in [("w", "rs", 0), (("x", 1), "ag", 2), ("n", "node", 5)]:
        assert parse_residual_key(residual_key(key, phase, seg)) == (key, phase, seg)
    for bad in ["w", ("w",), ("w", "zz"), ("w", "rs", -1), ("w", "rs", "a")]:
        with pytest.raises(ValueError):
            parse_residual_key(bad)


def test_given_deterministic_codec_when_salting_expect_no_salt_and_the_call_counter_still_advancing():
    """Deterministic codecs skip the salt mixes (host time per call) but still advance the group's call
    counter, so a stochastic call draws the salt of its position in the call sequence, deterministic
    calls counted, as it did before they were skipped."""
    from ccoll.bench.overhead import _instant_group
    from ccoll.collectives.salts import OWN, REDUCED, salts

    det, sto = ccoll.get_codec("int8:block=256"), ccoll.get_codec("int8:block=256,round=stochastic")
    a, b = _instant_group(4).ccoll_transport, _instant_group(4).ccoll_transport  # two groups, two counters
    assert salts(None, a, det)(OWN, 0) == 0 and salts(7, a, det)(REDUCED, 3) == 0  # call 0 of a (and no count)
    first = salts(None, b, sto)  # call 0 of b
    second = salts(None, b, sto)  # call 1 of b
    got = salts(None, a, sto)  # call 1 of a
    assert got(OWN, 0) == second(OWN, 0) != first(OWN, 0)
    assert got(REDUCED, 1) == second(REDUCED, 1) != 0
    assert salts(5, a, sto)(OWN, 0) == salts(5, b, sto)(OWN, 0) != salts(6, a, sto)(OWN, 0)
