"""Emulated nodes: N network namespaces x L ranks each, unshaped inside a node, shaped between nodes;
measures hierarchical against flat all_reduce there.

    python -m ccoll.bench.nodes --nodes 2 --per-node 2 --rate 1gbit [--sizes 1M,4M,16M,64M]
        [--codec int8:block=256 --codec int4:block=64] [--reps 3] [--json results/bench/nodes.json]
    python -m ccoll.bench.nodes ... -- COMMAND ...   # run any command on the emulated nodes instead

Why: ``ccoll.bench.netem`` gives every rank its own shaped link, so all traffic is "between nodes" and
``hierarchy: node`` has nothing to save. Here a namespace is a node: it has one shaped link (``--rate``
in and out, tc tbf, built by :class:`ccoll.bench.netem.ShapedLinks`, one namespace per node) and its L
ranks all use the node's address, so traffic between them stays inside the namespace (loopback,
unshaped, like NVLink or shared memory next to a NIC). Ranks are numbered node-major (node a holds
ranks a*L .. a*L+L-1) and get torchrun's env (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE = L,
MASTER_ADDR/PORT, GLOO_SOCKET_IFNAME), so ``ccoll.hierarchy`` finds the nodes from LOCAL_WORLD_SIZE.
Needs root and iproute2; nothing is created in the caller's namespace and everything is removed on
exit (``python -m ccoll.bench.netem --cleanup`` removes what a kill -9 left).

The measurement (rank 0 prints one JSON line per row, and ``--json`` collects them): per size and codec,
native flat all_reduce, compressed flat, compressed hierarchical; seconds = median over ``--reps`` of
the slowest rank's call time (each call starts after a barrier); error = relative RMS error against
the float64 sum, and whether every rank holds the same bytes. On a shared machine the codec's CPU time
competes with the ranks' network threads: compare within one run (ratios), and note the load (the
table's header records ``os.getloadavg()``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from typing import Sequence

from ..errors import NetemError, UnitsError
from ..launch import exit_process
from ..units import nbytes_list_arg
from .netem import ShapedLinks, _check_environment, run_on_links, split_command

DEFAULT_SIZES = "1M,4M,16M,64M"
DEFAULT_CODECS = ("int8:block=256", "int4:block=64")


class _Ranks:
    """What :func:`ccoll.bench.netem.run_ranks` needs (``rank_ns``, ``ranks``, ``env``) for L ranks per
    node namespace: rank r runs in node r // L's namespace, with that node's address."""

    def __init__(self, links: ShapedLinks, per_node: int):
        self.links, self.per_node = links, per_node
        self.ranks = links.ranks * per_node
        self.rank_ns = [links.rank_ns[r // per_node] for r in range(self.ranks)]

    def env(self, rank: int, port: int) -> dict:
        env = self.links.env(rank // self.per_node, port)
        env.update(RANK=str(rank), WORLD_SIZE=str(self.ranks), LOCAL_RANK=str(rank % self.per_node),
                   LOCAL_WORLD_SIZE=str(self.per_node),
                   CCOLL_NETEM=f"{self.links.ranks} nodes x {self.per_node} ranks, {self.links.rate} per node "
                               f"in and out (tc tbf), unshaped inside a node")
        return env


# --- the per-rank measurement ---------------------------------------------------------------------

def _measure(args: argparse.Namespace) -> int:
    import datetime

    import torch
    import torch.distributed as dist

    from .. import collectives as cc
    from ..collectives import nodes as hierarchy

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, p = dist.get_rank(), dist.get_world_size()
    lay = hierarchy.layout()
    if rank == 0:
        desc = os.environ.get("CCOLL_NETEM", "")
        print(json.dumps({"header": desc, "world": p, "nodes": lay.nodes if lay else 1,
                          "per_node": lay.local_size if lay else p, "loadavg": os.getloadavg()}), flush=True)

    def link_bytes() -> int:
        """Bytes sent so far on this node's shaped link (local rank 0 of each node reads the counter of
        the namespace's interface; intra-node traffic never shows there), summed over the nodes."""
        mine = 0
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            try:
                with open(f"/sys/class/net/{os.environ.get('GLOO_SOCKET_IFNAME', '')}/statistics/tx_bytes") as f:
                    mine = int(f.read())
            except OSError:
                mine = 0
        total = torch.tensor([mine], dtype=torch.float64)
        dist.all_reduce(total)
        return int(total)

    def timed(fn) -> float:
        dist.barrier()
        t = time.perf_counter()
        fn()
        mine = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        return float(mine)

    for size in args.sizes:
        n = size // 4
        g = torch.Generator().manual_seed(1234 + rank)
        x = torch.randn(n, generator=g) * (1.0 + 0.5 * rank)
        exact = x.double()
        dist.all_reduce(exact)
        variants = [("native", None, None)] + [(v, c, h) for c in args.codec for v, h in (("flat", None), ("hier", "node"))]
        for name, codec, hier in variants:
            secs, out = [], None
            for i in range(args.reps + 1):  # the first call warms up (and creates the subgroups)
                if i == 1:
                    sent = link_bytes()
                out = x.clone()
                secs.append(timed(lambda: cc.all_reduce(out, codec=codec, hierarchy=hier, min_bytes=0)))
            sent = (link_bytes() - sent) / args.reps / (lay.nodes if lay else 1)
            err = float((out.double() - exact).pow(2).mean().sqrt() / exact.pow(2).mean().sqrt())
            digests = [None] * p
            dist.all_gather_object(digests, hashlib.sha256(out.numpy().tobytes()).hexdigest())
            row = {"bytes": size, "variant": name, "codec": codec or "native", "seconds": statistics.median(secs[1:]),
                   "node_link_bytes": sent,
                   "rel_rms_error": err, "replicas_identical": len(set(digests)) == 1}
            if rank == 0:
                print(json.dumps(row), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


# --- the launcher -----------------------------------------------------------------------------------

class _Collect:
    """Stream the ranks' output through, keeping rank 0's JSON rows."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.header: dict = {}

    def write(self, text: str) -> None:
        sys.stdout.write(text)
        prefix = "[0] "
        for line in text.splitlines():
            if line.startswith(prefix) and line[len(prefix):].startswith("{"):
                obj = json.loads(line[len(prefix):])
                (self.header.update(obj) if "header" in obj else self.rows.append(obj))

    def flush(self) -> None:
        sys.stdout.flush()


def table(header: dict, rows: list[dict]) -> str:
    """Rows side by side per size: seconds and error of each variant, and hier/flat time ratios."""
    lines = [f"# {header.get('header', '')}; load average {header.get('loadavg')}",
             f"{'size':>8} {'codec':<16} {'native s':>9} {'flat s':>8} {'hier s':>8} {'hier/flat':>9} "
             f"{'flat err':>9} {'hier err':>9} {'flat MB/node':>12} {'hier MB/node':>12} identical"]
    by = {(r["bytes"], r["variant"], r["codec"]): r for r in rows}
    for size in sorted({r["bytes"] for r in rows}):
        native = by.get((size, "native", "native"))
        for codec in sorted({r["codec"] for r in rows if r["bytes"] == size and r["codec"] != "native"}):
            f, h = by.get((size, "flat", codec)), by.get((size, "hier", codec))
            if not (f and h and native):
                continue
            lines.append(f"{size / 2**20:>7g}M {codec:<16} {native['seconds']:>9.3f} {f['seconds']:>8.3f} "
                         f"{h['seconds']:>8.3f} {h['seconds'] / f['seconds']:>9.2f} {f['rel_rms_error']:>9.2e} "
                         f"{h['rel_rms_error']:>9.2e} {f.get('node_link_bytes', 0) / 1e6:>12.2f} "
                         f"{h.get('node_link_bytes', 0) / 1e6:>12.2f} {f['replicas_identical'] and h['replicas_identical']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv, command = split_command(argv)
    ap = argparse.ArgumentParser(prog="python -m ccoll.bench.nodes", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=2, help="node namespaces (default 2)")
    ap.add_argument("--per-node", type=int, default=2, help="ranks per node (default 2)")
    ap.add_argument("--rate", default="1gbit", help="each node's link rate in each direction, tc units")
    ap.add_argument("--delay", default=None, help="one-way latency added per node link (e.g. 1ms)")
    ap.add_argument("--sizes", default=DEFAULT_SIZES, type=nbytes_list_arg,
                    help=f"all_reduce sizes in bytes (default {DEFAULT_SIZES})")
    ap.add_argument("--codec", action="append", default=None, help="codec spec (repeatable)")
    ap.add_argument("--reps", type=int, default=3, help="timed calls per row after one warm-up (default 3)")
    ap.add_argument("--port", type=int, default=29500)
    ap.add_argument("--timeout", type=float, default=1800.0, help="stop every rank after this many seconds")
    ap.add_argument("--json", default=None, help="write the header and rows here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.codec = args.codec or list(DEFAULT_CODECS)
    if args.worker:
        return _measure(args)
    try:
        _check_environment()
        if args.nodes < 1 or args.per_node < 1:
            raise NetemError("--nodes and --per-node must be >= 1")
        links = ShapedLinks(args.nodes, args.rate, args.delay, tag=f"{os.getpid()}n")
    except (NetemError, UnitsError) as e:
        print(f"ccoll.bench.nodes: error: {e}", file=sys.stderr)
        return 2
    if not command:
        command = [sys.executable, "-m", "ccoll.bench.nodes", "--worker", "--sizes", ",".join(map(str, args.sizes)),
                   "--reps", str(args.reps), *[a for c in args.codec for a in ("--codec", c)]]
    collect = _Collect()

    status = run_on_links(links, _Ranks(links, args.per_node), command, args.port, args.timeout, prog="nodes",
                          out=collect)
    if collect.rows:
        print(table(collect.header, collect.rows), flush=True)
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump({"header": collect.header, "rows": collect.rows}, f, indent=1)
    return status


if __name__ == "__main__":
    exit_process(main())  # the --worker ranks too: no interpreter teardown after gloo (see ccoll.launch)
