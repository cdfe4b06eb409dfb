"""Run one rank per network namespace, ranks joined by shaped links, and always clean up.

    python -m ccoll.bench.netem --ranks 4 --rate 1gbit [--delay 1ms] -- python -m ccoll.bench all_reduce ...
    python -m ccoll.bench.netem --cleanup          # remove namespaces left by runs that were killed -9

Why namespaces: on one machine every rank otherwise talks over loopback at tens of GB/s, so compression
can only cost time. Here each rank gets its own network stack and one link of ``--rate`` to a switch
(a bridge in its own namespace), like a node's NIC; so a rank has R out and R in, and several peers
sending to one rank share that rank's R, as on a real switch port.

Topology (per run, names unique by this process's pid, so concurrent runs never collide)::

    ns ccoll-<pid>-<i>        ns ccoll-<pid>-br
    [ccoll0 10.200.0.<i+1>] --veth-- [v<i>] -- bridge br0 -- [v<j>] --veth-- [ccoll0 of rank j]

- Nothing is created or changed in the caller's own network namespace: both veth ends are created
  directly inside the namespaces, and the 10.200.0.0/24 addresses exist only inside them.
- Shaping: a token bucket (tc tbf) of ``--rate`` on the egress of both ends of each rank's veth: the
  rank's side limits what it sends, the bridge's side what it receives. ``--delay`` (tc netem under the
  tbf) is added to the rank's egress only, so it is the one-way rank-to-rank latency (RTT = 2 x delay).
- Each rank runs ``<command>`` with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR (rank 0's
  address), MASTER_PORT, GLOO_SOCKET_IFNAME=ccoll0 and CCOLL_NETEM (a description of the link, which
  ``ccoll.bench`` prints in its header): the torch.distributed env:// contract, so gloo (and DeepSpeed
  on gloo) needs nothing else. MPI across namespaces is not supported (mpiexec would need per-namespace
  daemons); use gloo.
- Output is streamed line by line with a ``[rank]`` prefix. The exit status is the first failing rank's
  (the others are stopped a moment later, since they would otherwise wait for it until their timeout),
  124 on ``--timeout``, 128 + signal number on Ctrl-C/SIGTERM/SIGHUP; 0 only if every rank succeeded.
- Cleanup always runs (finally + SIGINT/SIGTERM/SIGHUP handlers): ranks are stopped, the namespaces
  deleted (the veths and bridge die with them). Only ``kill -9`` can leave namespaces behind; then
  ``--cleanup`` removes ``ccoll-<pid>-*`` namespaces whose pid is no longer running.

Needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN) and iproute2 (``ip``, ``tc``).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Sequence

from ..errors import NetemError, UnitsError
from ..launch import rank_env, stop_process_groups
from ..units import parse_rate_bits

PREFIX = "ccoll"
IFNAME = "ccoll0"
SUBNET = "10.200.0"
MAX_RANKS = 250
_NAME_RE = re.compile(rf"^{PREFIX}-(\d+)[a-z]?-(?:\d+|br)$")  # ccoll-<pid>[tag letter]-<rank|br>
_DELAY_RE = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$", re.I)


def check_delay(delay: str) -> str:
    if not _DELAY_RE.match(delay.strip()):
        raise NetemError(f"bad --delay {delay!r}: use e.g. 500us, 1ms, 0.2s")
    return delay.strip()


def _run(cmd: Sequence[str]) -> str:
    r = subprocess.run(list(cmd), capture_output=True, text=True)
    if r.returncode != 0:
        raise NetemError(f"`{' '.join(cmd)}` failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


def _check_environment() -> None:
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        raise NetemError(f"needs iproute2 ({', '.join(missing)} not found)")
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        raise NetemError("needs root (creating network namespaces and tc qdiscs)")


def list_namespaces() -> list[str]:
    out = _run(["ip", "netns", "list"])
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale() -> list[str]:
    """Delete ccoll-<pid>-* namespaces whose creating process is gone (left by kill -9)."""
    removed = []
    for ns in list_namespaces():
        m = _NAME_RE.match(ns)
        if m and not _pid_alive(int(m.group(1))):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            removed.append(ns)
    return removed


class ShapedLinks:
    """The namespaces, veths, bridge and qdiscs of one run. ``with ShapedLinks(...) as links:`` builds
    them and always deletes them."""

    def __init__(self, ranks: int, rate: str, delay: str | None = None, tag: str | None = None):
        if not 1 <= ranks <= MAX_RANKS:
            raise NetemError(f"--ranks must be between 1 and {MAX_RANKS}, got {ranks}")
        self.ranks = ranks
        self.rate = rate.strip()
        self.rate_bps = parse_rate_bits(self.rate)  # a UnitsError names the accepted forms
        self.delay = check_delay(delay) if delay else None
        self.tag = f"{PREFIX}-{tag or os.getpid()}"
        self.bridge_ns = f"{self.tag}-br"
        self.rank_ns = [f"{self.tag}-{i}" for i in range(ranks)]
        self._created: list[str] = []

    def address(self, rank: int) -> str:
        return f"{SUBNET}.{rank + 1}"

    def describe(self) -> str:
        d = f" + delay {self.delay} one way" if self.delay else ""
        return f"netem {self.ranks} ranks, {self.rate} per rank in and out (tc tbf){d}"

    def _tbf(self) -> list[str]:
        # bucket: >= 4 ms of traffic (timer granularity) and >= one 64 KiB GSO packet; queue: 100 ms
        burst = max(64 * 1024, int(self.rate_bps / 8 * 0.004))
        return ["tbf", "rate", self.rate, "burst", str(burst), "latency", "100ms"]

    def setup(self) -> "ShapedLinks":
        br = self.bridge_ns
        for ns in (br, *self.rank_ns):
            _run(["ip", "netns", "add", ns])
            self._created.append(ns)
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(["ip", "-n", br, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", br, "link", "set", "br0", "up"])
        for i, ns in enumerate(self.rank_ns):
            v = f"v{i}"
            # both ends are born inside namespaces: the caller's namespace never sees them
            _run(["ip", "-n", br, "link", "add", v, "type", "veth", "peer", "name", IFNAME, "netns", ns])
            _run(["ip", "-n", br, "link", "set", v, "master", "br0"])
            _run(["ip", "-n", br, "link", "set", v, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", IFNAME])
            _run(["ip", "-n", ns, "link", "set", IFNAME, "up"])
            _run(["tc", "-n", br, "qdisc", "add", "dev", v, "root", "handle", "1:", *self._tbf()])
            _run(["tc", "-n", ns, "qdisc", "add", "dev", IFNAME, "root", "handle", "1:", *self._tbf()])
            if self.delay:
                try:
                    _run(["tc", "-n", ns, "qdisc", "add", "dev", IFNAME, "parent", "1:1", "handle", "10:",
                          "netem", "delay", self.delay, "limit", "100000"])
                except NetemError as e:
                    if "unknown" in str(e).lower():
                        raise NetemError("--delay needs the kernel's netem qdisc (sch_netem), which this "
                                         "kernel does not have; run without --delay") from None
                    raise
        return self

    def teardown(self) -> None:
        """Delete every namespace this run created (their veths and the bridge go with them)."""
        errors = []
        for ns in reversed(self._created):
            r = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True)
            if r.returncode != 0 and ns in list_namespaces():
                errors.append(f"{ns}: {r.stderr.strip()}")
        self._created.clear()
        if errors:
            raise NetemError("could not delete namespaces: " + "; ".join(errors))

    def __enter__(self) -> "ShapedLinks":
        try:
            return self.setup()
        except BaseException:
            self.teardown()
            raise

    def __exit__(self, *exc) -> None:
        self.teardown()

    def env(self, rank: int, port: int, base: dict | None = None) -> dict:
        return rank_env(rank, self.ranks, port, addr=self.address(0), base=base,
                        extra={"GLOO_SOCKET_IFNAME": IFNAME, "CCOLL_NETEM": self.describe()})


class _Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _pump(stream, prefix: str, out, lock: threading.Lock) -> None:
    for line in iter(stream.readline, b""):
        with lock:
            out.write(prefix + line.decode(errors="replace"))
            out.flush()
    stream.close()


def run_ranks(links: ShapedLinks, command: Sequence[str], port: int, timeout_s: float | None,
              grace_s: float = 3.0, out=None) -> int:
    """Run ``command`` once per rank namespace; returns the exit status (see the module docstring)."""
    out = out or sys.stdout
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    width = len(str(links.ranks - 1))
    try:
        for i, ns in enumerate(links.rank_ns):
            p = subprocess.Popen(["ip", "netns", "exec", ns, *command], env=links.env(i, port),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True)
            procs.append(p)
            t = threading.Thread(target=_pump, args=(p.stdout, f"[{i:>{width}}] ", out, lock), daemon=True)
            t.start()
            pumps.append(t)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        status, failed_at = 0, None
        while True:
            codes = [p.poll() for p in procs]
            if failed_at is None:
                bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
                if bad:
                    i, status = bad[0]
                    failed_at = time.monotonic()
                    with lock:
                        out.write(f"[netem] rank {i} exited with status {status}\n")
            if all(c is not None for c in codes):
                break
            if failed_at is not None and time.monotonic() - failed_at > grace_s:
                with lock:
                    out.write("[netem] stopping the remaining ranks\n")
                break
            if deadline is not None and time.monotonic() > deadline:
                with lock:
                    out.write(f"[netem] --timeout {timeout_s:g} s reached; stopping the ranks\n")
                status = 124
                break
            time.sleep(0.05)
        return status
    finally:
        stop_process_groups(procs, term_wait_s=3.0)
        for t in pumps:
            t.join(timeout=2.0)


def split_command(argv: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """(our options, the command after ``--``): argparse would take the command's own options."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        k = argv.index("--")
        return argv[:k], argv[k + 1:]
    return argv, []


def main(argv: Sequence[str] | None = None) -> int:
    argv, command = split_command(argv)
    p = argparse.ArgumentParser(prog="python -m ccoll.bench.netem",
                                description=__doc__.split("\n\n")[0],
                                usage="%(prog)s --ranks N --rate RATE [--delay D] [options] -- COMMAND ...")
    p.add_argument("--ranks", type=int, help="number of ranks (one namespace each)")
    p.add_argument("--rate", help="per-rank link rate in each direction, tc units (100mbit, 1gbit)")
    p.add_argument("--delay", default=None, help="one-way latency added per link (e.g. 1ms)")
    p.add_argument("--port", type=int, default=29500, help="MASTER_PORT (default 29500)")
    p.add_argument("--timeout", type=float, default=None, help="stop all ranks after this many seconds")
    p.add_argument("--cleanup", action="store_true",
                   help="first delete ccoll-<pid>-* namespaces of runs that no longer exist (kill -9 leftovers)")
    args = p.parse_args(argv)
    try:
        _check_environment()
        if args.cleanup:
            for ns in cleanup_stale():
                print(f"[netem] removed stale namespace {ns}", flush=True)
            if not command:
                return 0
        if not command:
            raise NetemError("no command: put it after --, e.g. -- python -m ccoll.bench all_reduce")
        if args.ranks is None or args.rate is None:
            raise NetemError("--ranks and --rate are required")
        links = ShapedLinks(args.ranks, args.rate, args.delay)
    except (NetemError, UnitsError) as e:
        print(f"ccoll.bench.netem: error: {e}", file=sys.stderr)
        return 2

    def ready() -> None:
        print(f"[netem] {links.describe()}; namespaces {links.tag}-*; master {links.address(0)}:{args.port}",
              flush=True)

    return run_on_links(links, links, command, args.port, args.timeout, prog="netem", on_ready=ready)


def run_on_links(links: ShapedLinks, ranks, command: Sequence[str], port: int, timeout_s: float | None, *,
                 prog: str, out=None, on_ready=None) -> int:
    """Build ``links``, run ``command`` on ``ranks`` (:func:`run_ranks`), and always remove the namespaces.
    The first SIGINT/SIGTERM/SIGHUP stops the ranks (status 128 + signal); later ones (an impatient Ctrl-C)
    are ignored until the namespaces are gone. A failed ip/tc command prints one line and gives 1."""
    interrupted: list[int] = []

    def on_signal(signum, _frame):
        if not interrupted:
            interrupted.append(signum)
            raise _Interrupted(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        links.setup()
        if on_ready is not None:
            on_ready()
        return run_ranks(ranks, command, port, timeout_s, out=out)
    except _Interrupted as e:
        print(f"[{prog}] {e}: ranks stopped, removing namespaces", file=sys.stderr, flush=True)
        return 128 + e.signum
    except NetemError as e:
        print(f"ccoll.bench.{prog}: error: {e}", file=sys.stderr)
        return 1
    finally:
        interrupted.append(0)  # from here on, signals are ignored until the namespaces are gone
        try:
            links.teardown()
        finally:
            for s, h in old.items():
                signal.signal(s, h)


if __name__ == "__main__":
    sys.exit(main())
