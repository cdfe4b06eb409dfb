"""ccoll.capture (bounded samples of travelling tensors) and ccoll.bench.rd (rate–distortion on them),
in-process: no process group. The real-training capture is tested in tests/integration/test_convergence.py."""
from __future__ import annotations

import json
import math

import pytest
import torch

from ccoll import callctx, capture
from ccoll.bench import rd


@pytest.fixture
def cap(tmp_path):
    capture.configure(str(tmp_path), steps=[2, 5], per_key=4, max_numel=4096, max_bytes=1 << 20, min_numel=64)
    yield tmp_path
    capture.configure(None)


def _p2p(sending: bool, t, step):  # stands in for ccoll.patch's p2p wrapper: names the call, then decides
    callctx.set_current(callctx.Call("pp", "send_recv", step, sending))
    try:
        capture.sample("pp", "send_recv", t, step)
    finally:
        callctx.set_current(None)


def test_given_capture_on_when_calls_arrive_expect_only_listed_steps_power_of_two_calls_and_metadata(cap):
    for step in range(7):
        for i in range(10):
            capture.sample("dp", "all_reduce", torch.full((100,), float(i)), step)
    capture.sample("dp", "all_reduce", torch.ones(10), 2)  # below min_numel
    capture.sample("dp", "all_reduce", torch.ones(100, dtype=torch.int32), 2)  # not floating point
    got = capture.load(str(cap))
    assert {(x["meta"]["step"], x["meta"]["call"]) for x in got} == {(s, c) for s in (2, 5) for c in (0, 1, 2, 4)}
    for x in got:
        assert torch.equal(x["tensor"], torch.full((100,), float(x["meta"]["call"])))
        assert x["meta"]["dim"] == "dp" and x["meta"]["rank"] == 0 and x["meta"]["in_backward"] is False


def test_given_long_tensor_when_captured_expect_middle_window_and_byte_budget_respected(cap):
    x = torch.arange(10_000, dtype=torch.float16)
    capture.sample("tp", "all_gather", x, 2)
    (got,) = capture.load(str(cap))
    assert got["tensor"].dtype == torch.float32 and got["tensor"].numel() == 4096
    assert got["meta"]["offset"] == (10_000 - 4096) // 2 and got["meta"]["numel"] == 10_000
    assert torch.equal(got["tensor"], x[got["meta"]["offset"]:got["meta"]["offset"] + 4096].float())
    assert got["meta"]["dtype"] == "float16" and got["meta"]["shape"] == [10_000]
    capture.configure(str(cap), steps=[5], max_numel=4096, max_bytes=3 * 4096 * 4)  # room for 3 windows
    for op in ("a", "b", "c", "d", "e"):
        capture.sample("tp", op, torch.ones(5000), 5)
    assert len(capture.load(str(cap))) == 1 + 3


def test_given_send_recv_when_captured_expect_sender_side_only(cap):
    _p2p(True, torch.ones(128), 2)
    _p2p(False, torch.zeros(128), 2)  # a receive buffer: stale data, skipped
    got = capture.load(str(cap))
    assert len(got) == 1 and float(got[0]["tensor"][0]) == 1.0


def test_given_backward_call_when_captured_expect_in_backward_flag(cap):
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            capture.sample("tp", "all_reduce", x.detach(), 2)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            capture.sample("tp", "all_reduce", g, 2)
            return g

    F.apply(torch.ones(256, requires_grad=True)).sum().backward()
    got = sorted(capture.load(str(cap)), key=lambda x: x["meta"]["call"])
    assert [rd.tensor_class(x["meta"]) for x in got] == ["tp/all_reduce:fwd", "tp/all_reduce:bwd"]


def test_given_metadata_when_classified_expect_documented_classes():
    assert rd.tensor_class({"dim": "dp", "op": "all_reduce"}) == "dp/all_reduce"
    assert rd.tensor_class({"dim": "pp", "op": "send_recv", "pp_stage": 0, "pp_size": 3}) == "pp/send:activation"
    assert rd.tensor_class({"dim": "pp", "op": "send_recv", "pp_stage": 2, "pp_size": 3}) == "pp/send:gradient"
    assert rd.tensor_class({"dim": "pp", "op": "send_recv", "pp_stage": 1, "pp_size": 3}) == "pp/send"
    assert rd.tensor_class({"dim": "pp", "op": "send_recv"}) == "pp/send"


def test_given_known_tensor_when_measured_expect_exact_metrics_for_lossless_and_bounded_for_int8():
    import ccoll

    x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    m = rd.measure(x, ccoll.get_codec("none", backend="torch"))
    assert m["bits"] == 32 * 4096 and m["rel_l2"] == 0 and m["max_blk"] == 0 and m["cos"] == pytest.approx(1.0)
    m = rd.measure(x, ccoll.get_codec("int8:block=256", backend="torch"))
    assert m["bits"] / 4096 == pytest.approx(8.125)
    assert 0 < m["max_blk"] <= 0.5 / 127 + 1e-6  # round to nearest: half a step of the block's absmax
    assert m["rel_l2"] < 0.01 and m["cos"] > 0.9999


def test_given_samples_when_rd_main_expect_table_json_plot_and_every_default_family(tmp_path, capsys):
    capture.configure(str(tmp_path / "cap"), steps=[1], per_key=2, min_numel=64)
    try:
        g = torch.Generator().manual_seed(1)
        capture.sample("dp", "all_reduce", torch.randn(8192, generator=g) * 1e-3, 1)
        capture.sample("tp", "all_gather", torch.randn(4096, generator=g), 1)
    finally:
        capture.configure(None)
    specs = rd.default_specs()
    assert {rd.family(s) for s in specs} >= {"zfp dims=1", "zfp dims=2", "int8", "int4", "int4 stochastic", "bf16/fp16"}
    assert "zfp:rate=2.5,dims=1" in specs and "zfp:rate=16,dims=2" in specs
    rc = rd.main([str(tmp_path / "cap"), "--codec", "zfp:rate=8,dims=2;int4:block=64", "--codec", "bf16",
                  "--json", str(tmp_path / "rd.json"), "--plot", str(tmp_path / "rd.png")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "# ccoll.bench.rd" in out and "dp/all_reduce" in out and "zfp:rate=8,dims=2" in out
    doc = json.loads((tmp_path / "rd.json").read_text())
    assert len(doc["rows"]) == 2 * 3 and {c["class"] for c in doc["classes"]} == {"dp/all_reduce", "tp/all_gather"}
    by = {(r["class"], r["codec"]): r for r in doc["rows"]}
    assert by[("dp/all_reduce", "bf16")]["bits_per_value"] == 16
    assert by[("dp/all_reduce", "bf16")]["rel_l2"] < by[("dp/all_reduce", "zfp:rate=8,dims=2")]["rel_l2"]
    assert all(math.isfinite(r["rel_l2"]) and 0 < r["cosine"] <= 1 + 1e-9 for r in doc["rows"])
    assert (tmp_path / "rd.png").read_bytes()[:4] == b"\x89PNG"


def test_given_empty_directory_when_rd_expect_exit_2(tmp_path, capsys):
    assert rd.main([str(tmp_path)]) == 2
    assert "no captured tensors" in capsys.readouterr().err


def test_given_variable_size_codec_when_measured_expect_used_bytes_not_capacity():
    """The lossless codec's payload is a capacity (raw + header); rate-distortion must count what travels."""
    from ccoll import get_codec

    x = torch.zeros(1 << 14)  # one exponent everywhere: the exponent plane codes to almost nothing
    codec = get_codec("lossless")
    m = rd.measure(x, codec)
    assert m["rel_l2"] == 0.0
    assert m["bits"] < 0.9 * codec.encode(x).numel() * 8


def test_given_patched_send_and_recv_when_capturing_expect_the_patch_names_the_side_and_only_sends_kept(cap):
    """The patch's p2p wrappers tell capture which side a call is through ccoll.callctx (no process
    group: the wrappers wrap no-op stand-ins for torch's send/recv)."""
    from ccoll import patch
    from ccoll.policy import Policy

    stub = lambda tensor, peer=None, group=None, tag=0, group_peer=None: None  # noqa: E731
    patch.install(Policy.from_dict({"version": 1, "pp": {"codec": "bf16", "min_bytes": 1 << 30}}),
                  resolver=lambda group, op: "pp", step_counter="manual")
    try:
        for _ in range(2):
            patch.step()
        patch.wrap.make("send", stub)(torch.ones(128), 1)
        patch.wrap.make("recv", stub)(torch.zeros(128), 1)
        patch.wrap.make("irecv", stub)(torch.zeros(128))  # any source: a receive too
    finally:
        patch.uninstall()
    got = capture.load(str(cap))
    assert [(x["meta"]["op"], float(x["tensor"][0])) for x in got] == [("send_recv", 1.0)]
