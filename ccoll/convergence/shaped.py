"""``python -m ccoll.convergence.shaped``: baseline vs a policy on shaped links, measured and predicted.

Why: a speedup measured on one machine is only worth something if the model that explains it also
predicts it; and the model (ccoll.model) is only worth something if it predicts what was measured.
This tool does both in one run, per link rate:

1. trains baseline and the policy on the same seed on ranks in network namespaces behind ``--rate``
   links (``ccoll.bench.netem`` via ``ccoll.convergence``; needs root), with a model large enough that DP
   gradients dominate the traffic; by default both at the same time, each on its own links, so that the
   load of a shared machine (which changes by the minute) weighs on both alike;
2. takes the codec throughput the policy's run measured in itself (``codec_in_run`` of its summary: the
   host clock around every batched codec call of steps 2.., ccoll.stats.codec_stats). Why not a separate
   micro-benchmark: the contention the training ranks put on the codec (ranks sharing cores, the other
   run's ranks, which mostly wait on the slow links) is what sets its speed, and no benchmark beside the
   run reproduces it -- the first shaped runs, with codec rates from 4 benchmark processes at once,
   over-predicted codec time by 2x at 1 Gbit/s and missed the measured speedup by 14-26%;
   ``--codec-gbps`` overrides;
3. predicts the policy's speedup with ``ccoll.model.validate``: compute = the baseline's measured step
   time minus the model's baseline link time at that rate, then compute + wire + codec for the policy,
   the codec time from the model's count of values encoded and decoded per step at that throughput;
4. prints per rate: samples/s of both, measured and predicted speedup and their difference, the
   held-out loss delta, and the predicted step decomposed (compute, wire, codec) -- which says in
   numbers why a speedup is or is not reached.

    python -m ccoll.convergence.shaped --rates 1gbit 100mbit --out results/shaped
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ..errors import CcollError
from .. import model as cmodel
from ..model.clusters import shaped_node
from ..model.fromrun import codec_overlaps
from ..units import rate_arg


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ccoll.convergence.shaped", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rates", nargs="+", type=rate_arg, default=["1gbit", "100mbit"], help="netem link rates, one comparison each")
    p.add_argument("--policy", default="configs/hybrid.yaml", help="the policy compared with configs/baseline.yaml")
    p.add_argument("--baseline", default="configs/baseline.yaml")
    p.add_argument("--dp", type=int, default=4)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--codec-gbps", type=float, default=None,
                   help="DP codec encode throughput, GB/s (default: measured in the policy's run)")
    p.add_argument("--decode-gbps", type=float, default=None, help="decode throughput (default: measured in the run)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per run")
    p.add_argument("--together", action=argparse.BooleanOptionalAction, default=True,
                   help="run baseline and policy at the same time (each on its own shaped links), so a shared "
                        "machine's changing load hits both alike")
    p.add_argument("--out", default="results/shaped")
    p.add_argument("--target-speedup", type=float, default=1.25, help="say what codec throughput this speedup needs")
    p.add_argument("--report", metavar="SHAPED_JSON", help="print the tables of a finished comparison (its "
                                                             "shaped.json) again; runs nothing")
    return p


def _dp_codec(policy: str) -> str:
    from ..policy import load
    import torch

    codec = load(policy).resolve("dp", "all_reduce", (1 << 20, torch.float32), step=10**9)
    if codec is None:
        raise CcollError(f"{policy}: DP gradients are not compressed; nothing to compare")
    return codec.spec


def _command(args, policy: str, rate: str, out: str) -> list[str]:
    return [sys.executable, "-m", "ccoll.convergence", "--policies", policy, "--netem-rate", rate, "--seeds", "1",
            "--seed", str(args.seed), "--steps", str(args.steps), "--dp", str(args.dp), "--tp", str(args.tp),
            "--pp", str(args.pp), "--hidden", str(args.hidden), "--layers", str(args.layers), "--heads", str(args.heads),
            "--seq-len", str(args.seq_len), "--micro-batch", str(args.micro_batch), "--grad-accum", str(args.grad_accum),
            "--eval-every", str(args.steps), "--timeout", str(args.timeout), "--out", out]


def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def _compare(args, rate: str, out: str) -> dict:
    """Baseline and policy at ``rate``: at the same time (``--together``, each in its own namespaces) or one
    after the other; merged into one convergence-style summary for ccoll.model.validate."""
    import subprocess

    runs = {}
    procs = []
    try:
        for path in (args.baseline, args.policy):
            run_out = os.path.join(out, _stem(path))
            log = open(os.path.join(out, f"{_stem(path)}.log"), "w")
            p = subprocess.Popen(_command(args, path, rate, run_out), stdout=log, stderr=subprocess.STDOUT)
            procs.append((path, p, run_out, log))
            if not args.together:
                p.wait()
        for path, p, run_out, log in procs:
            rc = p.wait()
            log.close()
            if rc != 0:
                raise CcollError(f"the {_stem(path)} run at {rate} failed (exit {rc}); log {log.name}")
            with open(os.path.join(run_out, "summary.json")) as f:
                runs[_stem(path)] = json.load(f)
    finally:
        # interrupted or failed: each ccoll.convergence child stops its own ranks and namespaces on SIGTERM
        for _, p, _, _ in procs:
            if p.poll() is None:
                p.terminate()
        for _, p, _, _ in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
    base = runs[_stem(args.baseline)]
    meta = dict(base["meta"], policies=[args.baseline, args.policy])
    pols = {k: v["policies"][k] for k, v in runs.items()}
    b, x = pols[_stem(args.baseline)]["final_val_loss"], pols[_stem(args.policy)]["final_val_loss"]
    return {"baseline": _stem(args.baseline), "meta": meta, "policies": pols, "val_delta_pct": 100 * (x - b) / b}


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    import signal

    args = _parser().parse_args(argv)
    if args.report:  # print a finished comparison again (with this version's lines), run nothing
        with open(args.report) as f:
            report = json.load(f)
        kept = {k: v for k, v in vars(args).items() if k in ("target_speedup",)}
        _print(report, argparse.Namespace(**{**report["args"], **kept}))
        return 0
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # timeout/kill unwinds and stops the runs
    try:
        return _main(args)
    except KeyboardInterrupt:
        print("interrupted: runs stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(args) -> int:
    report = {"args": vars(args), "rates": {}}
    try:
        _dp_codec(args.policy)  # fail early when the policy compresses no DP gradients
        for rate in args.rates:
            out = os.path.join(args.out, rate)
            os.makedirs(out, exist_ok=True)
            t0 = time.monotonic()
            load0 = os.getloadavg()[0]
            summary = _compare(args, rate, out)
            inrun = summary["policies"][_stem(args.policy)].get("codec_in_run")
            if args.codec_gbps is not None:
                enc, dec, source = args.codec_gbps, args.decode_gbps, "given"
            elif inrun:
                enc, dec, source = inrun["encode_gbps"], inrun["decode_gbps"], "measured in the run"
            else:
                raise CcollError(f"the {_stem(args.policy)} run timed no codec call on a host tensor; "
                                 "give --codec-gbps")
            # this machine's cores, shared by both runs' ranks (ccoll.model.fromrun: CPU test beds)
            res = cmodel.validate(summary, codec_gbps=enc, decode_gbps=dec, cores=len(os.sched_getaffinity(0)))
            report["rates"][rate] = {"validate": res, "summary": summary, "wall_s": time.monotonic() - t0,
                                     "load_average": (load0 + os.getloadavg()[0]) / 2, "codec_in_run": inrun,
                                     "codec_source": source, "encode_gbps": enc, "decode_gbps": dec or enc}
            print(f"# {rate} done in {time.monotonic() - t0:.0f} s; DP codec: encode {enc:.3f} GB/s, decode "
                  f"{(dec or enc):.3f} GB/s ({source})", flush=True)
        _print(report, args)
    except CcollError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with open(os.path.join(args.out, "shaped.json"), "w") as f:
        json.dump(report, f, indent=1)
    return 0


def _print(report: dict, args) -> None:
    name, base = _stem(args.policy), _stem(args.baseline)
    print(f"# {name} vs {base} on shaped links: dp={args.dp} tp={args.tp} pp={args.pp}, {args.layers}x{args.hidden}, "
          f"seq {args.seq_len}, micro-batch {args.micro_batch} x {args.grad_accum}, {args.steps} steps, seed {args.seed}")
    print(f"#{'rate':<8} {base + ' s/s':>12} {name + ' s/s':>12} {'measured':>9} {'predicted':>9} {'pred-meas':>9} "
          f"{'val loss delta':>14} {'load':>5} {'enc GB/s':>8} {'dec GB/s':>8}")
    for rate, r in report["rates"].items():
        pols = r["summary"]["policies"]
        e = r["validate"]["policies"][name]
        err = 100 * (e["predicted_speedup"] - e["measured_speedup"]) / e["measured_speedup"]
        dv = r["summary"]["val_delta_pct"]
        print(f" {rate:<8} {pols[base]['samples_per_s']:>12.2f} {pols[name]['samples_per_s']:>12.2f} "
              f"{e['measured_speedup']:>8.3f}x {e['predicted_speedup']:>8.3f}x {err:>+8.1f}% {dv:>+13.2f}% "
              f"{r['load_average']:>5.1f} {r['encode_gbps']:>8.3f} {r['decode_gbps']:>8.3f}")
    for rate, r in report["rates"].items():
        e = r["validate"]["policies"][name]
        b = r["validate"]["policies"][base]
        print(f"# {rate}: {base} measured step {b['measured_step_s']:.3f} s ({cmodel.format_step(b['predicted_step'])})")
        print(f"# {rate}: {name} measured step {e['measured_step_s']:.3f} s ({cmodel.format_step(e['predicted_step'])})")
        lay = cmodel.runner_layout(r["summary"]["meta"])
        node = shaped_node(e["link_gbps"])
        why = cmodel.why_line_node(lay, node, args.policy, args.target_speedup,
                                   compute_s=e["predicted_step"]["compute_s"],
                                   overlap_codec=codec_overlaps(lay.world, len(os.sched_getaffinity(0)), 2))
        print(f"# {rate}: {why}")


if __name__ == "__main__":
    sys.exit(main())
