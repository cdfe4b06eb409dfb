"""ccoll.patch mechanics without a process group: what is wrapped, idempotence, restoration, step counting.
Behaviour on real ranks (pass-through results, compression, fingerprints): tests/dist/test_patch_dist.py."""
from __future__ import annotations

import inspect
import pathlib
import threading

import pytest
import torch
import torch.distributed as dist

import ccoll.patch as patch
from ccoll import Policy, get_codec
from ccoll.errors import PolicyError

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
BF16 = {"version": 1, "default": {"codec": "bf16"}}


@pytest.fixture(autouse=True)
def _clean():
    patch.uninstall()
    yield
    patch.uninstall()


def _originals():
    return {n: getattr(dist, n) for n in list(patch.WRAPPED) + ["init_process_group"]}


def test_given_torch_213_when_installing_expect_every_old_and_new_name_wrapped_and_restored_by_identity():
    before = _originals()
    for name in ("all_gather_single", "reduce_scatter_single", "_all_gather_base", "_reduce_scatter_base"):
        assert name in before  # the names torch 2.13 exposes
    patch.install(Policy.from_dict(BF16))
    for name, orig in before.items():
        wrapper = getattr(dist, name)
        assert wrapper is not orig and wrapper.__wrapped__ is orig, name
    patch.uninstall()
    assert _originals() == before


def test_given_wrappers_when_inspecting_signatures_expect_torch_parameter_names_for_keyword_callers():
    before = _originals()
    patch.install(Policy.from_dict(BF16))
    for name in patch.WRAPPED:
        ours = list(inspect.signature(getattr(dist, name), follow_wrapped=False).parameters)
        theirs = list(inspect.signature(before[name]).parameters)
        assert ours == theirs, (name, ours, theirs)


def test_given_installed_when_installing_again_expect_no_stacking_and_new_policy_active():
    patch.install(Policy.from_dict(BF16))
    first = _originals()
    patch.install(CONFIGS / "baseline.yaml")  # a path works too
    assert _originals() == first
    assert patch.current_policy() == Policy.from_yaml(CONFIGS / "baseline.yaml")
    patch.uninstall()
    patch.uninstall()  # idempotent
    assert not patch.is_installed()


def test_given_concurrent_installs_and_uninstalls_when_done_expect_wrapped_once_or_fully_restored():
    before = _originals()
    pol = Policy.from_dict(BF16)
    barrier = threading.Barrier(8)

    def worker(i):
        barrier.wait()
        for _ in range(50):
            patch.install(pol)
            if i % 2:
                patch.uninstall()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    patch.install(pol)
    for name, orig in before.items():
        assert getattr(dist, name).__wrapped__ is orig  # never a wrapper of a wrapper
    patch.uninstall()
    assert _originals() == before


def test_given_no_process_group_when_calling_wrapper_expect_the_originals_own_error():
    """Pass-through reaches the original with the same arguments: its error is the one users see."""
    x = torch.ones(4)
    with pytest.raises(Exception) as native:
        dist.all_reduce(x)
    patch.install(Policy.from_dict(BF16))
    with pytest.raises(type(native.value)) as ours:
        dist.all_reduce(x)
    assert str(ours.value) == str(native.value)


def test_given_wrapper_captured_before_uninstall_when_called_after_expect_plain_passthrough():
    patch.install(Policy.from_dict(BF16))
    captured = dist.all_reduce
    patch.uninstall()
    with pytest.raises(Exception) as e:
        captured(torch.ones(4))
    assert "process group" in str(e.value).lower()


def test_given_context_manager_when_nested_expect_previous_installation_restored():
    before = _originals()
    outer = Policy.from_dict(BF16)
    inner = Policy.from_yaml(CONFIGS / "baseline.yaml")
    with patch.installed(outer) as p:
        assert p == outer and patch.current_policy() == outer
        with patch.installed(inner):
            assert patch.current_policy() == inner
        assert patch.current_policy() == outer
    assert not patch.is_installed() and _originals() == before


def test_given_default_step_counter_when_optimizer_steps_expect_counted_and_hook_removed_on_uninstall():
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.1)
    patch.install(Policy.from_dict(BF16))
    for _ in range(3):
        w.grad = torch.ones(3)
        opt.step()
    assert patch.steps() == 3
    with pytest.raises(PolicyError, match="optimizer hook"):
        patch.step()
    patch.uninstall()
    patch.install(Policy.from_dict(BF16), step_counter="manual")
    opt.step()
    assert patch.steps() == 0
    patch.step()
    patch.step()
    assert patch.steps() == 2


def test_given_optimizer_stepped_per_param_group_as_zero_does_when_training_expect_one_step_per_pass():
    """DeepSpeed ZeRO steps its inner torch optimizer once per parameter group, with ``param_groups``
    narrowed to that group (stage_1_and_2.py ``_optimizer_step``): a Hugging Face Trainer's two groups
    (decay / no decay) were counted as two steps. Also two optimizers over disjoint parameters (GAN-style)
    are one training step per pass; the same optimizer stepped again begins the next step."""
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([{"params": [a]}, {"params": [b], "weight_decay": 0.0}], lr=0.1)
    groups = opt.param_groups
    patch.install(Policy.from_dict(BF16))
    for step in range(1, 4):
        a.grad, b.grad = torch.ones(3), torch.ones(2)
        for g in groups:  # what ZeRO's step does for each group
            opt.param_groups = [g]
            opt.step()
        opt.param_groups = groups
        assert patch.steps() == step
    gen, disc = torch.optim.SGD([a], lr=0.1), torch.optim.SGD([b], lr=0.1)
    for step in range(4, 6):
        gen.step()
        disc.step()
        assert patch.steps() == step
    opt.step()  # both groups again: a new step
    opt.step()
    assert patch.steps() == 7


def test_given_bad_arguments_when_installing_expect_typed_errors():
    with pytest.raises(PolicyError, match="step_counter"):
        patch.install(Policy.from_dict(BF16), step_counter="calls")
    with pytest.raises(PolicyError, match="expected a Policy"):
        patch.install(3)  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match="not installed"):
        patch.set_resolver(lambda g, op: None)
    with pytest.raises(PolicyError, match="not installed"):
        patch.step()


def test_given_threads_passing_calls_through_while_stats_read_when_done_expect_every_call_counted_once():
    """Pass-through calls are counted per thread without a lock and flushed when stats are read; a reader
    running concurrently must neither lose nor double-count a call. (The wrapper is built around a no-op
    stand-in for torch's all_reduce: no process group here.)"""
    import ccoll

    patch.install(Policy.from_dict({"version": 1, "dp": {"codec": "bf16", "min_bytes": 4096}}),
                  resolver=lambda group, op: "dp")
    wrapped = patch.wrap.make("all_reduce", lambda tensor, op=None, group=None, async_op=False: None)
    ccoll.reset_stats()
    small, scalar = torch.ones(16), torch.ones(1)
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            ccoll.stats()

    def caller():
        for i in range(2000):
            wrapped(small if i % 2 else scalar)

    r = threading.Thread(target=reader)
    r.start()
    callers = [threading.Thread(target=caller) for _ in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    stop.set()
    r.join()
    (row,) = ccoll.stats()
    assert (row["dim"], row["op"], row["codec"], row["calls"]) == ("dp", "all_reduce", "native", 8000)
    assert row["raw_bytes"] == row["wire_bytes"] == 4000 * 64 + 4000 * 4
    assert row["histogram"] == {"64": 4000, "4": 4000}
    ccoll.reset_stats()
    assert ccoll.stats() == []


def test_given_skipped_optimizer_step_when_keying_error_feedback_expect_same_keys_not_new_ones():
    """fp16 overflow: the optimizer skips its step, the ordinals are not reset; the next step's calls must
    still reuse the residuals of the same logical tensors (no unbounded growth)."""
    patch.install(Policy.from_dict(BF16), step_counter="manual")
    st = patch._STATE
    step1 = [st.ef_key("dp", "all_reduce", None) for _ in range(3)]
    patch.step()
    skipped = [st.ef_key("dp", "all_reduce", None) for _ in range(3)]  # overflow: no step counted
    after = [st.ef_key("dp", "all_reduce", None) for _ in range(3)]
    patch.step()
    normal = [st.ef_key("dp", "all_reduce", None) for _ in range(3)]
    assert step1 == skipped == after == normal
    assert len(set(step1)) == 3


def test_given_installed_when_building_p2pop_expect_same_isend_object_in_both_torch_modules_and_restored():
    """torch's P2POp checks its op against distributed_c10d.isend/irecv by identity."""
    c10d = dist.distributed_c10d
    before = {n: getattr(c10d, n) for n in patch.C10D_TOO}
    patch.install(Policy.from_dict(BF16))
    for name in patch.C10D_TOO:
        assert getattr(c10d, name) is getattr(dist, name) and getattr(c10d, name) is not before[name], name
    patch.uninstall()
    assert {n: getattr(c10d, n) for n in patch.C10D_TOO} == before


def test_given_patch_state_when_saved_and_loaded_into_new_installation_expect_same_keys_salts_and_residuals():
    patch.install(Policy.from_dict(BF16), step_counter="manual")
    st = patch._STATE
    keys = [st.call_key("dp", "all_reduce", None) for _ in range(2)]
    assert keys == [("dp", "all_reduce", "world", 0), ("dp", "all_reduce", "world", 1)]
    patch.step()
    st.call_key("dp", "all_reduce", None)  # mid-step: one call done
    st.feedback.buffer(keys[0], 8, torch.float32, "cpu", get_codec("bf16")).fill_(0.25)
    saved = torch.load(_roundtrip(patch.state_dict()), weights_only=False)
    expected_next = st.call_key("dp", "all_reduce", None)
    expected_salt = st.salt(expected_next)
    patch.uninstall()

    patch.install(Policy.from_dict(BF16), step_counter="manual")
    patch.load_state_dict(saved)
    st = patch._STATE
    assert patch.steps() == 1
    nxt = st.call_key("dp", "all_reduce", None)
    assert nxt == expected_next and st.salt(nxt) == expected_salt
    assert torch.equal(st.feedback.residual(keys[0]), torch.full((8,), 0.25))
    with pytest.raises(PolicyError, match="version"):
        patch.load_state_dict({"version": 99})
    patch.uninstall()
    with pytest.raises(PolicyError, match="not installed"):
        patch.load_state_dict(saved)
    with pytest.raises(PolicyError, match="not installed"):
        patch.state_dict()


def _roundtrip(state):
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return buf


def test_given_stable_salt_when_computed_expect_fixed_value_independent_of_python_hash_seed():
    """Salts must agree between the process that saved a checkpoint and the one that resumes it;
    Python's hash() of strings changes per process, so the value is pinned here."""
    assert patch.stable_salt(3, ("dp", "all_reduce", "world", 0)) == patch.stable_salt(3, ("dp", "all_reduce", "world", 0))
    assert patch.stable_salt(3, ("dp", "all_reduce", "world", 0)) != patch.stable_salt(4, ("dp", "all_reduce", "world", 0))
    assert patch.stable_salt(0, ("x",)) == 5960566720500973788
