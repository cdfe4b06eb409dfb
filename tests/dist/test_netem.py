"""`python -m ccoll.bench.netem`: real network namespaces, veths, a bridge and tc shaping (needs root and
iproute2, as the CI has). Checks the shaped rate as a real gloo transfer sees it, and that nothing is
left behind: after success, after a failing rank, after SIGTERM, and for --cleanup of stale runs."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.netem  # skipped without root and iproute2 (tests/conftest.py)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _namespaces(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.split() and ln.split()[0].startswith(prefix)]


def _netem(*args: str) -> subprocess.Popen:
    """As users start it (netem shares ccoll.launch's rank supervision, so it runs inside the package)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.Popen([sys.executable, "-m", "ccoll.bench.netem", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_given_two_ranks_at_100mbit_when_sending_4MiB_expect_the_shaped_rate_and_no_namespaces_left(tmp_path):
    out = tmp_path / "sendrecv.json"
    p = _netem("--ranks", "2", "--rate", "100mbit", "--timeout", "120", "--",
               sys.executable, "-m", "ccoll.bench", "sendrecv", "-b", "4M", "-e", "4M", "-n", "2", "-w", "1",
               "--json", str(out))
    text, _ = p.communicate(timeout=150)
    assert p.returncode == 0, text
    row = json.loads(out.read_text())["rows"][0]
    rate_bytes_per_s = 100e6 / 8
    measured = row["algbw_gbps"] * 1e9
    # TCP/IP headers take ~3-5 % of the link; nothing may beat the shaped rate by more than the bucket
    assert 0.75 * rate_bytes_per_s < measured < 1.05 * rate_bytes_per_s, (measured, text)
    assert row["wrong"] == 0
    assert "[0] # link: netem 2 ranks, 100mbit" in text  # the bench header records the link
    assert _namespaces(f"ccoll-{p.pid}-") == []


def test_given_shaped_links_expect_a_token_bucket_on_both_ends_of_every_rank_link():
    from ccoll.bench.netem import IFNAME, ShapedLinks

    with ShapedLinks(2, "200mbit", tag=f"{os.getpid()}t") as links:
        for i, ns in enumerate(links.rank_ns):
            rank_side = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", IFNAME], capture_output=True,
                                       text=True, check=True).stdout
            switch_side = subprocess.run(["tc", "-n", links.bridge_ns, "qdisc", "show", "dev", f"v{i}"],
                                         capture_output=True, text=True, check=True).stdout
            assert "tbf" in rank_side and "rate 200Mbit" in rank_side
            assert "tbf" in switch_side and "rate 200Mbit" in switch_side
        names = list(links.rank_ns) + [links.bridge_ns]
        assert sorted(_namespaces(f"ccoll-{os.getpid()}t-")) == sorted(names)
        # the caller's namespace got no interface and no 10.200 address
        assert "10.200." not in subprocess.run(["ip", "addr"], capture_output=True, text=True).stdout
    assert _namespaces(f"ccoll-{os.getpid()}t-") == []


def test_given_a_failing_rank_when_others_would_hang_expect_its_status_quickly_and_cleanup():
    from ccoll.bench.netem import ShapedLinks, run_ranks

    cmd = [sys.executable, "-c", "import os, sys, time\n"
           "if os.environ['RANK'] == '1': sys.exit(3)\ntime.sleep(60)"]
    t0 = time.monotonic()
    with ShapedLinks(2, "100mbit", tag=f"{os.getpid()}f") as links:
        status = run_ranks(links, cmd, 29500, timeout_s=30, grace_s=0.5, out=open(os.devnull, "w"))
    assert status == 3
    assert time.monotonic() - t0 < 15
    assert _namespaces(f"ccoll-{os.getpid()}f-") == []


def test_given_sigterm_while_running_expect_ranks_stopped_and_namespaces_removed():
    p = _netem("--ranks", "2", "--rate", "100mbit", "--", "sleep", "60")
    prefix = f"ccoll-{p.pid}-"
    deadline = time.monotonic() + 30
    while len(_namespaces(prefix)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_namespaces(prefix)) == 3
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)
    text, _ = p.communicate(timeout=30)
    assert p.returncode == 128 + signal.SIGTERM, text
    assert _namespaces(prefix) == []


def test_given_namespaces_of_a_dead_run_when_cleanup_expect_only_those_removed():
    from ccoll.bench.netem import cleanup_stale

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, alive = f"ccoll-{dead.pid}-0", f"ccoll-{os.getpid()}-0"
    for ns in (stale, alive):
        subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        removed = cleanup_stale()
        assert stale in removed and alive not in removed
        assert _namespaces(stale) == [] and _namespaces(alive) == [alive]
    finally:
        for ns in (stale, alive):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_given_bad_rate_or_no_command_expect_status_2():
    from ccoll.bench.netem import main

    assert main(["--ranks", "2", "--rate", "fast", "--", "true"]) == 2
    assert main(["--ranks", "2", "--rate", "1gbit"]) == 2
