"""The CUDA stream ordering of compressed collectives (ccoll.streams.Call), checked on CPU.

No GPU here, so the device API (streams, events, record_stream) is a recording fake: the real ordering
logic in ccoll.streams.Call and ccoll.collectives runs unchanged against it on the simulated world, and
the test asserts what a GPU run relies on: inputs-ready event on the caller's stream first, every codec
call and every wait on a communication request made with the side stream current, caller tensors kept
alive on the side stream, a done event after the last codec call, and the caller's stream waiting for it
only when the handle's wait() runs. python -m ccoll.gpucheck exercises the real CudaApi.

This fake checks the *calls*; it does not model what they order (its current stream is per thread, but
every thread starts on "caller", so a wait done on a ccoll waiter thread looks right here while on a GPU
it would order that thread's default stream). Whether every read is ordered after its producer and
nothing is freed while another stream uses it is checked by the happens-before model
(tests/streamcheck.py, tests/dist/test_streams_hb.py), which caught exactly that for get_future() and
wait(timeout=).
"""
from __future__ import annotations

import contextlib
import threading

import pytest
import torch

import ccoll
import ccoll.streams as streams
import ccoll.transports.memory as memory
from ccoll.testing import simulated_world

_tls = threading.local()


class FakeApi:
    """Streams are names; events are ("event", n, stream); every call is logged per thread."""

    def __init__(self) -> None:
        self.n = 0

    @staticmethod
    def log(*entry) -> None:
        if not hasattr(_tls, "log"):  # a ccoll waiter thread
            _tls.log = []
        _tls.log.append(entry)

    @staticmethod
    def current() -> str:
        return getattr(_tls, "current", "caller")

    def side_stream(self, device):
        return "side"

    def current_stream(self, device):
        return self.current()

    def record(self, stream, timing=False):
        self.n += 1
        ev = ("event", self.n, stream)
        self.log("record", stream, ev)
        return ev

    def wait(self, stream, event):
        self.log("wait", stream, event)

    @contextlib.contextmanager
    def use(self, stream):
        before = self.current()
        _tls.current = stream
        try:
            yield
        finally:
            _tls.current = before

    def keep(self, tensor, stream):
        self.log("keep", stream, tensor.data_ptr())

    def query(self, event):
        return True

    def elapsed_s(self, start, end):
        return 0.25

    def future(self, device):
        return torch.futures.Future()

    def complete(self, fut, value):
        self.log("complete", self.current())
        fut.set_result(value)


@pytest.fixture
def fake(monkeypatch):
    api = FakeApi()
    monkeypatch.setattr(streams, "_api_for", lambda device: api)
    real_wait = memory._Request.wait

    def logged_wait(self, *args):
        FakeApi.log("comm-wait", FakeApi.current())
        return real_wait(self, *args)

    monkeypatch.setattr(memory._Request, "wait", logged_wait)
    return api


def _codec(spec: str) -> ccoll.Codec:
    c = ccoll.get_codec(spec)
    for name in ("encode_rows", "decode_rows", "decode_sum"):
        inner = getattr(c, name)

        def wrapper(*args, _inner=inner, _name=name, **kwargs):
            FakeApi.log("codec", FakeApi.current(), _name)
            return _inner(*args, **kwargs)

        setattr(c, name, wrapper)
    return c


def _async_all_reduce(rank: int, group, c: ccoll.Codec) -> dict:
    _tls.log = []
    t = torch.randn(3000, generator=torch.Generator().manual_seed(rank))
    h = ccoll.all_reduce(t, "sum", group, c, async_op=True, min_bytes=0)
    at_return = list(_tls.log)
    h.wait()
    return {"at_return": at_return, "log": list(_tls.log), "ptr": t.data_ptr()}


@pytest.mark.parametrize("whole", [True, False], ids=["one-exchange", "flat"])
@pytest.mark.parametrize("spec", ["bf16", "int8:block=256"])
def test_given_async_all_reduce_on_streams_expect_codec_on_side_stream_and_caller_waits_only_in_wait(
    fake, spec, whole, monkeypatch,
):
    from ccoll.collectives import small

    # both all_reduce algorithms (ccoll.collectives.small would pick one exchange for this size)
    monkeypatch.setattr(small, "one_exchange", lambda c, p, numel, dtype: whole)
    codec_calls = ["encode_rows", "decode_sum"] if whole else ["encode_rows", "decode_sum", "encode_rows", "decode_rows"]
    for res in simulated_world(2, _async_all_reduce, _codec(spec)):
        log = res["log"]
        ready = log[0]
        assert ready[:2] == ("record", "caller"), log[:3]
        first_codec = next(i for i, e in enumerate(log) if e[0] == "codec")
        assert ("wait", "side", ready[2]) in log[:first_codec], "side stream waits for the caller's inputs first"
        assert ("keep", "side", res["ptr"]) in log, "the caller's tensor is record_stream-ed on the side stream"
        assert all(e[1] == "side" for e in log if e[0] in ("codec", "comm-wait")), log
        assert [e[2] for e in log if e[0] == "codec"] == codec_calls
        # at return: nothing makes the caller's stream wait yet
        assert not any(e[0] == "wait" and e[1] == "caller" for e in res["at_return"])
        done = [i for i, e in enumerate(log) if e[0] == "record" and e[1] == "side"]
        last_codec = max(i for i, e in enumerate(log) if e[0] == "codec")
        assert len(done) == 1 and done[0] > last_codec
        assert log[-1] == ("wait", "caller", log[done[0]][2]), "wait() makes the caller's stream wait for done"


def _sync_calls(rank: int, group, c: ccoll.Codec) -> list:
    _tls.log = []
    p = group.size()
    x = torch.randn(2 * 1000)
    ccoll.reduce_scatter_tensor(torch.empty(1000), x, "sum", group, c, min_bytes=0)
    ccoll.all_gather_into_tensor(torch.empty(p * 1000), x[:1000], group, c, min_bytes=0)
    ccoll.broadcast(x, 0, group, c, min_bytes=0)
    ccoll.all_to_all_single(torch.empty_like(x), x, group, c, min_bytes=0)
    return list(_tls.log)


def test_given_sync_collectives_on_streams_expect_each_ends_with_caller_waiting_for_its_done_event(fake):
    ccoll.reset_stats()
    for log in simulated_world(2, _sync_calls, _codec("bf16")):
        assert all(e[1] == "side" for e in log if e[0] in ("codec", "comm-wait")), log
        joins = [e for e in log if e[0] == "wait" and e[1] == "caller"]
        dones = [e[2] for e in log if e[0] == "record" and e[1] == "side"]
        assert [e[2] for e in joins] == dones and len(dones) == 4
    # stats seconds come from the events (0.25 s each in the fake), read lazily
    rows = {r["op"]: r for r in ccoll.stats()}
    assert rows["broadcast"]["seconds"] == pytest.approx(2 * 0.25)
    ccoll.reset_stats()


def test_given_cpu_tensors_expect_no_streams():
    assert streams.begin(torch.device("cpu")) is streams.NULL


def _hier_and_varsize_calls(rank: int, group, c: ccoll.Codec, lossless: ccoll.Codec) -> list:
    _tls.log = []
    t = torch.randn(4000, generator=torch.Generator().manual_seed(rank))
    ccoll.all_reduce(t, "sum", group, c, min_bytes=0, hierarchy="node")
    _tls.log.append(("mark", "-"))
    out = torch.empty(group.size() * 1000)
    ccoll.all_gather_into_tensor(out, t[:1000], group, lossless, min_bytes=0)
    return list(_tls.log)


def test_given_hierarchical_and_variable_size_calls_on_streams_expect_the_same_ordering_as_flat(fake):
    """Issue 17: every compressed path runs its codec work and waits on the side stream, and ends with
    the caller's stream waiting for the call's done event (stats seconds then mean the same)."""
    from ccoll.collectives import nodes

    nodes.set_node_map(2)  # 2 nodes x 2 ranks
    try:
        logs = simulated_world(4, _hier_and_varsize_calls, _codec("bf16"), _codec("lossless"))
    finally:
        nodes.set_node_map(None)
    for log in logs:
        mark = log.index(("mark", "-"))
        # the hierarchical form ran (2 nodes: one lossy phase, one encode and one decode-and-sum), then
        # the variable-size all-gather (one encode, one decode)
        assert [e[2] for e in log[:mark] if e[0] == "codec"] == ["encode_rows", "decode_sum"]
        assert [e[2] for e in log[mark:] if e[0] == "codec"] == ["encode_rows", "decode_rows"]
        assert all(e[1] == "side" for e in log if e[0] in ("codec", "comm-wait")), log
        joins = [e[2] for e in log if e[0] == "wait" and e[1] == "caller"]
        dones = [e[2] for e in log if e[0] == "record" and e[1] == "side"]
        assert joins == dones and len(dones) == 2, (joins, dones)


def test_given_cpu_tensors_expect_the_caller_capture_to_be_plain():
    who = streams.caller(torch.device("cpu"))
    assert who.api is None and who.stream is None
    fut = who.future()
    with who.current():
        who.complete(fut, [1])
    assert fut.wait() == [1]


def _future_completion(rank: int, group, c: ccoll.Codec) -> list:
    _tls.log = []
    t = torch.randn(3000)
    with FakeApi().use("compute"):
        fut = ccoll.all_reduce(t, "sum", group, c, async_op=True, min_bytes=0).get_future()
    fut.wait()
    return fut.value()


def test_given_get_future_expect_completion_on_the_stream_current_when_it_was_asked_for(fake, monkeypatch):
    """The waiter thread makes the caller's stream ("compute" here) current before it finishes the call."""
    seen = []
    real = FakeApi.complete
    monkeypatch.setattr(FakeApi, "complete", lambda self, fut, value: (seen.append(self.current()), real(self, fut, value)))
    simulated_world(2, _future_completion, _codec("bf16"))
    assert seen == ["compute", "compute"]
