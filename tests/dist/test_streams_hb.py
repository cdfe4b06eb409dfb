"""Every asynchronous path of ccoll under the happens-before model of streams (tests/streamcheck.py).

The real ordering code (ccoll.streams.Call, Handle, the collectives, the DDP/FSDP hooks, weight-delta)
runs unchanged on CPU tensors in the simulated world; the model replaces only the device API. Each
rank computes on its own non-default stream ("compute<rank>", current in its thread) as training code
does, consumes the results there or on another stream, then drops every tensor so the allocator model
checks that nothing is reused while another stream may still touch it. A test fails with the model's
message (an unordered read, overwrite, or a free while in use). The patched ``batch_isend_irecv``
needs torch's own batch on a real process group: it runs on two gloo ranks with the model installed in
each (its section below).
"""
from __future__ import annotations

import gc

import pytest
import torch

import ccoll
from ccoll.testing import simulated_world
from tests.streamcheck import Model, algorithms, hook_codec, install, record_algorithms

#: algorithm (tests.streamcheck.algorithms' name) -> the variant tags it ran with under the model, filled by
#: every test of this module; the last test asserts that every algorithm was reached
REACHED: dict[str, set[str]] = {}


@pytest.fixture
def model(monkeypatch):
    record_algorithms(monkeypatch, REACHED)
    return install(monkeypatch, Model())


def _on_compute(model: Model, fn):
    """``fn(rank, group, ...)`` run with the rank's compute stream current and every op tracked; at the
    end its tensors are dropped and the allocator model looks at them."""
    def run(rank, group, *args):
        with model.use(model.stream(f"compute{rank}")), model.tracking():
            out = fn(rank, group, *args)
        gc.collect()
        model.collect()
        return out
    return run


def _finish(model: Model) -> None:
    gc.collect()
    model.collect()
    assert model.violations == [], "\n".join(sorted(set(model.violations)))


def _rand(model: Model, n: int, rank: int, what: str) -> torch.Tensor:
    t = torch.randn(n, generator=torch.Generator().manual_seed(rank))
    model.produce(t, what)
    return t


# --- the future and the timed wait -------------------------------------------------------------

def _future_consumed_elsewhere(model, rank, group, c):
    t = _rand(model, 3000, rank, "gradient")
    h = ccoll.all_reduce(t, "sum", group, c, async_op=True, min_bytes=0)
    fut = h.get_future()
    with model.use(model.stream(f"consumer{rank}")):  # e.g. the optimizer's stream
        out = model.consume(fut)[0]
        model.read(out, "the future's value")
    model.read(t, "the reduced tensor on the stream that asked for the future")


@pytest.mark.parametrize("spec", ["bf16", "int8:block=256"])
def test_given_get_future_consumed_on_another_stream_expect_decoding_ordered_before_every_read(model, spec):
    simulated_world(2, _on_compute(model, lambda r, g, c: _future_consumed_elsewhere(model, r, g, c)),
                    hook_codec(model, ccoll.get_codec(spec)))
    _finish(model)


def _timed_wait(model, rank, group, c):
    t = _rand(model, 3000, rank, "gradient")
    h = ccoll.all_reduce(t, "sum", group, c, async_op=True, min_bytes=0)
    h.wait(timeout=60)
    model.read(t, "the reduced tensor after wait(timeout=)")


def test_given_wait_with_timeout_expect_the_callers_stream_ordered_after_decoding(model):
    simulated_world(2, _on_compute(model, lambda r, g, c: _timed_wait(model, r, g, c)),
                    hook_codec(model, ccoll.get_codec("int8:block=256")))
    _finish(model)


def _wait_again_elsewhere(model, rank, group, c):
    t = _rand(model, 3000, rank, "gradient")
    h = ccoll.all_reduce(t, "sum", group, c, async_op=True, min_bytes=0)
    h.get_future().wait()  # finished on a ccoll thread
    other = model.stream(f"other{rank}")
    with model.use(other):
        h.wait()  # torch's Work.wait(): the current stream waits, every time
        model.read(t, "the reduced tensor after a second wait() on another stream")
        model.keep(t, other)  # the test's own use on a second stream (t belongs to the compute stream)


def test_given_a_finished_handle_waited_on_another_stream_expect_that_stream_ordered_too(model):
    simulated_world(2, _on_compute(model, lambda r, g, c: _wait_again_elsewhere(model, r, g, c)),
                    hook_codec(model, ccoll.get_codec("bf16")))
    _finish(model)


# --- every collective, sync and async ------------------------------------------------------------

def _every_collective(model, rank, group, c, how):
    p = group.size()
    kw = dict(min_bytes=0)
    ef = None if c.variable_size else ccoll.ErrorFeedback()
    async_op = how != "sync"

    def done(h, *outs):
        if h is not None and how == "elsewhere":  # waited and read on another stream only, then dropped
            other = model.stream(f"other{rank}")
            with model.use(other):
                h.wait()
                for o in outs:
                    model.read(o, "a collective's output on another stream")
                    model.keep(o, other)  # the test's own use there (the output belongs to the compute stream)
            return
        if h is not None:
            if how == "future":
                with model.use(model.stream(f"consumer{rank}")):
                    model.consume(h.get_future())
                h.wait()  # and again on the compute stream, where the outputs are read
            elif how == "timeout":
                h.wait(timeout=60)
            else:
                h.wait()
        for o in outs:
            model.read(o, f"a collective's output ({how})")

    x = _rand(model, 2000, rank, "all_reduce input")
    done(ccoll.all_reduce(x, "avg", group, c, async_op, error_feedback=ef, key="g", **kw), x)
    out = torch.empty(1000)
    done(ccoll.reduce_scatter_tensor(out, _rand(model, p * 1000, rank, "rs input"), "sum", group, c, async_op,
                                     error_feedback=ef, key="rs", **kw), out)
    out = torch.empty(p * 1000)
    done(ccoll.all_gather_into_tensor(out, _rand(model, 1000, rank, "ag input"), group, c, async_op, **kw), out)
    b = _rand(model, 1000, rank, "broadcast tensor")
    done(ccoll.broadcast(b, 0, group, c, async_op, **kw), b)
    out = torch.empty(p * 500)
    done(ccoll.all_to_all_single(out, _rand(model, p * 500, rank, "a2a input"), group, c, async_op, **kw), out)
    # point to point: rank 0 -> 1 synchronous, 1 -> 0 asynchronous
    msg = _rand(model, 1000, rank, "message")
    if rank == 0:
        ccoll.send(msg, 1, group, c, **kw)
        got = torch.empty(1000)
        done(ccoll.irecv(got, 1, group, c, **kw), got)
    elif rank == 1:
        got = torch.empty(1000)
        ccoll.recv(got, 0, group, c, **kw)
        model.read(got, "received tensor")
        done(ccoll.isend(msg, 0, group, c, **kw))


@pytest.mark.parametrize("how", ["sync", "wait", "future", "timeout"])
@pytest.mark.parametrize("spec", ["int8:block=256", "lossless"])
def test_given_every_collective_expect_every_read_and_free_ordered(model, spec, how):
    simulated_world(2, _on_compute(model, lambda r, g, c, a: _every_collective(model, r, g, c, a)),
                    hook_codec(model, ccoll.get_codec(spec)), how)
    _finish(model)


#: bytes per pipeline segment in the tests below: int8:block=256 all_reduces of 2000 values run 3 segments
#: on three ranks and 4 on two, reduce_scatter / all_gather of 1000 values per rank 4 spans
SMALL_SEGMENT_BYTES = 3 * 4 * 256


@pytest.mark.parametrize("how", ["sync", "future", "elsewhere"])
def test_given_three_ranks_and_several_segments_expect_every_read_and_free_ordered(model, monkeypatch, how):
    """The flat algorithms as every job of more than two ranks runs them (all_reduce: the all-to-all of every
    rank's chunks, decode-and-sum, all-gather of the reduced chunks), pipelined over several segments so one
    segment's codec work overlaps another's exchange. "elsewhere": every handle waited and its outputs read
    on another stream only, then every tensor dropped: the caller's tensors the side stream used must have
    been kept for it (``side.keep``), as the caller's stream is never ordered after the side stream."""
    from ccoll.collectives import segments

    monkeypatch.setattr(segments, "SEGMENT_BYTES", SMALL_SEGMENT_BYTES)
    simulated_world(3, _on_compute(model, lambda r, g, c, a: _every_collective(model, r, g, c, a)),
                    hook_codec(model, ccoll.get_codec("int8:block=256")), how)
    _finish(model)


def _segmented_all_reduce(model, rank, group, c, async_op):
    ef = ccoll.ErrorFeedback()
    for step in range(2):
        x = _rand(model, 2000, rank + 3 * step, "gradient")
        h = ccoll.all_reduce(x, "sum", group, c, async_op, error_feedback=ef, key="seg", min_bytes=0)
        if h is None:
            model.read(x, f"segmented all_reduce result step {step}")
            continue
        other = model.stream(f"other{rank}")
        with model.use(other):  # waited and read on another stream only, then dropped
            h.wait()
            model.read(x, f"segmented all_reduce result step {step} on another stream")
            model.keep(x, other)


@pytest.mark.parametrize("async_op", [False, True])
def test_given_two_ranks_and_several_segments_expect_the_one_exchange_pipeline_ordered(model, monkeypatch, async_op):
    """Two ranks, a tensor of several segments: the one-exchange pipeline (each segment encoded, all-gathered and
    decoded-and-summed; a sync call decodes segment s-1 while s is on the wire)."""
    from ccoll.collectives import segments

    monkeypatch.setattr(segments, "SEGMENT_BYTES", SMALL_SEGMENT_BYTES)
    simulated_world(2, _on_compute(model, lambda r, g, c, a: _segmented_all_reduce(model, r, g, c, a)),
                    hook_codec(model, ccoll.get_codec("int8:block=256")), async_op)
    _finish(model)


def _error_feedback_dropped(model, rank, group, c):
    """Residuals restored from a checkpoint live on the caller's stream; the next call writes them on
    the side stream; dropping them (reset) before the caller's stream is ordered after that write must
    not hand their memory to the next allocation."""
    fb = ccoll.ErrorFeedback()
    t = _rand(model, 3000, rank, "gradient")
    ccoll.all_reduce(t, "sum", group, c, error_feedback=fb, key="w", min_bytes=0)
    fb.load_state_dict(fb.state_dict())  # residuals now allocated on the caller's stream
    h = ccoll.all_reduce(t, "sum", group, c, async_op=True, error_feedback=fb, key="w", min_bytes=0)
    fb.reset()  # dropped while the side stream may still write them
    gc.collect()
    model.collect()
    h.wait()


def test_given_feedback_residuals_dropped_during_a_call_expect_them_kept_for_the_side_stream(model):
    simulated_world(2, _on_compute(model, lambda r, g, c: _error_feedback_dropped(model, r, g, c)),
                    hook_codec(model, ccoll.get_codec("int8:block=256")))
    _finish(model)


# --- hierarchy -----------------------------------------------------------------------------------

def _hierarchical(model, rank, group, c, async_op):
    t = _rand(model, 4000, rank, "gradient")
    fb = ccoll.ErrorFeedback()
    h = ccoll.all_reduce(t, "sum", group, c, async_op, min_bytes=0, hierarchy="node", error_feedback=fb, key="h")
    if h is not None:
        h.get_future().wait()
        h.wait()
    model.read(t, "hierarchical all_reduce result")
    out = torch.empty(1000)
    h = ccoll.reduce_scatter_tensor(out, _rand(model, 4000, rank, "rs input"), "avg", group, c, async_op,
                                    min_bytes=0, hierarchy="node")
    if h is not None:
        h.wait(timeout=60)
    model.read(out, "hierarchical reduce_scatter result")
    out = torch.empty(4000)
    h = ccoll.all_gather_into_tensor(out, _rand(model, 1000, rank, "ag input"), group, c, async_op, min_bytes=0,
                                     hierarchy="node")
    if h is not None:
        h.wait()
    model.read(out, "hierarchical all_gather result")


@pytest.mark.parametrize("async_op", [False, True])
def test_given_hierarchical_calls_expect_every_read_and_free_ordered(model, async_op):
    from ccoll.collectives import nodes

    nodes.set_node_map(2)  # 2 nodes x 2 ranks
    try:
        simulated_world(4, _on_compute(model, lambda r, g, c, a: _hierarchical(model, r, g, c, a)),
                        hook_codec(model, ccoll.get_codec("int8:block=256")), async_op)
    finally:
        nodes.set_node_map(None)
    _finish(model)


# --- weight delta ---------------------------------------------------------------------------------

def _weight_delta(model, rank, group, c):
    from ccoll.wdelta import WeightDelta

    wd = WeightDelta()
    out = torch.empty(2 * 1000)
    for step in range(3):
        inp = _rand(model, 1000, rank + 10 * step, "partition")
        h = wd.all_gather_into_tensor(out, inp, group, c, True, key="w", step=step, refresh_steps=2, min_bytes=0)
        model.consume(h.get_future())
        model.read(out, f"weight-delta all_gather result step {step}")
        other = model.stream(f"again{rank}")
        with model.use(other):  # waited for again on another stream (a refresh at steps 0 and 2)
            h.wait()
            model.read(out, f"weight-delta result step {step} waited again on another stream")
            model.keep(out, other)
        model.wait(model.current_stream(), model.record(other))  # the next step overwrites out
    # a delta call waited for on another stream, then the reconstruction dropped: its memory belongs to
    # the compute stream (made by the exact refresh there), which is not ordered after the side stream
    inp = _rand(model, 1000, rank + 40, "partition")
    h = wd.all_gather_into_tensor(out, inp, group, c, True, key="w", step=3, refresh_steps=2, min_bytes=0)
    other = model.stream(f"other{rank}")
    with model.use(other):
        h.wait()
        model.read(out, "weight-delta result on another stream")
        model.keep(out, other)
    del h
    wd.reset()


def test_given_weight_delta_calls_expect_every_read_and_free_ordered(model):
    simulated_world(2, _on_compute(model, lambda r, g, c: _weight_delta(model, r, g, c)),
                    hook_codec(model, ccoll.get_codec("int8:block=256")))
    _finish(model)


# --- DDP and FSDP hooks ------------------------------------------------------------------------------

class _Bucket:
    """What compress_hook uses of torch's GradBucket."""

    def __init__(self, params, buf):
        self.params, self.buf = params, buf
        self.grads, off = [], 0
        for p in params:
            self.grads.append(buf[off:off + p.numel()].view(p.shape))
            off += p.numel()

    def buffer(self):
        return self.buf

    def gradients(self):
        return self.grads

    def parameters(self):
        return self.params

    def is_last(self):
        return True


def _ddp(model, rank, group, state_of):
    import ccoll.ddp as ddp

    net = torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.Linear(30, 20))
    state = ddp.CompressionState(group, codec=state_of, model=net, min_bytes=0)
    params = list(net.parameters())
    for step in range(2):
        buf = _rand(model, sum(p.numel() for p in params), rank + 7 * step, "gradient bucket")
        fut = ddp.compress_hook(state, _Bucket(params, buf))
        model.consume(fut)  # the reducer waits for the future, then reads the bucket on its stream
        model.read(buf, f"averaged bucket step {step}")
        del fut
        gc.collect()
        model.collect()
    return state.state_dict()["iter"]


def test_given_ddp_compress_hook_expect_the_bucket_and_packed_residuals_ordered(model, monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: group.size())
    monkeypatch.setattr(dist, "get_rank", lambda group=None: group.rank)
    assert simulated_world(2, _on_compute(model, lambda r, g, c: _ddp(model, r, g, c)),
                           hook_codec(model, ccoll.get_codec("int8:block=64"))) == [2, 2]
    _finish(model)


def _fsdp(model, rank, group, c):
    import torch.distributed as dist
    from ccoll.fsdp import CompressedAllGather, CompressedReduceScatter, FSDPCompression

    state = FSDPCompression(c, c, True, 0, 0)
    rs, ag = CompressedReduceScatter(state, "layer"), CompressedAllGather(state, "layer")
    for step in range(2):
        out = rs.allocate((1000,), dtype=torch.float32, device=torch.device("cpu"))
        rs(out, _rand(model, 2000, rank + step, "unsharded gradient"), group, dist.ReduceOp.SUM)
        model.read(out, "reduced gradient shard")
        full = ag.allocate((2000,), dtype=torch.float32, device=torch.device("cpu"))
        ag(full, _rand(model, 1000, rank + step, "parameter shard"), group)
        model.read(full, "gathered parameters")


def test_given_fsdp_comms_expect_every_read_and_free_ordered(model):
    simulated_world(2, _on_compute(model, lambda r, g, c: _fsdp(model, r, g, c)),
                    hook_codec(model, ccoll.get_codec("int8:block=256")))
    _finish(model)


# --- the patched batch_isend_irecv, on real gloo ranks ---------------------------------------------------
# torch's own batch_isend_irecv needs a real process group, so these checks run on two gloo ranks, each
# with the same model installed in its process (streamcheck.installed) and torch's isend/irecv hooked
# as NCCL communications (streamcheck.hook_torch_p2p); each rank hands its findings back to the test.

#: int8 compresses the float tensors; the int64 tensor (a dtype int8 does not take) and the 8-float
#: tensor (under min_bytes) travel natively inside the same torch batch
BATCH_POLICY = {"version": 1, "default": {"codec": "int8:block=256", "min_bytes": 1024}}

#: the fix as it is, and with each of its orderings taken out (the model must then flag it)
BATCH_VARIANTS = ("fixed", "no join", "no side wait", "no keep")


def _batch_cases(model, rank: int) -> dict:
    """The consumers of one patched batch (compressed and native ops in one list), on the rank's compute
    stream: each case runs a fresh batch, reads its results where the case says, then drops everything
    so the allocator model checks the payloads and the tensors the side stream used."""
    import torch.distributed as dist

    peer = 1 - rank
    compute, consumer = model.stream(f"compute{rank}"), model.stream(f"consumer{rank}")
    mine = _rand(model, 4096, rank, "float tensor sent")
    ints = torch.arange(1000) * (rank + 1)
    model.produce(ints, "int tensor sent")
    small = _rand(model, 8, rank + 2, "small tensor sent")

    def batch():
        got, got_ints, got_small = torch.empty(4096), torch.empty(1000, dtype=torch.int64), torch.empty(8)
        ops = [dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, got, peer),
               dist.P2POp(dist.isend, ints, peer), dist.P2POp(dist.irecv, got_ints, peer),
               dist.P2POp(dist.isend, small, peer), dist.P2POp(dist.irecv, got_small, peer)]
        return dist.batch_isend_irecv(ops), (got, got_ints, got_small)

    def read(outs, where, stream=None):
        for name, t in zip(("compressed", "native int", "native small"), outs):
            model.read(t, f"{name} received tensor ({where})")
            if stream is not None:
                model.keep(t, stream)  # the test's own use on a second stream (the tensor is compute's)

    def dropped():
        gc.collect()
        model.collect()

    # 1. every handle waited on the caller's stream, results read there
    reqs, outs = batch()
    for r in reqs:
        r.wait()
    read(outs, "caller's stream")
    values = [t.clone() for t in outs]
    del reqs, outs
    dropped()
    # 2. waited and read on another stream only (the first wait there finishes the batch)
    reqs, outs = batch()
    with model.use(consumer):
        for r in reqs:
            r.wait()
        read(outs, "another stream", consumer)
    del reqs, outs
    dropped()
    # 3. one op's handle waited (the send's), then the other ops' tensors read; then the receive's
    #    handle waited on another stream and its tensor read there
    reqs, outs = batch()
    reqs[0].wait()
    read(outs, "after waiting the send's handle")
    with model.use(consumer):
        reqs[1].wait()
        read(outs[:1], "after the receive's handle waited on another stream", consumer)
    del reqs, outs
    dropped()
    # 4. the receive's future consumed on another stream
    reqs, outs = batch()
    fut = reqs[1].get_future()
    with model.use(consumer):
        model.consume(fut)
        read(outs, "the future's value on another stream", consumer)
    for r in reqs:
        r.wait()
    del reqs, outs, fut
    dropped()
    assert model.current_stream() is compute
    return {"sent": (mine, ints, small), "received": values}


def _batch_job(rank: int, world: int) -> dict:
    """Every variant of :data:`BATCH_VARIANTS` on this rank, each with its own model: the violations it
    found (and the values of case 1, to check the bytes)."""
    import ccoll.patch as patch
    import ccoll.streams as streams
    from ccoll import Policy
    from tests.streamcheck import Patcher, installed

    from tests.streamcheck import record_algorithms

    out, reached, recorder = {}, {}, Patcher()
    record_algorithms(recorder, reached)  # before patch.install: it builds batch_isend_irecv
    for variant in BATCH_VARIANTS:
        model, breaker = Model(), Patcher()
        if variant == "no join":  # the stream that waits is not ordered after decoding
            breaker.setattr(streams.Call, "join", lambda self: None)
        elif variant == "no side wait":  # the side stream decodes without waiting for the communication
            breaker.setattr(streams.Call, "wrap", lambda self, work: work)
        elif variant == "no keep":  # the caller's tensors not record_stream-ed for the side stream
            breaker.setattr(streams.Call, "keep", lambda self, *tensors: None)
        try:
            with installed(model, torch_p2p=True):
                policy = patch.install(Policy.from_dict(BATCH_POLICY))
                try:
                    hook_codec(model, policy.rule("default", "send_recv").codec_obj)
                    with model.use(model.stream(f"compute{rank}")), model.tracking():
                        values = _batch_cases(model, rank)
                finally:
                    patch.uninstall()
        finally:
            breaker.undo()
        gc.collect()
        model.collect()
        out[variant] = {"violations": sorted(set(model.violations)), **values}
    recorder.undo()
    out["reached"] = {k: sorted(v) for k, v in reached.items()}
    return out


@pytest.fixture(scope="module")
def batch_results():
    from ccoll.launch import run_gloo

    results = run_gloo(2, _batch_job, timeout_s=300)
    for r in results:
        for name, tags in r["reached"].items():
            REACHED.setdefault(name, set()).update(tags)
    return results


def test_given_patched_batch_isend_irecv_expect_every_read_and_free_ordered(batch_results):
    """The patched batch (encode before, one torch batch, decode after) under the model: its results
    read on the caller's stream, on another stream, after waiting another op's handle and through the
    future, then dropped; no unordered read, overwrite or free on either rank."""
    for rank, r in enumerate(batch_results):
        assert r["fixed"]["violations"] == [], f"rank {rank}:\n" + "\n".join(r["fixed"]["violations"])


def test_given_patched_batch_isend_irecv_under_the_model_expect_torchs_values(batch_results):
    """The model changes no bytes: int8 values within a block's rounding of the peer's, natives exact."""
    for rank, r in enumerate(batch_results):
        mine, ints, small = batch_results[1 - rank]["fixed"]["sent"]
        got, got_ints, got_small = r["fixed"]["received"]
        assert torch.allclose(got, mine, atol=mine.abs().max().item() / 100) and not torch.equal(got, mine)
        assert torch.equal(got_ints, ints) and torch.equal(got_small, small)


@pytest.mark.parametrize("broken, flagged", [("no join", "unordered read: 'consume"),
                                              ("no side wait", "unordered read: 'codec decode_rows'"),
                                              ("no keep", "freed while in use")])
def test_given_batch_ordering_broken_on_purpose_expect_the_model_to_flag_it(batch_results, broken, flagged):
    """Negative controls: without the join a consumer's stream reads before decoding; without the side
    stream's wait for the communication, decoding reads the payload before it arrived; without keeping
    the caller's tensors for the side stream, a received tensor decoded there and waited for only on
    another stream is freed while the side stream may still write it."""
    for r in batch_results:
        assert any(v.startswith(flagged) for v in r[broken]["violations"]), r[broken]["violations"]


# --- the model itself ------------------------------------------------------------------------------

def test_given_a_read_on_another_stream_without_an_event_expect_the_model_to_flag_it():
    m = Model()
    a, b = m.stream("a"), m.stream("b")
    t = torch.zeros(4)
    with m.use(a):
        m.produce(t, "t")
    with m.use(b):
        m.read(t, "t")
    assert m.violations and "unordered read" in m.violations[0]
    m2 = Model()
    with m2.use(m2.stream("a")):
        m2.produce(t, "t")
        ev = m2.record(m2.stream("a"))
    m2.wait(m2.stream("b"), ev)
    with m2.use(m2.stream("b")):
        m2.read(t, "t")
    assert m2.violations == []


def test_given_a_tensor_freed_while_another_stream_uses_it_expect_the_model_to_flag_it_unless_kept():
    for kept in (False, True):
        m = Model()
        with m.use(m.stream("a")):
            t = torch.zeros(4)
            m.produce(t, "t")
        m.wait(m.stream("b"), m.record(m.stream("a")))
        with m.use(m.stream("b")):
            m.read(t, "t")
        if kept:
            m.keep(t, m.stream("b"))
        del t
        gc.collect()
        m.collect()
        assert bool(m.violations) != kept, m.violations


# --- the model catches what it is for (the ordering code broken on purpose) --------------------------

def _sync_all_reduce(model, rank, group, c):
    t = _rand(model, 3000, rank, "gradient")
    ccoll.all_reduce(t, "sum", group, c, min_bytes=0)
    model.read(t, "the reduced tensor")


@pytest.mark.parametrize("broken", ["no join", "no wait for the inputs"])
def test_given_the_ordering_broken_on_purpose_expect_the_model_to_flag_it(model, monkeypatch, broken):
    import ccoll.streams as streams

    if broken == "no join":
        monkeypatch.setattr(streams.Call, "join", lambda self: None)
    else:
        monkeypatch.setattr(streams.Call, "on_side", lambda self: model.use(self.side))
    simulated_world(2, _on_compute(model, lambda r, g, c: _sync_all_reduce(model, r, g, c)),
                    hook_codec(model, ccoll.get_codec("bf16")))
    assert any("unordered read" in v for v in model.violations), model.violations


def test_given_get_future_finished_on_the_waiter_threads_own_stream_expect_the_model_to_flag_it(model, monkeypatch):
    """The bug before the fix: the waiter thread joined its own (default) stream and completed a future
    that carried no device."""
    import ccoll.streams as streams

    monkeypatch.setattr(streams, "caller", lambda device: streams.Caller(None))
    simulated_world(2, _on_compute(model, lambda r, g, c: _future_consumed_elsewhere(model, r, g, c)),
                    hook_codec(model, ccoll.get_codec("bf16")))
    assert any("unordered read: 'consume the future's value' on stream consumer0" in v for v in model.violations)


# --- coverage: every algorithm ran under the model ----------------------------------------------------------

#: variants an algorithm must also have run with: flat's all_reduce is the path of every job of more than two
#: ranks, the one-exchange all_reduce of two, both pipelined over segments; the reduce_scatter / all_gather
#: pipelines over spans
REQUIRED_VARIANTS = {
    "ccoll.collectives.flat:all_reduce": {"p>=3", "segments>1"},
    "ccoll.collectives.small:all_reduce": {"p=2", "segments>1"},
    "ccoll.collectives.flat:reduce_scatter_tensor": {"segments>1"},
    "ccoll.collectives.flat:all_gather_into_tensor": {"segments>1"},
}


def test_given_every_test_of_this_module_run_expect_every_algorithm_reached_under_the_model(request):
    """Every algorithm tests.streamcheck.algorithms() derives from ccoll's source (the router's algorithm
    modules, every other stream-call owner, the DDP and FSDP2 hooks) ran under the model in this module, with
    the variants above: a new algorithm fails here until a test runs it under the model. Needs the whole
    module (it reads what the other tests reached): run alone, or with some tests deselected, it skips."""
    mine = [i for i in request.session.items if i.module is request.module and i is not request.node]
    everything = [n for n in dir(request.module) if n.startswith("test_") and n != request.node.name]
    if {i.originalname for i in mine} != set(everything):
        pytest.skip("needs every test of tests/dist/test_streams_hb.py in the session")
    names = algorithms()
    assert len(names) >= 20, names  # the derivation itself still finds the algorithms
    missing = [n for n in names if n not in REACHED]
    assert not missing, "never run under the stream model:\n" + "\n".join(missing)
    short = {n: sorted(v - REACHED[n]) for n, v in REQUIRED_VARIANTS.items() if not v <= REACHED[n]}
    assert not short, f"variants never run under the stream model: {short}"
