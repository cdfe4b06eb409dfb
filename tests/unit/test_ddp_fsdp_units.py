"""ccoll.ddp / ccoll.fsdp pieces without a process group: argument errors, state round trips, and the
mapping of the collective's error-feedback keys onto per-parameter residuals. Behaviour on real DDP and
FSDP2: tests/dist/test_ddp_hook_dist.py, tests/dist/test_fsdp_dist.py."""
from __future__ import annotations

import io

import pytest
import torch

from ccoll import get_codec
from ccoll.collectives import segments as segmenting
from ccoll import collectives
from ccoll.ddp import CompressionState, _PackedFeedback
from ccoll.errors import CodecSpecError, PolicyError


def test_given_bad_arguments_when_building_states_expect_codec_spec_errors():
    with pytest.raises(PolicyError, match="warmup_steps"):
        CompressionState(warmup_steps=-1)
    with pytest.raises(CodecSpecError, match="unknown"):
        CompressionState(codec="int9")
    import ccoll.fsdp

    with pytest.raises(PolicyError, match="no FSDP module"):
        ccoll.fsdp.compress(torch.nn.Linear(2, 2))


def test_given_model_when_naming_parameters_expect_model_names_and_unknown_parameter_rejected():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    st = CompressionState(model=model)
    assert [st.name_of(p) for p in model.parameters()] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    with pytest.raises(PolicyError, match="not in the model"):
        st.name_of(torch.nn.Parameter(torch.ones(1)))
    anon = CompressionState()
    assert [anon.name_of(p) for p in reversed(list(model.parameters()))] == ["param0", "param1", "param2", "param3"]


def test_given_compression_state_when_saved_and_loaded_expect_steps_and_residuals_restored():
    st = CompressionState(codec="int8:block=64")
    st.iter = 7
    st.feedback.buffer(("0.weight", "rs"), 64, torch.float32, "cpu", st.codec).fill_(0.5)
    buf = io.BytesIO()
    torch.save(st.state_dict(), buf)
    buf.seek(0)
    fresh = CompressionState(codec="int8:block=64")
    fresh.load_state_dict(torch.load(buf, weights_only=False))
    assert fresh.iter == 7 and torch.equal(fresh.feedback.residual(("0.weight", "rs")), torch.full((64,), 0.5))
    with pytest.raises(PolicyError, match="version"):
        fresh.load_state_dict({"version": 0})


@pytest.mark.parametrize("p, segment_bytes", [(2, None), (2, 4096 * 4 * 2), (4, 4096 * 4 * 4)])
def test_given_packed_bucket_when_collective_asks_for_residuals_expect_views_of_each_parameters_own_residual(
        monkeypatch, p, segment_bytes):
    """Rank 1 of p. Two ranks: the one-exchange all_reduce's "whole" residual of each segment is its span of the
    packed buffer (one segment: all of it). Four ranks with a small SEGMENT_BYTES (flat's algorithm, segmented):
    rows of the reduce-scatter map to consecutive chunks of the packed layout, the all-gather residual to this
    rank's chunk, following the segments. Each parameter's residual moves in once (its stored values kept)
    and is a view from then on, so what the encode writes is the parameter's residual with no write-back.
    The slots are the router's (``collectives.residual_slots``), as ccoll.ddp gets them."""
    if segment_bytes is not None:
        monkeypatch.setattr(segmenting, "SEGMENT_BYTES", segment_bytes)
    codec = get_codec("int8:block=64")
    st = CompressionState(codec=codec)
    sizes = {"a": 64 * 70, "b": 64 * 200}  # padded regions, in canonical order
    regions, off = [], 0
    for name, n in sizes.items():
        regions.append((name, off, n, n))
        for phase in ("rs", "whole"):
            st.feedback.buffer((name, phase), n, torch.float32, "cpu", codec).copy_(
                torch.arange(n) + 1000.0 * (name == "b"))
        off += n
    total = -(-off // (p * 64)) * (p * 64)
    ef = _PackedFeedback(st, regions, total, torch.float32, "cpu", codec,
                         collectives.residual_slots(codec, p, 1, total, torch.float32))
    segments = segmenting.segments(total, p, 4, codec.align_numel)
    assert (len(segments) > 1) == (segment_bytes is not None)
    if p == 2:  # the one-exchange all_reduce: one "whole" residual per segment, its span of the packed buffer
        assert set(ef._packed) == {"whole"}
        for s, (lo, seg_numel, _) in enumerate(segments):
            whole = ef.buffer(("k", "whole") + (() if s == 0 else (s,)), seg_numel, torch.float32, "cpu", codec)
            assert whole.data_ptr() == ef._packed["whole"][lo:].data_ptr() and whole.numel() == seg_numel
            whole.add_(1)
        assert torch.equal(st.feedback.residual(("a", "whole")), torch.arange(sizes["a"]) + 1.0)
        assert torch.equal(st.feedback.residual(("b", "whole")), torch.arange(sizes["b"]) + 1001.0)
        with pytest.raises(PolicyError, match="unexpected"):
            ef.buffer(("k", "rs"), 2 * total, torch.float32, "cpu", codec)
        return
    seen = 0
    for s, (lo, seg_numel, chunk) in enumerate(segments):
        suffix = () if s == 0 else (s,)
        view = ef.buffer(("k", "rs") + suffix, p * chunk, torch.float32, "cpu", codec)  # the segment's p rows
        assert view.numel() == p * chunk and view.is_contiguous()
        assert view.data_ptr() == ef._packed["rs"][lo:].data_ptr()
        view.add_(1)  # what an encode's residual update would do
        seen += p * chunk
        ag = ef.buffer(("k", "ag") + suffix, chunk, torch.float32, "cpu", codec)
        ag.fill_(7)
        assert ag.data_ptr() == ef._packed["ag"][lo + chunk:].data_ptr()  # rank 1 owns the second chunk
    assert seen == total
    assert st.feedback.residual(("b", "rs")).data_ptr() == ef._packed["rs"][sizes["a"]:].data_ptr()
    assert torch.equal(st.feedback.residual(("a", "rs")), torch.arange(sizes["a"]) + 1.0)
    assert torch.equal(st.feedback.residual(("b", "rs")), torch.arange(sizes["b"]) + 1001.0)
    with pytest.raises(PolicyError, match="expected"):
        ef.buffer(("k", "rs"), 3, torch.float32, "cpu", codec)
