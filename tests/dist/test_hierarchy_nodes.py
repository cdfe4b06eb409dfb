"""`python -m ccoll.bench.nodes`: 2 network namespaces ("nodes") x 2 gloo ranks, unshaped inside a node,
a shaped link between (needs root and iproute2, as the CI has). One small run checks what the tool
is for: the hierarchical all_reduce keeps replicas identical, errs less than flat (one lossy phase
instead of two), and only its compressed node exchange crosses the nodes' links (the interface
counters of each node namespace), while the intra-node native phases stay inside; and nothing is
left behind."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.netem  # skipped without root and iproute2 (tests/conftest.py)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = "int8:block=256"


def test_nodes_given_2x2_at_1gbit_expect_identical_replicas_lower_error_and_only_the_node_exchange_on_the_links(tmp_path):
    import ccoll

    out = tmp_path / "nodes.json"
    p = subprocess.Popen([sys.executable, "-m", "ccoll.bench.nodes", "--rate", "1gbit", "--sizes", "1M",
                          "--reps", "1", "--codec", SPEC, "--timeout", "120", "--json", str(out)],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    text, _ = p.communicate(timeout=180)
    assert p.returncode == 0, text[-4000:]
    doc = json.loads(out.read_text())
    assert doc["header"]["nodes"] == 2 and doc["header"]["per_node"] == 2
    rows = {r["variant"]: r for r in doc["rows"]}
    assert all(r["replicas_identical"] for r in rows.values())
    assert rows["hier"]["rel_rms_error"] < 0.85 * rows["flat"]["rel_rms_error"]
    # each node sends its ranks' encoded halves once: about one encoded tensor (plus TCP headers); the
    # native intra-node reduce-scatter and all-gather (8x that in fp32) would show if they crossed
    encoded = ccoll.get_codec(SPEC).encoded_nbytes((1 << 20) // 4, __import__("torch").float32)
    assert 0.9 * encoded < rows["hier"]["node_link_bytes"] < 1.3 * encoded, (rows["hier"], encoded)
    assert rows["hier"]["node_link_bytes"] < 0.75 * rows["flat"]["node_link_bytes"]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"ccoll-{p.pid}n-" not in listed
