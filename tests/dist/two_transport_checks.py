"""Run under mpiexec: one job, two transports. torch.distributed (gloo) is initialised from mpiexec's
ranks, ``ccoll.patch`` is installed with a v2 policy that sends the "dp" dimension through MPI
(``transport: mpi``) and leaves "tp" on torch, and the ranks make a seeded random mix of collectives on
both dimensions, sync and async (several in flight at once, waited in another order), native-sized and
compressed-sized, checking every result.

    mpiexec --allow-run-as-root --oversubscribe -n 4 python tests/dist/two_transport_checks.py --calls 1000

Groups (n ranks, n even): dp = WORLD when n == 2, else the pairs {r, r + n/2}; tp = pairs {2k, 2k+1}
(n == 2: one group of both ranks, so the same ranks talk over both transports).

Rank 0 prints one ``CCOLL_REPORT <json>`` line: calls per (dim, transport), seconds, load average.
``--mismatch``: number the torch ranks in reverse of MPI's and expect every rank to fail the first dp
call with TransportError. Any failure prints the traceback and aborts every rank (non-zero exit).
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import random
import sys
import time
import traceback

POLICY = {
    "version": 2,
    "dp": {"transport": "mpi", "error_feedback": False,
           "sizes": [{"below": "16KiB", "codec": "native"}, {"codec": "int8:block=256"}]},
    "tp": {"sizes": [{"below": "16KiB", "codec": "native"}, {"codec": "bf16"}],
           "ops": {"broadcast": {"codec": "native"}}},
}
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
NUMELS = (1000, 2048, 16384)  # 4 KB and 8 KB stay native, 64 KB compress (min_bytes 4 KiB)


def _count_transport_calls(counts: collections.Counter) -> None:
    """Count every call that reaches a transport, by transport kind (the evidence of selection)."""
    from ccoll.transports.mpi import MPITransport
    from ccoll.transports.torch_dist import TorchTransport

    for cls in (MPITransport, TorchTransport):
        for name in ("all_to_all", "all_gather", "broadcast", "native_all_reduce", "native_reduce_scatter",
                     "native_all_gather", "native_broadcast"):
            fn = cls.__dict__.get(name)
            if fn is None:
                continue

            def counted(self, *a, _fn=fn, _kind=cls.kind, **k):
                counts[_kind] += 1
                return _fn(self, *a, **k)

            setattr(cls, name, counted)


def _gather(dist):
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch >= 2.13 name


def _scatter(dist):
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _data(seed: int, rank: int, numel: int):
    import torch

    g = torch.Generator().manual_seed(seed * 1009 + rank)
    return torch.randn(numel, generator=g)


def _expected(op: str, seed: int, ranks: list[int], me: int, numel: int, root: int):
    import torch

    xs = [_data(seed, r, numel) for r in ranks]
    if op == "all_reduce":
        return torch.stack(xs).double().sum(0)
    if op == "all_gather":
        return torch.cat(xs).double()
    if op == "reduce_scatter":
        chunk = numel // len(ranks)
        i = ranks.index(me)
        return torch.stack(xs).double().sum(0)[i * chunk:(i + 1) * chunk]
    return xs[ranks.index(root)].double()  # broadcast


def run(args) -> dict:
    from mpi4py import MPI

    import torch
    import torch.distributed as dist

    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    torch.set_num_threads(1)
    torch_rank = n - 1 - rank if args.mismatch else rank
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=torch_rank,
                            world_size=n, timeout=datetime.timedelta(seconds=args.timeout))
    import ccoll.patch
    from ccoll.errors import TransportError

    counts: collections.Counter = collections.Counter()
    _count_transport_calls(counts)
    if n == 2:
        dp_groups = [dist.group.WORLD]
        tp_groups = [dist.new_group([0, 1])]
    else:
        half = n // 2
        dp_groups = [dist.new_group([r, r + half]) for r in range(half)]
        tp_groups = [dist.new_group([2 * k, 2 * k + 1]) for k in range(half)]
    me = dist.get_rank()
    dp = next(g for g in dp_groups if me in dist.get_process_group_ranks(g))
    tp = next(g for g in tp_groups if me in dist.get_process_group_ranks(g))
    placed = {id(dp): "dp", id(tp): "tp"}

    def resolver(group, op):
        return placed.get(id(group if group is not None else dist.group.WORLD), "default")

    if args.mismatch:
        with ccoll.patch.installed(POLICY, resolver=resolver, step_counter="manual"):
            try:
                dist.all_reduce(torch.ones(10), group=dp)
            except TransportError as e:
                assert "mpirun" in str(e) and f"rank {me}" in str(e), e
                dist.destroy_process_group()
                return {"mismatch": "TransportError"}
        raise AssertionError("a torch rank numbered unlike its MPI rank was not refused")

    rng = random.Random(args.seed)  # the same program on every rank: one shared stream of choices
    pending: list = []
    calls = collections.Counter()
    worst = {"native": 0.0, "compressed": 0.0}
    t0 = time.perf_counter()

    def check(item) -> None:
        handle, out, op, dim, seed, ranks, numel, root, compressed = item
        if handle is not None:
            handle.wait()
        ref = _expected(op, seed, ranks, me, numel, root)
        err = float((out.double() - ref).norm() / ref.norm())
        kind = "compressed" if compressed else "native"
        worst[kind] = max(worst[kind], err)
        bound = 0.02 if compressed else 1e-6
        assert err <= bound, (op, dim, numel, kind, err)

    with ccoll.patch.installed(POLICY, resolver=resolver, step_counter="manual"):
        for i in range(args.calls):
            dim = rng.choice(("dp", "tp"))
            group = dp if dim == "dp" else tp
            ranks = dist.get_process_group_ranks(group)
            op = rng.choice(OPS)
            numel = rng.choice(NUMELS)
            async_op = rng.random() < 0.4
            seed = args.seed * 100003 + i
            x = _data(seed, me, numel)
            root = ranks[rng.randrange(len(ranks))]
            if op == "all_reduce":
                out = x
                h = dist.all_reduce(out, group=group, async_op=async_op)
            elif op == "all_gather":
                out = torch.empty(numel * len(ranks))
                h = _gather(dist)(out, x, group=group, async_op=async_op)
            elif op == "reduce_scatter":
                out = torch.empty(numel // len(ranks))
                h = _scatter(dist)(out, x, group=group, async_op=async_op)
            else:
                out = x
                h = dist.broadcast(out, src=root, group=group, async_op=async_op)
            policy = ccoll.patch.current_policy()
            compressed = policy.resolve(dim, op, x) is not None
            calls[f"{dim}:{op}:{'compressed' if compressed else 'native'}"] += 1
            pending.append((h if async_op else None, out, op, dim, seed, ranks, numel, root, compressed))
            # keep up to 3 calls unchecked, async ones in flight; finish them newest first
            if len(pending) > rng.randrange(1, 4):
                for item in reversed(pending):
                    check(item)
                pending.clear()
            if rng.random() < 0.05:
                ccoll.patch.step()
        for item in reversed(pending):
            check(item)
    seconds = time.perf_counter() - t0
    dist.barrier()
    from ccoll.transports.registry import _mpi_by_ranks

    totals = world.gather(dict(counts), root=0)
    mpi_groups = world.gather(sorted(list(r) for r in _mpi_by_ranks), root=0)
    dist.destroy_process_group()
    return {"world_size": n, "calls": args.calls, "by_kind": dict(calls), "transport_calls": totals, "mpi_groups": mpi_groups,
            "worst_rel_err": worst, "seconds": seconds, "loadavg": os.getloadavg()}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--mismatch", action="store_true")
    args = p.parse_args()
    from mpi4py import MPI

    try:
        report = run(args)
    except BaseException:
        sys.stdout.write(f"rank {MPI.COMM_WORLD.Get_rank()} failed:\n{traceback.format_exc()}\n")
        sys.stdout.flush()
        MPI.COMM_WORLD.Abort(1)
        return 1
    if MPI.COMM_WORLD.Get_rank() == 0:
        print("CCOLL_REPORT " + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    from ccoll.launch import exit_process

    exit_process(main())
