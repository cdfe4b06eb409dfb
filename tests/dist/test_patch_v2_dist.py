"""The patch under a v2 policy on real gloo ranks: size buckets pick the codec per call, and
``hierarchy: node`` reaches the three collectives that have a hierarchical form as ``hierarchy="node"``
(and no hierarchy -- absent or None -- where the rule does not set it). The hierarchical algorithm itself is
ccoll.hierarchy's (tested there); here a spy records the argument, however it is passed, and forwards the
call to the real collective."""
from __future__ import annotations

import inspect
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from launch import run_gloo  # noqa: E402

POLICY = {
    "version": 2,
    "tp": {"sizes": [{"below": "64KiB", "codec": "native"}, {"codec": "bf16"}], "hierarchy": "node"},
    "dp": {"codec": "bf16", "ops": {"all_reduce": {"sizes": [{"below": "64KiB", "codec": "fp16"}, {"codec": "bf16"}]}}},
}


def _job(rank: int, world: int):
    import torch
    import torch.distributed as dist

    import ccoll.collectives as cc
    import ccoll.patch as patch
    from ccoll import stats
    from ccoll.stats import reset_stats

    seen = []

    def spy(name):
        real = getattr(cc, name)
        signature = inspect.signature(real)

        def f(*args, **kwargs):
            given = signature.bind(*args, **kwargs).arguments  # positional or keyword alike
            hierarchy = given.get("hierarchy")
            seen.append((name, "absent" if hierarchy is None else hierarchy, given["codec"].spec))
            return real(*args, **kwargs)
        return f

    for name in ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast"):
        setattr(cc, name, spy(name))
    tp = dist.new_group([0, 1])
    placed = {id(tp): "tp", id(dist.group.WORLD): "dp"}
    resolver = lambda group, op: placed[id(group if group is not None else dist.group.WORLD)]  # noqa: E731
    out = {}
    reset_stats()
    with patch.installed(POLICY, resolver=resolver, step_counter="manual"):
        for group, tag in ((tp, "tp"), (None, "dp")):
            for numel in (4096, 65536):  # 16 KiB (tp: native bucket) and 256 KiB
                x = torch.arange(numel, dtype=torch.float32) % 7 + rank
                dist.all_reduce(x, group=group)
                out[f"{tag}_ar_{numel}"] = float((x - (2 * (torch.arange(numel) % 7) + 1)).abs().max())
            x = torch.full((65536,), float(rank + 1))
            o = torch.empty(65536 // world)
            dist.reduce_scatter_tensor(o, x, group=group)
            out[f"{tag}_rs"] = float((o - 3).abs().max())
            g = torch.empty(65536 * world)
            dist.all_gather_into_tensor(g, x, group=group)
            out[f"{tag}_ag"] = float((g - torch.arange(1, world + 1).float().repeat_interleave(65536)).abs().max())
            b = torch.full((65536,), float(rank))
            dist.broadcast(b, src=1, group=group)
            out[f"{tag}_bc"] = float((b - 1).abs().max())
    codecs = {(r["dim"], r["codec"]) for r in stats() if r["op"] == "all_reduce"}
    return {"seen": seen, "errors": out, "codecs": sorted(codecs)}


def test_given_v2_policy_when_patched_expect_bucket_codecs_and_hierarchy_only_where_set():
    results = run_gloo(2, _job, timeout_s=150)
    for r in results:
        seen = [(name, h, spec.split(",")[0]) for name, h, spec in r["seen"]]
        assert seen == [
            ("all_reduce", "node", "bf16"),  # tp 256 KiB (16 KiB: native bucket, not ccoll's)
            ("reduce_scatter_tensor", "node", "bf16"),
            ("all_gather_into_tensor", "node", "bf16"),
            # tp broadcast: bf16 too, but broadcast has no hierarchical form: no keyword
            ("broadcast", "absent", "bf16"),
            ("all_reduce", "absent", "fp16"),  # dp 16 KiB: the fp16 bucket
            ("all_reduce", "absent", "bf16"),  # dp 256 KiB
            ("reduce_scatter_tensor", "absent", "bf16"),
            ("all_gather_into_tensor", "absent", "bf16"),
            ("broadcast", "absent", "bf16"),
        ], seen
        assert all(err == 0.0 for err in r["errors"].values()), r["errors"]  # small integers: exact in bf16/fp16
        assert ("tp", "native") in r["codecs"] and ("dp", "fp16") in r["codecs"], r["codecs"]
    assert results[0]["seen"] == results[1]["seen"]  # both ranks made the same decisions
