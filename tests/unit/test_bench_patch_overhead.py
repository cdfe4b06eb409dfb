"""tools/bench_patch_overhead.py's third measurement (torch's fake process group): it must run against the real
torch.distributed dispatch and the real patch, measure every function it lists, and leave no process group,
patch or monkeypatched fingerprint check behind. No timing thresholds: only the rows and their fields."""
from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_RUN = r"""
import json, sys
sys.path.insert(0, "tools")
import bench_patch_overhead as b
import torch.distributed as dist
import ccoll.patch as patch
from ccoll.patch import fingerprint
check = fingerprint.check
rows = b.fake_pg_rows("configs/baseline.yaml", 50)
print(json.dumps({"rows": rows, "initialized": dist.is_initialized(), "check_restored": fingerprint.check is check,
                  "send_is_torch": getattr(dist.send, "__module__", "") == "torch.distributed.distributed_c10d"}))
"""


def test_given_fake_process_group_when_measuring_pass_through_expect_every_function_and_nothing_left_behind():
    r = subprocess.run([sys.executable, "-c", _RUN], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert [row["op"] for row in res["rows"]] == ["all_reduce", "all_gather_into_tensor", "broadcast", "send", "recv",
                                                   "isend+wait"]
    for row in res["rows"]:
        assert set(row) == {"op", "torch_us", "patched_us", "wrapper_only_us"}
        assert all(row[k] > 0 for k in ("torch_us", "patched_us", "wrapper_only_us"))
    assert res["initialized"] is False and res["check_restored"] and res["send_is_torch"]


def test_given_sizes_when_asking_which_rows_pass_through_expect_baseline_always_and_hybrid_only_below_min_bytes():
    """The tool labels each timed size: with a compressing policy a size above ``min_bytes`` times compression,
    not the pass-through path, and the row must say so."""
    sys.path.insert(0, os.path.join(REPO, "tools"))
    import bench_patch_overhead as b
    from ccoll.policy import Policy

    baseline = Policy.from_yaml(os.path.join(REPO, "configs", "baseline.yaml"))
    hybrid = Policy.from_yaml(os.path.join(REPO, "configs", "hybrid.yaml"))
    ops = ("all_reduce", "all_gather", "broadcast", "send_recv")
    assert all(b.passes_through(baseline, op, n) for op in ops for n in (64, 4096, 65536, 1 << 20))
    assert all(b.passes_through(hybrid, op, 64) for op in ops)
    assert not b.passes_through(hybrid, "all_reduce", 1 << 20)
    assert not b.passes_through(hybrid, "send_recv", 1 << 20)
