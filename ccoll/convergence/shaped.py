"""``python -m ccoll.convergence.shaped``: baseline vs a policy on shaped links, measured and predicted.

Why: a speedup measured on one machine is only worth something if the model that explains it also
predicts it; and the model (ccoll.model) is only worth something if it predicts what was measured.
This tool does both in one run, per link rate:

1. measures the policy's DP codec throughput on this CPU (``ccoll.model.measure_codec_gbps``: encode with
   error feedback + decode, in as many processes at once as there are ranks, so the figure includes the
   CPU sharing the ranks see);
2. trains baseline and the policy on the same seed on ranks in network namespaces behind ``--rate``
   links (``ccoll.bench.netem`` via ``ccoll.convergence``; needs root), with a model large enough that DP
   gradients dominate the traffic;
3. predicts the policy's speedup with ``ccoll.model.validate``: compute = the baseline's measured step
   time minus the model's baseline link time at that rate, then compute + wire + codec for the policy;
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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ccoll.convergence.shaped", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rates", nargs="+", default=["1gbit", "100mbit"], help="netem link rates, one comparison each")
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
                   help="DP codec encode throughput, GB/s (default: measured on this CPU now)")
    p.add_argument("--decode-gbps", type=float, default=None, help="decode throughput (default: measured)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per run")
    p.add_argument("--out", default="results/shaped")
    return p


def _dp_codec(policy: str) -> str:
    from ..policy import load
    import torch

    codec = load(policy).resolve("dp", "all_reduce", (1 << 20, torch.float32), step=10**9)
    if codec is None:
        raise CcollError(f"{policy}: DP gradients are not compressed; nothing to compare")
    return codec.spec


def main(argv: list[str] | None = None) -> int:
    from .__main__ import main as convergence_main

    args = _parser().parse_args(argv)
    world = args.dp * args.tp * args.pp
    os.makedirs(args.out, exist_ok=True)
    report = {"args": vars(args), "rates": {}}
    try:
        spec = _dp_codec(args.policy)
        if args.codec_gbps is None:
            m = cmodel.measure_codec_gbps(spec, procs=world)
            enc, dec = m["encode_gbps"], m["decode_gbps"]
            report["codec"] = m
            how = f"measured now in {world} processes at once (median)"
        else:
            enc, dec = args.codec_gbps, args.decode_gbps
            how = "given"
        print(f"# codec {spec}: encode {enc:.3f} GB/s, decode {(dec or enc):.3f} GB/s ({how}); "
              f"load average {os.getloadavg()[0]:.1f}", flush=True)
        for rate in args.rates:
            out = os.path.join(args.out, rate)
            t0 = time.monotonic()
            rc = convergence_main([
                "--policies", args.baseline, args.policy, "--netem-rate", rate, "--seeds", "1", "--seed", str(args.seed),
                "--steps", str(args.steps), "--dp", str(args.dp), "--tp", str(args.tp), "--pp", str(args.pp),
                "--hidden", str(args.hidden), "--layers", str(args.layers), "--heads", str(args.heads),
                "--seq-len", str(args.seq_len), "--micro-batch", str(args.micro_batch), "--grad-accum",
                str(args.grad_accum), "--eval-every", str(args.steps), "--timeout", str(args.timeout), "--out", out])
            if rc != 0:
                print(f"error: the runs at {rate} failed (exit {rc}); logs under {out}", file=sys.stderr)
                return rc
            with open(os.path.join(out, "summary.json")) as f:
                summary = json.load(f)
            res = cmodel.validate(summary, codec_gbps=enc, decode_gbps=dec)
            report["rates"][rate] = {"validate": res, "summary_policies": summary["policies"],
                                     "wall_s": time.monotonic() - t0, "load_average": os.getloadavg()[0]}
        _print(report, args)
    except CcollError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with open(os.path.join(args.out, "shaped.json"), "w") as f:
        json.dump(report, f, indent=1)
    return 0


def _print(report: dict, args) -> None:
    name = os.path.splitext(os.path.basename(args.policy))[0]
    base = os.path.splitext(os.path.basename(args.baseline))[0]
    print(f"# {name} vs {base} on shaped links: dp={args.dp} tp={args.tp} pp={args.pp}, {args.layers}x{args.hidden}, "
          f"seq {args.seq_len}, micro-batch {args.micro_batch} x {args.grad_accum}, {args.steps} steps, seed {args.seed}")
    print(f"#{'rate':<8} {base + ' s/s':>12} {name + ' s/s':>12} {'measured':>9} {'predicted':>9} {'pred-meas':>9} "
          f"{'val loss delta':>14} {'load':>5}")
    for rate, r in report["rates"].items():
        pols = r["summary_policies"]
        e = r["validate"]["policies"][name]
        err = 100 * (e["predicted_speedup"] - e["measured_speedup"]) / e["measured_speedup"]
        dv = pols[name]["delta_val_pct"]["mean"]
        print(f" {rate:<8} {pols[base]['samples_per_s']:>12.2f} {pols[name]['samples_per_s']:>12.2f} "
              f"{e['measured_speedup']:>8.3f}x {e['predicted_speedup']:>8.3f}x {err:>+8.1f}% {dv:>+13.2f}% "
              f"{r['load_average']:>5.1f}")
    for rate, r in report["rates"].items():
        e = r["validate"]["policies"][name]
        b = r["validate"]["policies"][base]
        print(f"# {rate}: {base} measured step {b['measured_step_s']:.3f} s ({cmodel.format_step(b['predicted_step'])})")
        print(f"# {rate}: {name} measured step {e['measured_step_s']:.3f} s ({cmodel.format_step(e['predicted_step'])})")


if __name__ == "__main__":
    sys.exit(main())
