"""What ccoll.patch costs on the calls it passes through (tiny tensors below ``min_bytes``).

    python tools/bench_patch_overhead.py [--ranks 2] [--calls 500] [--rounds 9] [--policy configs/hybrid.yaml] [--json out.json]

Two measurements, both on gloo ranks on this machine:
1. end to end: the same tiny collective (all_reduce, all_gather_into_tensor, broadcast, send/recv; 64 B)
   unpatched vs patched, in one run; blocks of ``--calls`` calls alternate unpatched / patched for
   ``--rounds`` rounds so load drift hits both alike; the median per-call wall and CPU time of each is
   reported (CPU time: all threads of the rank, gloo's included; it barely moves when others load the
   machine, wall time does);
2. the wrapper alone, without communication, in thread CPU time: the patch's wrapper around a no-op
   stand-in for the torch function vs the no-op itself (resolver lookup, policy decision, native stats
   record).
The resolver places WORLD as "dp" and WORLD p2p as "pp", so every call is decided and counted, the
most the patch ever does for a call it does not compress.
3. per function on torch's fake process group (``torch.testing._internal.distributed.fake_pg``: every call
   completes at once, nothing is sent), in this process: torch's own call vs the patched one with the
   resolver users get by default (``AutoResolver``), and with a resolver that places nothing (the wrapper
   layers alone). No wire, no peer, no other process: the steadiest figure of what the patch adds per
   call, in microseconds (send/recv run two wrapper layers: torch's send calls the wrapped isend).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from ccoll.launch import RankError, run_gloo  # noqa: E402

NUMEL = 16  # 64 B of fp32: far below any min_bytes


def _ops(dist, torch, rank: int, world: int):
    x = torch.ones(NUMEL)
    out = torch.empty(NUMEL * world)
    peer = 1 - rank if world == 2 else None

    def all_reduce():
        dist.all_reduce(x)

    def all_gather():
        dist.all_gather_into_tensor(out, x)

    def broadcast():
        dist.broadcast(x, src=0)

    def send_recv():  # one exchange each way, so both ranks stay in step
        if rank == 0:
            dist.send(x, peer)
            dist.recv(x, peer)
        else:
            dist.recv(x, peer)
            dist.send(x, peer)

    ops = {"all_reduce": all_reduce, "all_gather_into_tensor": all_gather, "broadcast": broadcast}
    if peer is not None:
        ops["send_recv"] = send_recv
    return ops


def _per_call_us(fn, calls: int) -> tuple[float, float]:
    """(wall, CPU) microseconds per call; CPU time (all threads of this rank, gloo's included) is what
    the patch adds work to, and it is far less disturbed than wall time when the machine is shared."""
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6, (time.process_time() - c0) / calls * 1e6


def _thread_ns(fn, calls: int) -> float:
    t0 = time.thread_time_ns()
    for _ in range(calls):
        fn()
    return (time.thread_time_ns() - t0) / calls


def _rank_main(rank: int, world: int, args: argparse.Namespace) -> dict:
    """One gloo rank (started by :func:`ccoll.launch.run_gloo`, which also reports its exceptions)."""
    import torch
    import torch.distributed as dist

    import ccoll.patch as patch
    from ccoll.policy import Policy
    from ccoll.resolvers import RankSetResolver

    policy = Policy.from_yaml(args.policy)
    resolver = RankSetResolver({"dp": [list(range(world))]}, p2p_on_world="pp")
    ops = _ops(dist, torch, rank, world)
    rows = []
    for name, fn in ops.items():
        for _ in range(args.calls // 5):  # warm-up (connections, allocator)
            fn()
        unpatched, patched = [], []
        for _ in range(args.rounds):
            dist.barrier()
            unpatched.append(_per_call_us(fn, args.calls))
            patch.install(policy, resolver)
            dist.barrier()
            patched.append(_per_call_us(fn, args.calls))
            patch.uninstall()
        u, p = (statistics.median(w for w, _ in unpatched), statistics.median(w for w, _ in patched))
        uc, pc = (statistics.median(c for _, c in unpatched), statistics.median(c for _, c in patched))
        rows.append({"op": name, "nbytes": NUMEL * 4, "unpatched_us": u, "patched_us": p,
                     "overhead_pct": (p - u) / u * 100.0, "unpatched_cpu_us": uc, "patched_cpu_us": pc,
                     "cpu_overhead_pct": (pc - uc) / uc * 100.0})

    # the wrapper alone: around a no-op stand-in, no communication at all
    x = torch.ones(NUMEL)
    stub = lambda tensor, op=None, group=None, async_op=False: None  # noqa: E731
    patch.install(policy, resolver)
    wrapped = patch.wrap.make("all_reduce", stub)
    n = args.calls * 20
    stub_ns = min(_thread_ns(lambda: stub(x), n) for _ in range(5))
    wrapped_ns = min(_thread_ns(lambda: wrapped(x), n) for _ in range(5))
    patch.uninstall()
    decision = {"stub_ns": stub_ns, "wrapped_ns": wrapped_ns, "added_ns": wrapped_ns - stub_ns}
    dist.barrier()
    return {"rows": rows, "decision": decision}


def fake_pg_rows(policy_path: str, calls: int) -> list[dict]:
    """Measurement 3 (see the module docstring), in this process; returns one row per function."""
    import statistics as st

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import ccoll.patch as patch
    from ccoll.patch import fingerprint

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    # the fake group has no second rank to publish a policy fingerprint (and its store stores nothing)
    check, fingerprint.check = fingerprint.check, lambda state: setattr(state, "checked", True)
    x, out = torch.ones(NUMEL), torch.empty(2 * NUMEL)
    fns = {"all_reduce": lambda: dist.all_reduce(x), "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(out, x),
           "broadcast": lambda: dist.broadcast(x, src=0), "send": lambda: dist.send(x, 1),
           "recv": lambda: dist.recv(x, 1), "isend+wait": lambda: dist.isend(x, 1).wait()}

    def per_call_us(fn) -> float:
        for _ in range(calls // 5):
            fn()
        return st.median(_thread_ns(fn, calls) for _ in range(7)) / 1e3

    try:
        rows = {name: {"op": name, "torch_us": per_call_us(fn)} for name, fn in fns.items()}
        for key, resolver in (("patched_us", None), ("wrapper_only_us", lambda group, op: None)):
            patch.install(policy_path, resolver)
            try:
                for name, fn in fns.items():
                    rows[name][key] = per_call_us(fn)
            finally:
                patch.uninstall()
    finally:
        fingerprint.check = check
        dist.destroy_process_group()
    return list(rows.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--calls", type=int, default=500, help="calls per timed block")
    ap.add_argument("--rounds", type=int, default=9, help="alternating unpatched/patched blocks")
    ap.add_argument("--policy", default=os.path.join(REPO, "configs", "hybrid.yaml"))
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args(argv)

    try:
        results = dict(enumerate(run_gloo(args.ranks, _rank_main, args, timeout_s=args.timeout)))
    except RankError as e:
        print(e, file=sys.stderr)
        return 1

    r0 = results[0]
    print(f"# ccoll.patch pass-through overhead: {args.ranks} gloo ranks, policy {os.path.relpath(args.policy, REPO)}, "
          f"{args.rounds} rounds x {args.calls} calls, median per call (rank 0)")
    print(f"# load average at end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'op':<24}{'bytes':>7}{'wall_unpatched_us':>19}{'wall_patched_us':>17}{'wall_ovh_%':>12}"
          f"{'cpu_unpatched_us':>18}{'cpu_patched_us':>16}{'cpu_ovh_%':>11}")
    for row in r0["rows"]:
        print(f"{row['op']:<24}{row['nbytes']:>7}{row['unpatched_us']:>19.2f}{row['patched_us']:>17.2f}"
              f"{row['overhead_pct']:>12.2f}{row['unpatched_cpu_us']:>18.2f}{row['patched_cpu_us']:>16.2f}"
              f"{row['cpu_overhead_pct']:>11.2f}")
    d = r0["decision"]
    print(f"# wrapper alone, thread CPU time (no communication): no-op {d['stub_ns']:.0f} ns, wrapped "
          f"{d['wrapped_ns']:.0f} ns, added {d['added_ns']:.0f} ns per call")
    fake = fake_pg_rows(args.policy, args.calls * 10)
    print("# per call on torch's fake process group (nothing sent), thread CPU, median of 7 blocks: torch's call, "
          "added by the patch (default AutoResolver), added by its wrapper layers alone (a resolver placing nothing)")
    print(f"{'op':<24}{'torch_us':>10}{'patched_+us':>13}{'wrapper_only_+us':>18}")
    for row in fake:
        print(f"{row['op']:<24}{row['torch_us']:>10.2f}{row['patched_us'] - row['torch_us']:>13.2f}"
              f"{row['wrapper_only_us'] - row['torch_us']:>18.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": args.ranks, "policy": args.policy, "calls": args.calls, "rounds": args.rounds,
                       "per_rank": results, "fake_pg": fake}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
