"""``python -m ccoll.tune``: measure every candidate and write the v2 policy that picks the fastest one
within each dimension's error budget, per op and size bucket (MCR-DL's tuning suite, COCCL's per-size
autotuning).

    python -m ccoll.tune --np 4 --out tuned.yaml                         # local ranks (gloo)
    torchrun --nproc-per-node 8 ... -m ccoll.tune --out tuned.yaml        # the user's own cluster
    mpirun -n 8 python -m ccoll.tune --transports torch,mpi --out tuned.yaml
    python -m ccoll.bench.netem --ranks 4 --rate 1gbit -- python -m ccoll.tune --out tuned.yaml
    python -m ccoll.tune --np 2 --data results/capture --compare configs/*.yaml --out tuned.yaml

What it does, on every rank (rank 0 prints and writes):

1. Timing: for each op x size x transport x candidate codec, the collective's time as
   ``ccoll.bench``'s harness measures it (:func:`ccoll.bench.harness.measure`: barrier, time each
   iteration), on the harness's inputs; ``--stat`` picks the figure that decides: ``best`` (default,
   the fastest iteration: on a shared machine noise only adds time), ``median``, or ``mean`` (the
   harness's slowest-rank mean). Each size's candidates are timed in ``--rounds`` interleaved rounds
   (default 3) and a candidate's rounds are folded the same way (fastest round for ``best``, else the
   median round): a disturbance of a shared machine lasts seconds, so one candidate measured once can
   lose by a third what it wins in the next minute (4 ranks at 1 Gbit/s, 8 MiB: int8 80 ms in the
   tuning pass, 60 ms in the compare pass). Sizes are the harness's (all_gather: the
   gathered output; the policy's buckets use each rank's input, size / n).
2. Error: each codec's relative L2 round-trip error (pooled, :func:`ccoll.bench.rd.measure`) on
   real-looking data per (dimension, op): tensors captured with ``CCOLL_CAPTURE`` (``--data DIR``) where
   the capture has that (dim, op), else synthetic: heavy-tailed (Student-t, 3 degrees of freedom) for
   DP gradients, Gaussian otherwise.
3. Budget: a codec is a candidate for (dim, op) when its error is within the budget: ``--budget
   dp=0.12`` (per dimension), by default the error the shipped ``configs/hybrid.yaml`` codec of that
   (dim, op) measures on the same data x ``--slack`` (so an op hybrid keeps exact admits only exact
   codecs).
4. Choice, per (dim, op): for each transport, at each measured size the fastest candidate; a codec must
   beat torch's native time at that size by ``--margin`` (default 5%) or native is kept, so the policy
   is never slower than native where measured (native wins ties). ``--confirm`` (default): every
   codec/transport that beats native by the margin within a budget is timed again, right after native,
   and must win again: the slower of its two figures must beat the faster of native's, while candidates
   are ranked among themselves by their faster figure. A size bucket ``[s_i, s_i+1)`` takes
   the choice measured at ``s_i``, its smallest size (compression gains grow with size), and tensors
   below the smallest measured size stay native. ``transport: mpi`` is chosen for a (dim, op) only when
   it is feasible at every size (nothing slower than torch's native) and faster overall by the margin.
5. Output: a v2 policy YAML with the measured figures as comments (``--out``) and the raw table as JSON
   (``--json``, default: the YAML's path with ``.json``).
6. ``--compare A.yaml B.yaml ...``: after tuning, a second, independent timing pass of every policy
   (the tuned one included) at every size, in the same run: the codec each policy resolves for (dim,
   op, size) is timed again, and the JSON/printout gives per size the tuned policy's speed relative to
   native and to the best static policy (all of them, and those within the budget).

A progress bar goes to stderr (rank 0). ``--np N`` starts N local ranks (gloo; with ``--transports``
including mpi: under mpiexec, torch.distributed initialised from its ranks).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from . import launch
from .units import format_nbytes
from .bench import harness
from .bench.harness import COLLECTIVES, BenchError, parse_size, size_sweep, split_codecs

#: harness collective -> policy op
POLICY_OPS = {"all_reduce": "all_reduce", "reduce_scatter": "reduce_scatter", "all_gather": "all_gather",
              "broadcast": "broadcast", "all_to_all": "all_to_all", "sendrecv": "send_recv"}
DEFAULT_OPS = "all_reduce,reduce_scatter,all_gather,sendrecv"
DEFAULT_CODECS = "native,bf16,int8:block=256,int4:block=64"
DEFAULT_DIMS = "dp,tp,pp"
#: which ops each dimension's traffic uses (only these get rules)
DIM_OPS = {"dp": ("all_reduce", "reduce_scatter", "all_gather"), "tp": ("all_reduce", "reduce_scatter", "all_gather"),
           "pp": ("send_recv",), "ep": ("all_to_all",)}
HYBRID = Path(__file__).resolve().parent.parent / "configs" / "hybrid.yaml"
SYNTH_NUMEL = 1 << 20


# --- data and error ------------------------------------------------------------------------------

def synthetic(kind: str, numel: int = SYNTH_NUMEL, seed: int = 0) -> torch.Tensor:
    """'heavy': Student-t with 3 degrees of freedom (DP gradients are heavy-tailed); 'gaussian'."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g)
    if kind == "heavy":
        chi2 = torch.randn(3, numel, generator=g).square().sum(0)
        x = x / (chi2 / 3).sqrt()
    return x


def samples_by_key(directory: str | None, max_per_key: int = 8) -> dict[tuple[str, str], list[torch.Tensor]]:
    """Captured tensors grouped by (dim, op), an even spread of at most ``max_per_key`` each."""
    if not directory:
        return {}
    from .capture import load

    found: dict[tuple[str, str], list[torch.Tensor]] = {}
    for s in load(directory):
        found.setdefault((s["meta"]["dim"], s["meta"]["op"]), []).append(s["tensor"].float().reshape(-1).contiguous())
    if not found:
        raise BenchError(f"--data {directory}: no captured tensors (*.pt from CCOLL_CAPTURE) found")
    for k, xs in found.items():
        if len(xs) > max_per_key:
            found[k] = [xs[round(i * (len(xs) - 1) / (max_per_key - 1))] for i in range(max_per_key)]
    return found


def error_table(dims: list[str], ops: list[str], specs: list[str], data: str | None, seed: int) -> dict:
    """{(dim, op): {"source": ..., "errors": {spec: pooled rel_l2}}} for every spec plus the hybrid's."""
    from .bench.rd import measure as rd_measure
    from .codecs import get_codec

    captured = samples_by_key(data)
    out: dict = {}
    for dim in dims:
        for op in ops:
            if op not in DIM_OPS.get(dim, ()):
                continue
            xs = captured.get((dim, op))
            source = f"captured ({len(xs)} tensors)" if xs else None
            if not xs:
                kind = "heavy" if dim == "dp" else "gaussian"
                xs, source = [synthetic(kind, seed=seed)], f"synthetic {kind}"
            errs = {}
            for spec in specs:
                if spec == harness.NATIVE:
                    errs[spec] = 0.0
                    continue
                codec = get_codec(spec, backend="torch")
                ms = [rd_measure(x, codec) for x in xs]
                x2 = sum(m["x2"] for m in ms)
                errs[codec.spec] = math.sqrt(sum(m["err2"] for m in ms) / x2) if x2 > 0 else 0.0
            out[(dim, op)] = {"source": source, "errors": errs}
    return out


def default_budgets(errors: dict, slack: float) -> dict:
    """Per (dim, op): the error of configs/hybrid.yaml's codec on the same data, x slack (0 if exact)."""
    from .bench.rd import measure as rd_measure
    from .policy import Policy

    hybrid = Policy.from_yaml(HYBRID)
    budgets = {}
    for (dim, op), row in errors.items():
        codec = hybrid.rule(dim, op).codec_obj
        if codec is None or not codec.lossy:
            budgets[(dim, op)] = 0.0
            continue
        if codec.spec not in row["errors"]:
            kind = "heavy" if dim == "dp" else "gaussian"
            row["errors"][codec.spec] = rd_measure(synthetic(kind), codec)["rel_l2"]
        budgets[(dim, op)] = row["errors"][codec.spec] * slack
    return budgets


# --- choosing ------------------------------------------------------------------------------------

def beating_native(times: dict, gate: dict, native_us: float, errors: dict, budget: float, transport: str,
                   size: int, margin: float):
    """(spec, us) of every candidate on ``transport`` at ``size`` within the error ``budget`` whose
    ``gate`` figure beats ``native_us`` by the margin (torch's native itself is the reference, not a
    candidate); ``us`` is its ``times`` figure, which ranks it."""
    for (tr, spec, s), us in times.items():
        if tr != transport or s != size or us is None or (tr == "torch" and spec == harness.NATIVE):
            continue
        if spec != harness.NATIVE and errors.get(spec, math.inf) > budget:
            continue
        if gate.get((tr, spec, s), us) <= native_us * (1 - margin):
            yield spec, us


def choose(times: dict, native_time: dict, errors: dict, budget: float, sizes: list[int], transports: list[str],
           margin: float, gate: dict | None = None) -> dict:
    """The choice for one (dim, op). ``times[(transport, spec, size)]`` in us ranks the candidates;
    ``gate`` (default: ``times``) is the figure that must beat ``native_time[size]`` (torch's native
    time) by the margin -- the confirmation pass makes it the slower of a candidate's two passes, so a
    lucky pass cannot take a size from native, while the ranking among candidates keeps their fastest
    figure (an unlucky pass must not hand a size to a slower codec: 2 ranks at 1 Gbit/s, 8 MiB, int4
    30.9 ms then 40.4 ms against int8 36.5/37.5 ms, and int4 was faster again in the compare pass).
    Returns {"transport", "per_size": [(size, spec)], "score"}."""
    gate = times if gate is None else gate
    best = {"transport": "torch", "per_size": [(s, harness.NATIVE) for s in sizes], "score": float(len(sizes))}
    for tr in transports:
        per_size, score, feasible = [], 0.0, True
        for s in sizes:
            base = native_time[s]
            # native on torch is the reference; anything else must win by the margin
            pick, t_pick = (harness.NATIVE, base) if tr == "torch" else (None, math.inf)
            for spec, t in beating_native(times, gate, base, errors, budget, tr, s, margin):
                if t < t_pick:
                    pick, t_pick = spec, t
            if pick is None:
                feasible = False
                break
            per_size.append((s, pick))
            score += t_pick / base
        if feasible and (tr == "torch" or score < best["score"] * (1 - margin)):
            best = {"transport": tr, "per_size": per_size, "score": score}
    return best


_fmt_bytes = format_nbytes


def _short(spec: str) -> str:
    """A spec without its default parameters, for the comment tables."""
    return ",".join(p for p in spec.split(",") if p not in ("round=nearest", "seed=0"))


def buckets(per_size: list[tuple[int, str]]) -> list[dict]:
    """Measured (policy nbytes, spec) pairs -> v2 ``sizes`` buckets: native below the first size, each
    choice up to the next measured size, adjacent equal choices merged."""
    out: list[dict] = [{"below": per_size[0][0], "codec": harness.NATIVE}]
    for i, (_, spec) in enumerate(per_size):
        nxt = per_size[i + 1][0] if i + 1 < len(per_size) else None
        if out[-1]["codec"] == spec:
            out[-1]["below"] = nxt
        else:
            out.append({"below": nxt, "codec": spec})
    return [b if b["below"] is not None else {"codec": b["codec"]} for b in out]


def policy_yaml(choices: dict, table: dict, meta: dict) -> str:
    """The v2 policy text, measured figures as comments."""
    lines = [
        "# Written by python -m ccoll.tune: per (dimension, op), the fastest codec within the dimension's error",
        "# budget at each measured size (native unless a codec beats it by the margin; native below the",
        f"# smallest size measured). Times: us per call ({meta['stat']} of the iterations); err: relative L2 round trip on",
        "# the data named per op.",
        f"# world_size {meta['world_size']}  backend {meta['backend']}  transports {','.join(meta['transports'])}  "
        f"margin {meta['margin']}  link {meta['netem'] or 'unshaped'}",
        f"# load avg at start {'/'.join(f'{v:.2f}' for v in meta['loadavg_start'])}  host {meta['host']}",
        "version: 2",
        "default:",
        "  codec: native",
    ]
    by_dim: dict[str, list] = {}
    for (dim, op), ch in sorted(choices.items()):
        by_dim.setdefault(dim, []).append((op, ch))
    for dim, ops in by_dim.items():
        lines += ["", f"{dim}:", "  ops:"]
        for op, ch in ops:
            info = table["errors"][f"{dim}/{op}"]
            lines.append(f"    # {op}: budget rel_l2 <= {info['budget']:.4g} ({info['source']}); rel_l2 "
                         + ", ".join(f"{_short(k)} {v:.4g}" for k, v in sorted(info["errors"].items())))
            for row in ch["rows"]:
                lines.append("    #   " + row)
            lines.append(f"    {op}:")
            lines.append("      sizes:")
            for b in ch["buckets"]:
                if "below" in b:
                    lines.append(f"        - {{below: {_fmt_bytes(b['below'])}, codec: \"{b['codec']}\"}}")
                else:
                    lines.append(f"        - {{codec: \"{b['codec']}\"}}")
            if ch["transport"] != "torch":
                lines.append(f"      transport: {ch['transport']}")
            if ch["error_feedback"]:
                lines.append("      error_feedback: true")
    return "\n".join(lines) + "\n"


# --- the run -------------------------------------------------------------------------------------

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
    from .codecs import get_codec

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
    from .policy import Policy

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
    from .codecs import get_codec

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


# --- command line --------------------------------------------------------------------------------

def _budget(text: str) -> tuple[str, float]:
    dim, _, value = text.partition("=")
    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--budget {text!r}: expected DIM=REL_L2 (e.g. dp=0.12)") from None
    if dim not in DIM_OPS or v < 0:
        raise argparse.ArgumentTypeError(f"--budget {text!r}: dimension one of {', '.join(DIM_OPS)}, error >= 0")
    return dim, v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ccoll.tune", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="tuned.yaml", help="the policy to write (default tuned.yaml)")
    p.add_argument("--json", default=None, metavar="PATH", help="raw table (default: --out with .json)")
    p.add_argument("--ops", default=DEFAULT_OPS, help=f"harness collectives to tune (default {DEFAULT_OPS})")
    p.add_argument("--dims", default=DEFAULT_DIMS, help=f"dimensions to write rules for (default {DEFAULT_DIMS})")
    p.add_argument("--codecs", default=DEFAULT_CODECS, help=f"candidates, native included (default {DEFAULT_CODECS})")
    p.add_argument("--transports", default="torch", help="torch, or torch,mpi (under mpirun; default torch)")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("64K"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("--sizes", default=None, help="explicit comma list of sizes instead of -b/-e/-f (e.g. 64K,1M,8M,64M)")
    p.add_argument("-n", "--iters", type=int, default=None, help="timed iterations (default: the harness's)")
    p.add_argument("-w", "--warmup", type=int, default=None)
    p.add_argument("--stat", choices=list(STATS), default="best",
                   help="which time decides: best = fastest iteration (default: on a shared machine noise only "
                        "adds time), median or mean (the harness's slowest-rank mean)")
    p.add_argument("--data", default=None, metavar="DIR", help="captured tensors (CCOLL_CAPTURE=DIR) for the error")
    p.add_argument("--budget", type=_budget, action="append", default=[], metavar="DIM=REL_L2",
                   help="error budget of a dimension (default: hybrid.yaml's codec error on the same data x --slack)")
    p.add_argument("--slack", type=float, default=1.1, help="default budget = hybrid's error x this (default 1.1)")
    p.add_argument("--margin", type=float, default=0.05,
                   help="a codec or transport must be this much faster than native to be chosen (default 0.05)")
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved timing rounds over the candidates of each size, folded by --stat (default 3)")
    p.add_argument("--confirm", action=argparse.BooleanOptionalAction, default=True,
                   help="time every candidate that beats native a second time; it must win both times (default on)")
    p.add_argument("--compare", nargs="*", default=[], metavar="POLICY",
                   help="after tuning, time these static policies and the tuned one again in the same run")
    p.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    p.add_argument("--np", type=int, default=None, help="start this many local ranks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
        args.dims = [d.strip() for d in args.dims.split(",") if d.strip()]
        args.codecs = split_codecs([args.codecs])
        args.transports = [t.strip() for t in args.transports.split(",") if t.strip()]
        args.budget = dict(args.budget)
        if args.rounds < 1:
            raise BenchError(f"--rounds {args.rounds}: at least 1")
        args.sizes = sorted({parse_size(x) for x in args.sizes.split(",") if x.strip()}) if args.sizes else None
        for o in args.ops:
            if o not in POLICY_OPS:
                raise BenchError(f"--ops {o!r}: one of {', '.join(POLICY_OPS)}")
        for d in args.dims:
            if d not in DIM_OPS:
                raise BenchError(f"--dims {d!r}: one of {', '.join(DIM_OPS)}")
        if harness.NATIVE not in args.codecs:
            args.codecs.insert(0, harness.NATIVE)  # the reference every choice is measured against
        args.codecs.sort(key=lambda s: s != harness.NATIVE)
        if not set(args.transports) <= {"torch", "mpi"} or "torch" not in args.transports:
            raise BenchError("--transports: torch or torch,mpi (torch's native time is the reference)")
        _resolve(args.codecs)  # fail here, not in N ranks
        size_sweep(args.minbytes, args.maxbytes, args.stepfactor)
        env = os.environ
        if launch.under_mpi(env) or ("RANK" in env and "WORLD_SIZE" in env):
            if "mpi" in args.transports and not launch.under_mpi(env):
                raise BenchError("--transports mpi: start under mpirun (or give --np N)")
            return run_rank(args)
        if args.np is None:
            raise BenchError("give --np N, or start under torchrun / mpirun / ccoll.bench.netem")
        return _launch(args, argv)
    except BenchError as e:
        print(f"ccoll.tune: error: {e}", file=sys.stderr)
        return 2


def _launch(args, argv: list[str]) -> int:
    try:
        procs = launch.start_ranks([sys.executable, "-m", "ccoll.tune", *argv], args.np, mpi="mpi" in args.transports)
    except launch.LaunchError as e:
        raise BenchError(f"--transports mpi needs mpiexec: {e}") from None
    return launch.supervise(procs, args.timeout)


if __name__ == "__main__":
    launch.exit_process(main())
