"""What ccoll.patch costs on the calls it passes through (tiny tensors below ``min_bytes``).

    python tools/bench_patch_overhead.py [--ranks 2] [--calls 50] [--rounds 60] [--policy configs/hybrid.yaml]
        [--nbytes 64,4096,65536,1048576] [--json out.json]

Three measurements:
1. end to end, on gloo ranks on this machine: the same tiny collective (all_reduce, all_gather_into_tensor,
   broadcast, send/recv; 64 B, or each size of ``--nbytes``) three ways in one run: torch's call; the patch with a resolver placing
   nothing (its wrapper layers alone, the floor any Python wrapper pays); the patch as users install it
   (default ``AutoResolver``: every call resolved, decided and counted). Short blocks of ``--calls``
   calls rotate through the three in ABC CBA order for ``--rounds`` rounds (install / uninstall between
   blocks), every call timed on its own; the median of all per-call samples of each is reported, with the
   calling thread's CPU time per call (per block; gloo's threads left out: they spin while a call waits). Two ranks on two cores schedule each
   other's gloo threads: block medians wander by +-20%, which long blocks in one fixed order had turned
   into a "patch overhead" of either sign; samples pooled from many short blocks in both orders agree to
   a few percent, and the run prints the overhead on each half of its rounds so the figure says how far
   it can be trusted. On real communication the patch's Python runs with caches cold (each call follows
   a context switch to gloo's threads): its CPU time there is 2-3x what measurement 3 finds in a hot loop
   (and torch's own call's is ~7x);
2. the wrapper alone, without communication, in thread CPU time: the patch's wrapper around a no-op
   stand-in for the torch function vs the no-op itself (resolver lookup, policy decision, native stats
   record), with a resolver that places WORLD as "dp" (every call decided and counted);
3. per function on torch's fake process group (``torch.testing._internal.distributed.fake_pg``: every call
   completes at once, nothing is sent), in this process: torch's own call vs the patched one with the
   resolver users get by default (``AutoResolver``), and with a resolver that places nothing (the wrapper
   layers alone). No wire, no peer, no other process: the steadiest figure of what the patch adds per
   call, in microseconds (send/recv run two wrapper layers: torch's send calls the wrapped isend).

Sizes above the policy's ``min_bytes`` pass through only where the policy never compresses (``configs/
baseline.yaml``: every call); with a compressing policy the "patched" column at such a size times
compression, and the run says so per row (``passthrough``).
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

NBYTES = 64  # 16 fp32 values: far below any min_bytes


def _ops(dist, torch, rank: int, world: int, numel: int):
    x = torch.ones(numel)
    out = torch.empty(numel * world)
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


def _block(fn, calls: int, samples: list, cpu: list) -> None:
    """``calls`` calls of ``fn``, each timed (wall, appended to ``samples`` in microseconds); the block's
    CPU time per call of the calling thread (the one the patch's code runs on; gloo's own threads are left out,
    they spin for as long as the call waits) appended to ``cpu``."""
    perf = time.perf_counter
    c0 = time.thread_time()
    for _ in range(calls):
        t0 = perf()
        fn()
        samples.append((perf() - t0) * 1e6)
    cpu.append((time.thread_time() - c0) / calls * 1e6)


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
    # torch's call; the patch with a resolver placing nothing (its wrapper layers alone: the floor of any
    # Python wrapper); the patch as users install it (default AutoResolver: every call resolved, decided,
    # counted)
    modes = {"torch": None, "layers": lambda group, op: None, "patched": "auto"}
    rows = []
    for nbytes in args.nbytes:
        rows.extend(_size_rows(dist, torch, patch, policy, modes, rank, world, nbytes, args))

    # the wrapper alone: around a no-op stand-in, no communication at all
    x = torch.ones(NBYTES // 4)
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


def passes_through(policy, op: str, nbytes: int) -> bool:
    """Whether the policy leaves an fp32 tensor of ``nbytes`` to torch for the policy op ``op`` on every
    dimension (a call's dimension depends on the resolver): the rows this tool times as pass-through."""
    import torch

    from ccoll.policy import DIMENSIONS

    return all(policy.resolve(dim, op, (nbytes // 4, torch.float32)) is None
               and policy.rule(dim, op).transport == "torch" for dim in DIMENSIONS)


def _size_rows(dist, torch, patch, policy, modes: dict, rank: int, world: int, nbytes: int,
               args: argparse.Namespace) -> list[dict]:
    """Measurement 1 at one size: a row per op."""
    passthrough = {name: passes_through(policy, op, nbytes) for name, op in
                   (("all_reduce", "all_reduce"), ("all_gather_into_tensor", "all_gather"),
                    ("broadcast", "broadcast"), ("send_recv", "send_recv"))}
    rows = []
    for name, fn in _ops(dist, torch, rank, world, nbytes // 4).items():
        for _ in range(args.calls // 5):  # warm-up (connections, allocator)
            fn()
        walls: dict = {m: [] for m in modes}  # mode -> per-call wall samples
        cpus: dict = {m: [] for m in modes}
        halves: dict = {m: ([], []) for m in modes}
        for i in range(args.rounds):
            for mode in (list(modes) if i % 2 == 0 else list(modes)[::-1]):  # ABC CBA: order effects cancel
                if modes[mode] is not None:
                    patch.install(policy, None if modes[mode] == "auto" else modes[mode])
                dist.barrier()
                n0 = len(walls[mode])
                _block(fn, args.calls, walls[mode], cpus[mode])
                halves[mode][i * 2 >= args.rounds].extend(walls[mode][n0:])
                if modes[mode] is not None:
                    patch.uninstall()
        med = {m: statistics.median(v) for m, v in walls.items()}
        cpu = {m: statistics.median(v) for m, v in cpus.items()}
        u = med["torch"]
        # the overhead measured on each half of the rounds alone: how far apart they are is the noise
        half_pct = [(statistics.median(halves["patched"][h]) / statistics.median(halves["torch"][h]) - 1) * 100
                    for h in (0, 1)]
        rows.append({"op": name, "nbytes": nbytes, "passthrough": passthrough[name], "unpatched_us": u, "layers_us": med["layers"],
                     "patched_us": med["patched"], "layers_pct": (med["layers"] - u) / u * 100.0,
                     "overhead_pct": (med["patched"] - u) / u * 100.0, "halves_pct": half_pct,
                     "unpatched_cpu_us": cpu["torch"], "layers_cpu_us": cpu["layers"], "patched_cpu_us": cpu["patched"],
                     "cpu_overhead_pct": (cpu["patched"] - cpu["torch"]) / cpu["torch"] * 100.0})
    return rows


def fake_pg_rows(policy_path: str, calls: int) -> list[dict]:
    """Measurement 3 (see the module docstring), in this process; returns one row per function. The
    measurement is ``python -m ccoll.bench.overhead``'s pass-through table (:func:`ccoll.bench.overhead.fake_pg_rows`)."""
    from ccoll.bench.overhead import fake_pg_rows as rows

    return rows(policy_path, calls)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--calls", type=int, default=50, help="calls per timed block")
    ap.add_argument("--rounds", type=int, default=60, help="rounds of one unpatched and one patched block")
    ap.add_argument("--policy", default=os.path.join(REPO, "configs", "hybrid.yaml"))
    ap.add_argument("--nbytes", type=lambda v: [int(b) for b in v.split(",")], default=[NBYTES],
                    help="comma-separated fp32 message sizes in bytes for measurement 1 (multiples of 4)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args(argv)
    if any(b <= 0 or b % 4 for b in args.nbytes):
        ap.error(f"--nbytes: positive multiples of 4 (fp32), got {args.nbytes}")

    try:
        results = dict(enumerate(run_gloo(args.ranks, _rank_main, args, timeout_s=args.timeout)))
    except RankError as e:
        print(e, file=sys.stderr)
        return 1

    r0 = results[0]
    print(f"# ccoll.patch pass-through overhead: {args.ranks} gloo ranks, policy {os.path.relpath(args.policy, REPO)}, "
          f"{args.rounds} rounds x 3 blocks x {args.calls} calls (ABC CBA), median of per-call wall samples (rank 0): torch's "
          "call, the patch's wrapper layers alone (a resolver placing nothing), the patch as installed by default; "
          "halves_%: patched_% on each half of the rounds alone; cpu: the calling thread's CPU time per call (median of "
          "blocks), torch's and what the layers / the patch add to it")
    print(f"# load average at end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'op':<24}{'bytes':>8}{'pass':>5}{'torch_us':>10}{'layers_us':>11}{'patched_us':>12}{'layers_%':>10}{'patched_%':>11}"
          f"{'halves_%':>14}{'cpu_torch_us':>14}{'cpu_layers_+us':>16}{'cpu_patched_+us':>17}")
    for row in r0["rows"]:
        print(f"{row['op']:<24}{row['nbytes']:>8}{'yes' if row['passthrough'] else 'NO':>5}{row['unpatched_us']:>10.2f}{row['layers_us']:>11.2f}"
              f"{row['patched_us']:>12.2f}{row['layers_pct']:>10.2f}{row['overhead_pct']:>11.2f}"
              f"{row['halves_pct'][0]:>7.1f}{row['halves_pct'][1]:>7.1f}{row['unpatched_cpu_us']:>14.2f}"
              f"{row['layers_cpu_us'] - row['unpatched_cpu_us']:>16.2f}{row['patched_cpu_us'] - row['unpatched_cpu_us']:>17.2f}")
    d = r0["decision"]
    print(f"# wrapper alone, thread CPU time (no communication): no-op {d['stub_ns']:.0f} ns, wrapped "
          f"{d['wrapped_ns']:.0f} ns, added {d['added_ns']:.0f} ns per call")
    fake = fake_pg_rows(args.policy, 5000)
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
