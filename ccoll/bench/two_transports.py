"""One job, two transports: ccoll collectives over torch.distributed (gloo) and over MPI in the same
ranks, interleaved, with async handles of both outstanding at once — no deadlock, correct results.

    mpiexec --allow-run-as-root --oversubscribe -n 4 python -m ccoll.bench.two_transports --calls 1000

MCR-DL's mix-and-match (a policy's ``transport:`` per op) sends, say, TP traffic through NCCL and DP
traffic through MPI in one job. It cannot deadlock under ccoll's ordering rule: every collective is
issued at call time, in program order, on every rank, so the n-th call on a transport meets the n-th
call of every peer; a wait on one transport never needs a peer's progress on the other (gloo/NCCL
progress on their own threads; an MPI request progresses inside any MPI wait, which every rank
reaches because its own gloo waits complete without it). This runner stresses exactly that: a seeded
program (the same on every rank) of ``--calls`` calls picks transport, op (all_reduce, all_gather,
reduce_scatter, broadcast), size, codec (native or int8) and sync/async per call; up to ``--depth``
async handles stay outstanding, waited for in program order (``--wait-order program``, the same on every
rank) or in each rank's own random order (``--wait-order rank``). Every
result is checked against the exact value (dyadic inputs: sums are exact in fp32; with int8 against the
codec's bound) and hashed; rank 0 prints one JSON line with calls, seconds, calls/s, load average and
whether every rank's results hash the same. Exits non-zero on a wrong result; ``--timeout`` bounds the
run (a deadlock ends as a failure naming the call each rank was at, not a hang).

Finding (see ``--wait-order rank``), since fixed by the MPI transport's progress thread: MPI requests progress only inside MPI calls (Open MPI has no
progress thread by default), so when ranks wait for their outstanding handles in DIFFERENT orders, one
rank can block in an MPI wait whose peers are blocked in a later torch.distributed call that this rank
has not issued yet: a deadlock that neither transport alone has. Waiting in program order (the same on
every rank), or on ccoll waiter threads (``get_future()``, which keep MPI progressing), avoids it.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import random
import sys
import threading
import time

from ..launch import exit_process, free_port


def _inputs(seed: int, rank: int, n: int):
    import torch

    g = torch.Generator().manual_seed(seed * 1000003 + rank)
    return torch.randint(-1024, 1024, (n,), generator=g).float() / 64  # exact sums in fp32


AT = {"call": -1}  # the call this rank is at, for the timeout message


def run(calls: int, depth: int, seed: int, wait_order: str = "program", gloo_timeout_s: float = 300.0) -> dict:
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    from .. import collectives as cc

    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    if "MASTER_PORT" not in os.environ:  # a free port of rank 0's, so concurrent runs never collide
        os.environ["MASTER_PORT"] = str(comm.bcast(free_port() if rank == 0 else None))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=rank, world_size=p, timeout=datetime.timedelta(seconds=gloo_timeout_s))
    torch.set_num_threads(1)
    program = random.Random(seed)  # the same program on every rank
    waits = random.Random(seed * 31 + rank)  # each rank's own wait order
    pending: list = []
    digests_by_call: dict = {}  # results every rank must hold identically, by call (wait orders differ)
    counts: dict = {}

    def check(item) -> None:
        i, kind, out, expect, bound = item
        err = float((out.double() - expect.double()).abs().max()) if out.numel() else 0.0
        if not err <= bound:
            raise AssertionError(f"rank {rank}: {kind} error {err} > {bound}")
        if "reduce_scatter" not in kind:  # a reduce-scatter leaves a different chunk on each rank
            digests_by_call[i] = hashlib.sha256(out.numpy().tobytes()).hexdigest()

    def finish(k: int) -> None:
        handle, item = pending.pop(k)
        handle.wait()
        check(item)

    t0 = time.perf_counter()
    def next_wait() -> int:
        return 0 if wait_order == "program" else waits.randrange(len(pending))

    for i in range(calls):
        AT["call"] = i
        transport = program.choice(("torch", "mpi"))
        group = None if transport == "torch" else comm
        op = program.choice(("all_reduce", "all_gather", "reduce_scatter", "broadcast"))
        n = program.choice((256, 4096, 65536)) * p
        codec = program.choice((None, "int8:block=256"))
        async_op = program.random() < 0.6
        counts[f"{transport}/{op}"] = counts.get(f"{transport}/{op}", 0) + 1
        xs = [_inputs(i, r, n) for r in range(p)]
        q = 1.0 / 127 if codec else 0.0  # int8: each encode within max|x| / 254; x2 margin
        if op == "all_reduce":
            out, expect = xs[rank].clone(), torch.stack(xs).sum(0)
            bound = q * (sum(float(x.abs().max()) for x in xs) + float(expect.abs().max()))
            h = cc.all_reduce(out, group=group, codec=codec, async_op=async_op, min_bytes=0)
        elif op == "all_gather":
            m = n // p
            out, expect = torch.empty(n), torch.cat([x[:m] for x in xs])
            bound = q * max(float(x[:m].abs().max()) for x in xs)
            h = cc.all_gather_into_tensor(out, xs[rank][:m], group=group, codec=codec, async_op=async_op, min_bytes=0)
        elif op == "reduce_scatter":
            m = n // p
            out, expect = torch.empty(m), torch.stack(xs).sum(0)[rank * m:(rank + 1) * m]
            bound = q * sum(float(x.abs().max()) for x in xs)
            h = cc.reduce_scatter_tensor(out, xs[rank], group=group, codec=codec, async_op=async_op, min_bytes=0)
        else:
            root = i % p
            out, expect = xs[rank].clone(), xs[root]
            bound = q * float(xs[root].abs().max())
            h = cc.broadcast(out, root, group=group, codec=codec, async_op=async_op, min_bytes=0)
        item = (i, f"#{i} {transport} {op} {codec}", out, expect, bound + 1e-30)
        if async_op:
            pending.append((h, item))
            while len(pending) > depth:
                finish(next_wait())
        else:
            check(item)
    AT["call"] = calls
    while pending:
        finish(next_wait())
    seconds = time.perf_counter() - t0
    mine = hashlib.sha256("".join(digests_by_call[k] for k in sorted(digests_by_call)).encode()).hexdigest()
    digests = comm.allgather(mine)
    dist.destroy_process_group()
    return {"ranks": p, "calls": calls, "seconds": seconds, "calls_per_s": calls / seconds,
            "identical_across_ranks": len(set(digests)) == 1, "wait_order": wait_order, "depth": depth,
            "loadavg": os.getloadavg(), "mix": counts}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ccoll.bench.two_transports", description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--depth", type=int, default=4, help="async handles kept outstanding (default 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--wait-order", choices=("program", "rank"), default="program",
                    help="wait for outstanding handles in program order (every rank alike) or in a per-rank random order")
    ap.add_argument("--timeout", type=float, default=900.0, help="fail (exit 124) after this many seconds")
    args = ap.parse_args(argv)

    def expire() -> None:
        print(f"two_transports: rank {os.environ.get('OMPI_COMM_WORLD_RANK', '?')} not finished after "
              f"{args.timeout:g} s, at call {AT['call']} of {args.calls} (deadlock?)", file=sys.stderr, flush=True)
        os._exit(124)

    timer = threading.Timer(args.timeout, expire)
    timer.daemon = True
    timer.start()
    result = run(args.calls, args.depth, args.seed, args.wait_order, gloo_timeout_s=args.timeout + 60)
    timer.cancel()
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(result), flush=True)
    return 0 if result["identical_across_ranks"] else 1


if __name__ == "__main__":
    exit_process(main())  # gloo and MPI both up: no interpreter teardown (see ccoll.launch)
