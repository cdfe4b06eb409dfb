"""The tuning run on every rank: time candidates in interleaved rounds, confirm, compare, write (rank 0)."""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from .. import launch
from ..bench import harness
from ..bench.harness import COLLECTIVES, BenchError, size_sweep
from .budget import default_budgets, error_table
from .choose import _fmt_bytes, _short, beating_native, buckets, choose, policy_yaml
from .options import DIM_OPS, POLICY_OPS


class Progress:
    """A one-line progress bar on stderr (rank 0 only; a plain line per step when not a terminal)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled, self.t0 = total, 0, enabled, time.monotonic()
        self.tty = sys.stderr.isatty()

    def step(self, what: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 30
        filled = int(width * self.done / max(1, self.total))
        line = (f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                f"{time.monotonic() - self.t0:6.0f}s {what}")
        sys.stderr.write(("\r" + line.ljust(100)) if self.tty else line + "\n")
        if self.tty and self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _worlds(args) -> list[tuple[str, Any]]:
    worlds: list[tuple[str, Any]] = []
    for tr in args.transports:
        if tr == "torch":
            worlds.append((tr, harness.TorchWorld(args.timeout, args.backend)))
        else:
            worlds.append((tr, harness.MPIWorld()))
    return worlds


def _resolve(specs: list[str]):
    from ..codecs import get_codec

    out = []
    for spec in specs:
        out.append((harness.NATIVE, None) if spec == harness.NATIVE else (get_codec(spec).spec, get_codec(spec)))
    return out


STATS = {"best": "time_us_best", "median": "time_us_median", "mean": "time_us"}


def fold(rounds_us: list[float], stat: str) -> float:
    """One figure from a candidate's rounds: the fastest for ``--stat best`` (noise only adds time), else
    the median round."""
    return min(rounds_us) if stat == "best" else sorted(rounds_us)[len(rounds_us) // 2]


def _time(w, coll, case, codec, args, nbytes: int) -> float:
    iters, warmup = harness._iters_for(args, nbytes)
    return harness.measure(w, coll, case, codec, iters, warmup, 0)[STATS[args.stat]]


def _policy_nbytes(coll_name: str, size: int, world: int) -> int:
    """The tensor the policy is asked about: each rank's input (all_gather: size / n)."""
    return size // world if coll_name == "all_gather" else size


def run_rank(args) -> int:
    from ..policy import Policy

    if "mpi" in args.transports:
        _torch_env_from_mpi()
    worlds = _worlds(args)
    w0 = worlds[0][1]
    n, rank = w0.size, w0.rank
    if args.np is not None and args.np != n:
        raise BenchError(f"--np {args.np} but the launcher started {n} ranks")
    specs = _resolve(args.codecs)
    colls = [COLLECTIVES[c] for c in args.ops]
    sizes = args.sizes or size_sweep(args.minbytes, args.maxbytes, args.stepfactor)
    dtype = torch.float32
    meta = {"world_size": n, "backend": args.backend, "stat": args.stat, "transports": args.transports, "margin": args.margin,
            "netem": os.environ.get("CCOLL_NETEM"), "loadavg_start": os.getloadavg(),
            "host": os.uname().nodename, "sizes": sizes, "codecs": [s for s, _ in specs], "ops": args.ops,
            "dims": args.dims, "data": args.data or "synthetic"}
    compare = [(p, Policy.from_yaml(p)) for p in args.compare]
    n_time = len(colls) * len(sizes) * len(specs) * len(worlds) * args.rounds
    prog = Progress(n_time, rank == 0 and not args.quiet)

    # 1. timing pass: --rounds interleaved rounds over every candidate of a size, so a disturbance of a
    # shared machine (which lasts seconds) falls on one round of one candidate, and the fold drops it
    times: dict[str, dict] = {}  # coll -> {(transport, spec, size): us}
    samples: dict[str, dict] = {}  # coll -> {(transport, spec, size): [us per round]}
    for coll in colls:
        smp = samples.setdefault(coll.name, {})
        for size in sizes:
            count = max(coll.granularity(n), size // dtype.itemsize // coll.granularity(n) * coll.granularity(n))
            case = coll.build(w0, count, dtype, args.seed)
            for rnd in range(args.rounds):
                for tr, w in worlds:
                    for spec, codec in specs:
                        what = f"{coll.name} {_fmt_bytes(size)} {spec} {tr}" + (f" (round {rnd + 1})" if rnd else "")
                        if tr == "mpi" and coll.name == "sendrecv":
                            prog.step(f"{what} (skipped: torch only)")
                            continue
                        smp.setdefault((tr, spec, size), []).append(_time(w, coll, case, codec, args, count * dtype.itemsize))
                        prog.step(what)
            del case
        times[coll.name] = {key: fold(us, args.stat) for key, us in smp.items()}

    # 2-4. errors, budgets and choices (rank 0 decides, everyone gets the same answer from the same table)
    policy_ops = [POLICY_OPS[c.name] for c in colls]
    errors = error_table(args.dims, policy_ops, [s for s, _ in specs], args.data, args.seed) if rank == 0 else {}
    status = 0
    budgets: dict = {}
    if rank == 0:
        budgets = default_budgets(errors, args.slack)
        for dim, value in args.budget.items():
            for key in budgets:
                if key[0] == dim:
                    budgets[key] = value
    # 4a. confirmation: every (size, transport, codec) that could take a size over native is timed again,
    # right after native; its slower and native's faster figure of the two passes decide against native,
    # so a choice must win twice (on a shared machine one lucky or unlucky iteration flips a close call)
    picks = _picks(args, colls, sizes, times, errors, budgets) if rank == 0 else []
    picks = json.loads(w0.all_gather_bytes(json.dumps(picks).encode())[0])
    gates: dict[str, dict] = {}  # coll -> {(transport, spec, size): us that must beat native}
    confirmed = _confirm(args, worlds, colls, picks, times, gates, n, prog) if args.confirm and picks else []
    if rank == 0:
        choices, table = {}, {"meta": meta, "times": [], "errors": {}, "choices": {}, "confirm": confirmed}
        for coll in colls:
            op = POLICY_OPS[coll.name]
            t = times[coll.name]
            for (tr, spec, size), us in sorted(t.items()):
                table["times"].append({"op": op, "collective": coll.name, "transport": tr, "codec": spec,
                                       "size_bytes": size, "policy_nbytes": _policy_nbytes(coll.name, size, n),
                                       "time_us": us, "rounds_us": samples[coll.name][(tr, spec, size)],
                                       "gate_us": gates.get(coll.name, {}).get((tr, spec, size), us),
                                       "speedup": t[("torch", harness.NATIVE, size)] / us})
            native_time = {s: t[("torch", harness.NATIVE, s)] for s in sizes}
            for dim in args.dims:
                if (dim, op) not in errors:
                    continue
                err = errors[(dim, op)]["errors"]
                trs = [tr for tr in args.transports if tr == "torch" or coll.name != "sendrecv"]
                ch = choose(t, native_time, err, budgets[(dim, op)], sizes, trs, args.margin,
                            gate={**t, **gates.get(coll.name, {})})
                per_size = [(_policy_nbytes(coll.name, s, n), spec) for s, spec in ch["per_size"]]
                rows = [f"{'us/call':>8} " + " ".join(f"{_short(sp) + '@' + tr:>22}" for tr in trs for sp, _ in specs)
                        + "  -> choice"]
                for (s, spec) in ch["per_size"]:
                    cells = [f"{t[(tr, sp, s)]:22.0f}" if t.get((tr, sp, s)) else f"{'-':>22}"
                             for tr in trs for sp, _ in specs]
                    rows.append(f"{_fmt_bytes(_policy_nbytes(coll.name, s, n)):>8} " + " ".join(cells)
                                + f"  -> {_short(spec)}")
                lossy = any(spec != harness.NATIVE and err.get(spec, 0) > 0 for _, spec in per_size)
                choices[(dim, op)] = {"transport": ch["transport"], "buckets": buckets(per_size), "rows": rows,
                                      "error_feedback": lossy and dim == "dp" and op in ("all_reduce", "reduce_scatter"),
                                      "per_size": per_size}
                table["errors"][f"{dim}/{op}"] = {**errors[(dim, op)], "budget": budgets[(dim, op)]}
                table["choices"][f"{dim}/{op}"] = {"transport": ch["transport"], "buckets": choices[(dim, op)]["buckets"],
                                                   "per_size": per_size}
        text = policy_yaml(choices, table, meta)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        tuned = Policy.from_yaml(out)  # the written file must load (and is what --compare times)
        table["fingerprint"] = tuned.fingerprint()
    # share the tuned policy with every rank for the compare pass
    blob = out.read_text().encode() if rank == 0 else b""
    text = w0.all_gather_bytes(blob)[0].decode()
    if compare:
        tuned = Policy.from_dict(__import__("yaml").safe_load(text), source=args.out)
        result = _compare(args, worlds, colls, sizes, [("tuned", tuned)] + compare, n)
        if rank == 0:
            table["compare"] = result
            seen = sorted({p["codec"] for r in result["rows"] for p in r["policies"].values()})
            for key, row in error_table(args.dims, policy_ops, seen, args.data, args.seed).items():
                errors[key]["errors"].update({k: v for k, v in row["errors"].items() if k not in errors[key]["errors"]})
            status = _verdict(result, budgets_by_key={f"{d}/{o}": b for (d, o), b in budgets.items()},
                              errors={f"{d}/{o}": e["errors"] for (d, o), e in errors.items()})
    if rank == 0:
        meta["loadavg_end"] = os.getloadavg()
        json_path = args.json or str(Path(args.out).with_suffix(".json"))
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(harness._finite(table), indent=1))
        print(text, end="")
        print(f"# wrote {args.out} and {json_path}; load avg now {'/'.join(f'{v:.2f}' for v in os.getloadavg())}",
              flush=True)
    for _, w in worlds:
        w.barrier()
    for _, w in reversed(worlds):
        w.close()
    return status


def _picks(args, colls, sizes, times, errors, budgets) -> list:
    """[collective, size, transport, spec]: every candidate that beats torch's native by the margin within
    some dimension's budget in the first table (rank 0) -- the ones a choice could take over native."""
    out = []
    for coll in colls:
        op, t = POLICY_OPS[coll.name], times[coll.name]
        trs = [tr for tr in args.transports if tr == "torch" or coll.name != "sendrecv"]
        for dim in args.dims:
            if (dim, op) not in errors:
                continue
            for s in sizes:
                for tr in trs:
                    for spec, _ in beating_native(t, t, t[("torch", harness.NATIVE, s)], errors[(dim, op)]["errors"],
                                                  budgets[(dim, op)], tr, s, args.margin):
                        if [coll.name, s, tr, spec] not in out:
                            out.append([coll.name, s, tr, spec])
    return out


def _confirm(args, worlds, colls, picks, times, gates, n, prog) -> list:
    """Time native and each pick again (all ranks, same order). Native's figure becomes the faster of
    its two; a pick's ``gates`` entry (what must beat native) the slower of its two, its ``times`` entry
    (what ranks it among candidates) the faster."""
    wmap = dict(worlds)
    by_coll = {c.name: c for c in colls}
    dtype = torch.float32
    prog.total += len(picks) + len({(c, s) for c, s, _, _ in picks})
    specs = dict(_resolve(sorted({spec for *_, spec in picks})))
    out = []
    for cname, size in sorted({(c, s) for c, s, _, _ in picks}, key=lambda cs: (cs[0], cs[1])):
        coll, t = by_coll[cname], times[cname]
        count = max(coll.granularity(n), size // dtype.itemsize // coll.granularity(n) * coll.granularity(n))
        case = coll.build(wmap["torch"], count, dtype, args.seed)
        native = _time(wmap["torch"], coll, case, None, args, count * dtype.itemsize)
        prog.step(f"confirm {cname} {_fmt_bytes(size)} native")
        key = ("torch", harness.NATIVE, size)
        out.append({"collective": cname, "size_bytes": size, "transport": "torch", "codec": harness.NATIVE,
                    "first_us": t[key], "second_us": native})
        t[key] = min(t[key], native)
        for c2, s2, tr, spec in picks:
            if (c2, s2) != (cname, size):
                continue
            us = _time(wmap[tr], coll, case, specs[spec], args, count * dtype.itemsize)
            prog.step(f"confirm {cname} {_fmt_bytes(size)} {spec} {tr}")
            key = (tr, spec, size)
            out.append({"collective": cname, "size_bytes": size, "transport": tr, "codec": spec,
                        "first_us": t[key], "second_us": us})
            gates.setdefault(cname, {})[key] = max(t[key], us)
            t[key] = min(t[key], us)
        del case
    return out


def _compare(args, worlds, colls, sizes, policies, n) -> dict:
    """Second timing pass: each policy's resolved codec and transport per (dim, op, size); each distinct
    (transport, codec) of a size timed in --rounds interleaved rounds and folded as in the timing pass,
    once for all the policies that resolve to it, so every policy is measured in the same conditions."""
    from ..codecs import get_codec

    wmap = dict(worlds)
    w0 = worlds[0][1]
    dtype = torch.float32
    rows = []
    for coll in colls:
        op = POLICY_OPS[coll.name]
        for size in sizes:
            count = max(coll.granularity(n), size // dtype.itemsize // coll.granularity(n) * coll.granularity(n))
            pn = _policy_nbytes(coll.name, size, n)
            needed: dict[tuple[str, str], Any] = {("torch", harness.NATIVE): None}  # same order on every rank
            plan = []
            for dim in args.dims:
                if op not in DIM_OPS.get(dim, ()):
                    continue
                entries = {}
                for name, pol in policies:
                    codec = pol.resolve(dim, op, (count if coll.name != "all_gather" else count // n, dtype),
                                        step=10**9)
                    tr = pol.rule(dim, op).transport
                    if tr not in wmap:
                        tr = "torch"  # a static policy asking for MPI in a run without it: timed on torch
                    spec = harness.NATIVE if codec is None else codec.spec
                    needed.setdefault((tr, spec), None if codec is None else get_codec(spec))
                    entries[os.path.basename(str(name))] = (tr, spec)
                plan.append((dim, entries))
            case = coll.build(w0, count, dtype, args.seed)
            rounds: dict[tuple[str, str], list[float]] = {k: [] for k in needed}
            for _ in range(args.rounds):
                for (tr, spec), codec in needed.items():
                    rounds[(tr, spec)].append(_time(wmap[tr], coll, case, codec, args, count * dtype.itemsize))
            del case
            timed = {k: fold(v, args.stat) for k, v in rounds.items()}
            native = timed[("torch", harness.NATIVE)]
            for dim, entries in plan:
                rows.append({"op": op, "dim": dim, "size_bytes": size, "policy_nbytes": pn, "native_us": native,
                             "policies": {name: {"codec": spec, "transport": tr, "time_us": timed[(tr, spec)],
                                                 "rounds_us": rounds[(tr, spec)]}
                                          for name, (tr, spec) in entries.items()}})
    return {"rows": rows}


def _verdict(result: dict, budgets_by_key: dict, errors: dict) -> int:
    """Print per (dim, op, size) tuned vs native and vs the best static policy; 0 if tuned is never slower
    than native (beyond noise) and >= 0.95x the best static within the budget."""
    print("# compare (second timing pass): speed relative to native and to the best static policy "
          "(all / within the error budget); >1 = tuned faster")
    print(f"# {'dim/op':<18} {'size':>8} {'native_us':>10} {'tuned_us':>10} {'tuned':>22} "
          f"{'x_native':>8} {'x_best':>7} {'best static':>24} {'x_best_ok':>9} {'best in budget':>24}")
    worst_native = worst_ok = math.inf
    for r in result["rows"]:
        pols = r["policies"]
        tuned = pols["tuned"]
        key = f"{r['dim']}/{r['op']}"
        budget = budgets_by_key.get(key, 0.0)
        statics = {k: v for k, v in pols.items() if k != "tuned"}
        best = min(statics.items(), key=lambda kv: kv[1]["time_us"]) if statics else None
        ok = {k: v for k, v in statics.items()
              if v["codec"] == harness.NATIVE or errors.get(key, {}).get(v["codec"], math.inf) <= budget}
        best_ok = min(ok.items(), key=lambda kv: kv[1]["time_us"]) if ok else None
        x_native = r["native_us"] / tuned["time_us"]
        x_best = best[1]["time_us"] / tuned["time_us"] if best else math.nan
        x_ok = best_ok[1]["time_us"] / tuned["time_us"] if best_ok else math.nan
        r.update(x_native=x_native, x_best_static=x_best, x_best_static_in_budget=x_ok,
                 best_static=best[0] if best else None, best_static_in_budget=best_ok[0] if best_ok else None)
        worst_native = min(worst_native, x_native)
        worst_ok = min(worst_ok, x_ok) if best_ok else worst_ok
        print(f"  {key:<18} {_fmt_bytes(r['policy_nbytes']):>8} {r['native_us']:10.0f} {tuned['time_us']:10.0f} "
              f"{tuned['codec'][:22]:>22} {x_native:8.2f} {x_best:7.2f} "
              f"{(best[0] + ':' + best[1]['codec'])[:24] if best else '-':>24} {x_ok:9.2f} "
              f"{(best_ok[0] + ':' + best_ok[1]['codec'])[:24] if best_ok else '-':>24}")
    result["worst_x_native"], result["worst_x_best_static_in_budget"] = worst_native, worst_ok
    print(f"# worst tuned/native speed ratio {worst_native:.2f}; worst tuned vs best in-budget static {worst_ok:.2f}")
    return 0


def _torch_env_from_mpi() -> None:
    """Under mpirun: torch.distributed's env:// from MPI's ranks (rank 0 picks the port, MPI broadcasts it)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    os.environ.setdefault("RANK", str(comm.Get_rank()))
    os.environ.setdefault("WORLD_SIZE", str(comm.Get_size()))
    os.environ.setdefault("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(comm.bcast(launch.free_port() if comm.Get_rank() == 0 else None, root=0))
