"""Weight-delta all-gather (ccoll.wdelta) on real gloo ranks, in ZeRO-1's shape: each rank owns one
partition of a flat weight buffer, writes its updated partition into its own slot of that buffer and
all-gathers with the slot as input (input aliases output, as in DeepSpeed's stage_1_and_2).

One job of 3 ranks checks, step after step: every rank's gathered buffer is bit-identical; the
reconstruction error of every partition against its owner's true weights stays within the block
quantiser's bound (it does not drift); exact refreshes (first call, every ``refresh_steps``, a shape
change) give the exact weights; the state survives a torch.save round trip bit-identically, and a
dropped state gives an exact refresh; the patch routes dp all_gathers by the ``weight_delta:`` rule and
its state_dict carries the reconstructions."""
from __future__ import annotations

import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch import run_gloo  # noqa: E402

M = 1000  # partition numel: not a multiple of the codec block, so the last block is partial
STEPS = 40
REFRESH = 16
CODEC = "int4:block=64"  # coarse on purpose: its error is visible, so the bounds below are tested
QMAX = 7


def _all_equal(t) -> bool:
    """Bit-wise comparison across ranks (the list all_gather: the patch keeps it exact)."""
    import torch
    import torch.distributed as dist

    got = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(got, t)
    return all(torch.equal(g.view(torch.int32), got[0].view(torch.int32)) for g in got)


def _updates(rank: int, step: int, m: int):
    """This rank's weight update at ``step``: small, heavy-tailed like optimizer steps."""
    import torch

    g = torch.Generator().manual_seed(1000 * step + rank)
    return 1e-3 * torch.randn(m, generator=g) * torch.rand(m, generator=g) ** 2


def _job(rank: int, world: int):
    import torch

    import ccoll
    from ccoll.wdelta import WeightDelta

    wd = WeightDelta()
    g = torch.Generator().manual_seed(7 + rank)
    master = torch.randn(M, generator=g)  # the owner's true (master) weights of its partition
    flat = torch.zeros(world * M)  # the framework's buffer; never read by ccoll
    key = ("dp", "all_gather", "world", 0)
    out = {"identical": [], "err": [], "bound": [], "exact_steps": []}
    ccoll.reset_stats()

    def gather(wd, buf, step, m=M):
        buf.view(world, m)[rank].copy_(master[:m])  # the owner writes its slot, as DeepSpeed does
        wd.all_gather_into_tensor(buf, buf.view(world, m)[rank], codec=CODEC, key=key, step=step,
                                  refresh_steps=REFRESH, min_bytes=0)

    previous_err = 0.0
    for step in range(STEPS):
        update = _updates(rank, step, M)
        master += update
        gather(wd, flat, step)
        err = (flat.view(world, M)[rank] - master).abs().max().item()
        out["identical"].append(_all_equal(flat))
        out["err"].append(err)
        # per element at most absmax(update + previous error) / (2 qmax) of its block, plus fp32 rounding
        out["bound"].append((update.abs().max().item() + previous_err) / (2 * QMAX) + 1e-6)
        if err == 0.0:
            out["exact_steps"].append(step)
        previous_err = err
    out["stats"] = {r["codec"]: r["calls"] for r in ccoll.stats() if r["op"] == "all_gather"}

    # checkpoint round trip: a loaded copy continues bit-identically with the original
    buf = io.BytesIO()
    torch.save(wd.state_dict(), buf)
    buf.seek(0)
    resumed = WeightDelta()
    resumed.load_state_dict(torch.load(buf, weights_only=False))
    flat_resumed = flat.clone()
    same = []
    for step in range(STEPS, STEPS + 3):
        master += _updates(rank, step, M)
        gather(wd, flat, step)
        gather(resumed, flat_resumed, step)
        same.append(torch.equal(flat, flat_resumed) and _all_equal(flat_resumed))
    out["resumed_identical"] = same

    # dropped state: the next call is an exact refresh
    fresh = WeightDelta()
    master += _updates(rank, 99, M)
    gather(fresh, flat, STEPS + 3)
    out["fresh_exact"] = torch.equal(flat.view(world, M)[rank], master) and _all_equal(flat)

    # shape change (a different partition size under the same key): exact, and the state follows it
    small = torch.zeros(world * (M // 2))
    gather(wd, small, STEPS + 3, M // 2)
    out["shape_change_exact"] = torch.equal(small.view(world, M // 2)[rank], master[:M // 2]) and _all_equal(small)
    out["recon_numel"] = wd.reconstruction(key).numel()
    master += _updates(rank, 100, M)
    gather(wd, small, STEPS + 4, M // 2)
    out["after_shape_change_delta"] = not torch.equal(small.view(world, M // 2)[rank], master[:M // 2])

    # an output that cannot hold the gather: ccoll's typed error, raised before anything travels
    from ccoll.errors import TransportError

    try:
        wd.all_gather_into_tensor(torch.zeros(5), master, codec=CODEC, key=key, step=0, refresh_steps=REFRESH)
        out["bad_output_error"] = None
    except TransportError as e:
        out["bad_output_error"] = str(e)
    return out


def test_given_owned_partitions_when_gathered_by_weight_delta_then_replicas_identical_and_error_bounded():
    results = run_gloo(3, _job, timeout_s=120)
    for rank, r in enumerate(results):
        assert all(r["identical"]), f"rank {rank}: replicas differ at steps {[i for i, ok in enumerate(r['identical']) if not ok]}"
        # bounded by one delta's quantisation error at every step: no drift over 40 steps
        over = [(s, e, b) for s, (e, b) in enumerate(zip(r["err"], r["bound"])) if e > b]
        assert not over, f"rank {rank}: error above the quantiser bound (step, err, bound): {over[:5]}"
        # exact on the first call and on each refresh, lossy in between (the deltas really are compressed)
        assert r["exact_steps"] == list(range(0, STEPS, REFRESH)), r["exact_steps"]
        assert max(r["err"][1:REFRESH]) > 0
        refreshes = len(range(0, STEPS, REFRESH))
        assert r["stats"] == {"native": refreshes, f"wdelta/{_spec(CODEC)}": STEPS - refreshes}, r["stats"]
        assert all(r["resumed_identical"])
        assert r["fresh_exact"]
        assert r["shape_change_exact"] and r["recon_numel"] == 3 * (M // 2) and r["after_shape_change_delta"]
        assert r["bad_output_error"] and "output must hold 3 x input" in r["bad_output_error"]


def _spec(s: str) -> str:
    from ccoll import get_codec

    return get_codec(s).spec


# --- through the patch: the weight_delta: rule routes dp all_gathers, state_dict carries the state ------------
POLICY = {"version": 1, "dp": {"codec": "native",
                               "ops": {"all_gather": {"codec": CODEC, "min_bytes": 0, "weight_delta": 5}}}}


def _patch_job(rank: int, world: int):
    import torch
    import torch.distributed as dist

    import ccoll
    import ccoll.patch as patch
    from ccoll import Policy

    master = torch.randn(M, generator=torch.Generator().manual_seed(rank))
    flat = torch.zeros(world * M)
    res = {}
    patch.install(Policy.from_dict(POLICY), resolver=lambda group, op: "dp", step_counter="manual")
    ccoll.reset_stats()
    try:
        for step in range(7):
            master += _updates(rank, step, M)
            flat.view(world, M)[rank].copy_(master)
            dist.all_gather_into_tensor(flat, flat.view(world, M)[rank])
            patch.step()
        res["identical"] = _all_equal(flat)
        res["lossy"] = not torch.equal(flat.view(world, M)[rank], master)
        state = patch.state_dict()
        res["saved_keys"] = [k[:2] for k, *_ in state["weight_delta"]["entries"]]
        res["stats"] = {r["codec"]: r["calls"] for r in ccoll.stats() if r["op"] == "all_gather"}
        # a state without the reconstructions (an older checkpoint): the next gather is an exact refresh
        del state["weight_delta"]
        patch.load_state_dict(state)
        master += _updates(rank, 7, M)
        flat.view(world, M)[rank].copy_(master)
        dist.all_gather_into_tensor(flat, flat.view(world, M)[rank])
        res["exact_after_load"] = torch.equal(flat.view(world, M)[rank], master) and _all_equal(flat)
        # async: issued at the call, decoded (and the reconstruction advanced) by wait()
        master += _updates(rank, 8, M)
        flat.view(world, M)[rank].copy_(master)
        work = dist.all_gather_into_tensor(flat, flat.view(world, M)[rank], async_op=True)
        work.wait()
        res["async_ok"] = _all_equal(flat) and (flat.view(world, M)[rank] - master).abs().max().item() < 1e-3
    finally:
        patch.uninstall()
    return res


def test_given_weight_delta_rule_when_patched_all_gather_then_routed_and_checkpointed():
    for r in run_gloo(2, _patch_job, timeout_s=120):
        assert r["identical"] and r["lossy"]
        assert r["saved_keys"] == [("dp", "all_gather")]
        # steps 0 and 5 refresh exactly (weight_delta: 5), the other five send deltas
        assert r["stats"] == {"native": 2, f"wdelta/{_spec(CODEC)}": 5}, r["stats"]
        assert r["exact_after_load"] and r["async_ok"]
