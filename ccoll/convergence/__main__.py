"""``python -m ccoll.convergence``: train the same small GPT per policy file and seed, and compare.

Example::

    python -m ccoll.convergence            # the default comparison (make convergence): TP2 x DP2,
                                           # baseline/naive/hybrid/zhybrid x 3 seeds, verdicts
    python -m ccoll.convergence --demo --out results/demo      # baseline vs hybrid, 1 seed, a few minutes
    python -m ccoll.convergence --demo --capture results/capture   # + tensors for bench.rd
    python -m ccoll.convergence --policies configs/baseline.yaml configs/hybrid.yaml --dp 2 --pp 2 --tp 1 --steps 300

Each (policy, seed) is one run; runs with the same seed use the same initial weights and the same
batches, so only the policy differs and deltas vs baseline are paired by seed. Seeds are ``--seed``,
``--seed``+1, ... Every run also measures the loss on a held-out split of the corpus (the same fixed
batches for every run) every ``--eval-every`` steps and after the last step. The special policy name
``unpatched`` runs without ccoll installed (a reference for ``baseline.yaml``). Progress lines (step,
loss, samples/s, validation loss) go to stderr; the summary (see report.py for the verdicts) to stdout.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from ..errors import CcollError
from ..units import rate_arg
from .gpt import GPTConfig
from .report import write_all
from .runner import load_finished, run_policy

#: The default comparison (``make convergence``): TP2 x DP2 on 4 CPU ranks, so naive's int4 hits TP
#: activations (the traffic it hurts most) while DP gradients are compressed too; a 2 x 64 model and
#: 120 steps keep 4 policies x 3 seeds within ~25 minutes on 2 idle cores, and the held-out deltas of
#: paired seeds are tight enough there to separate naive from baseline (see the report's figures).
DEFAULT = dict(policies=["configs/baseline.yaml", "configs/naive.yaml", "configs/hybrid.yaml", "configs/zhybrid.yaml"],
               steps=120, dp=2, tp=2, pp=1, hidden=64, layers=2, heads=4, seq_len=64, micro_batch=4, grad_accum=2,
               seeds=3)
#: ``--demo``: the default comparison's runs for baseline and hybrid only, one seed (two runs, minutes)
DEMO = dict(DEFAULT, policies=["configs/baseline.yaml", "configs/hybrid.yaml"], seeds=1)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ccoll.convergence", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--policies", nargs="+", default=DEFAULT["policies"],
                   help="policy YAML files, one run each (the stem names the run; 'unpatched' = no ccoll)")
    p.add_argument("--demo", action="store_true",
                   help="baseline vs hybrid, one seed, otherwise the default comparison; explicit options still override")
    p.add_argument("--steps", type=int, default=None, help=f"training steps per policy (default {DEFAULT['steps']})")
    p.add_argument("--dp", type=int, default=None, help=f"data-parallel degree (default {DEFAULT['dp']})")
    p.add_argument("--tp", type=int, default=None, help=f"tensor-parallel degree (default {DEFAULT['tp']})")
    p.add_argument("--pp", type=int, default=None, help=f"pipeline-parallel degree (default {DEFAULT['pp']})")
    p.add_argument("--seed", type=int, default=1234, help="first seed (model init and batch order)")
    p.add_argument("--seeds", type=int, default=None, help=f"seeds per policy (default {DEFAULT['seeds']}; demo 1)")
    p.add_argument("--eval-every", type=int, default=None,
                   help="steps between held-out evaluations (default steps/8, at least 1; always after the last)")
    p.add_argument("--eval-batches", type=int, default=8, help="held-out micro-batches per evaluation per DP rank")
    p.add_argument("--capture", default=None, metavar="DIR",
                   help="write samples of the tensors that travel (ccoll.capture) at early/middle/late steps of "
                        "the first seed's runs, for python -m ccoll.bench.rd DIR")
    p.add_argument("--out", default="results/convergence", help="output directory")
    p.add_argument("--data", default=None, help="training text file (default: the Python stdlib's own sources)")
    p.add_argument("--netem-rate", default=None, metavar="RATE", type=rate_arg,
                   help="run ranks on shaped links via ccoll.bench.netem, e.g. 1gbit (needs root)")
    m = p.add_argument_group(f"model and batch (defaults: {DEFAULT['layers']} layers x {DEFAULT['hidden']} hidden, "
                             f"{DEFAULT['heads']} heads, {DEFAULT['seq_len']}-byte context, micro-batch "
                             f"{DEFAULT['micro_batch']} x {DEFAULT['grad_accum']})")
    m.add_argument("--hidden", type=int, default=None)
    m.add_argument("--layers", type=int, default=None)
    m.add_argument("--heads", type=int, default=None)
    m.add_argument("--seq-len", type=int, default=None)
    m.add_argument("--micro-batch", type=int, default=None, help="sequences per micro-batch per DP rank")
    m.add_argument("--grad-accum", type=int, default=None, help="micro-batches per step (pipeline depth)")
    m.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate (warm-up, cosine to 10%%)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed per policy run")
    p.add_argument("--reuse", action="store_true",
                   help="reuse finished runs found under --out that ran exactly the same spec (complete an "
                        "interrupted comparison, or combine seeds run by separate invocations)")
    return p


def _resolve(args) -> dict:
    chosen = DEMO if args.demo else DEFAULT
    defaults = {k: v for k, v in chosen.items() if k != "policies"}
    if args.demo and args.policies == _parser().get_default("policies"):
        args.policies = DEMO["policies"]
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.eval_every is None:
        args.eval_every = max(1, args.steps // 8)
    for k in ("steps", "dp", "tp", "pp", "hidden", "layers", "heads", "seq_len", "micro_batch", "grad_accum",
              "seeds", "eval_every", "eval_batches"):
        if getattr(args, k) < 1:
            raise CcollError(f"--{k.replace('_', '-')} must be >= 1, got {getattr(args, k)}")
    names = [_stem(p) for p in args.policies]
    if len(set(names)) != len(names):
        raise CcollError(f"policy file stems must be distinct (they name the runs): {names}")
    for p in args.policies:
        if p != "unpatched" and not os.path.isfile(p):
            raise CcollError(f"policy file not found: {p}")
    if args.data is not None and not os.path.isfile(args.data):
        raise CcollError(f"--data file not found: {args.data}")
    model = dict(hidden=args.hidden, layers=args.layers, heads=args.heads, seq_len=args.seq_len)
    GPTConfig(**model).check(args.tp)  # fail here, not in four rank logs
    if args.layers < args.pp:
        raise CcollError(f"--layers {args.layers} must be >= --pp {args.pp} (at least one block per stage)")
    return dict(steps=args.steps, dp=args.dp, tp=args.tp, pp=args.pp, seed=args.seed, model=model,
                micro_batch=args.micro_batch, grad_accum=args.grad_accum, lr=args.lr,
                data=os.path.abspath(args.data) if args.data else None, eval_every=args.eval_every,
                eval_batches=args.eval_batches, seeds=[args.seed + i for i in range(args.seeds)])


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        spec = _resolve(args)
    except CcollError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    # SIGTERM (timeout, job schedulers) must unwind like Ctrl-C so the runner stops the ranks it started
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return _run_all(args, spec)
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Progress:
    """Progress lines on stderr for one run: every ~10% of steps and every evaluation."""

    def __init__(self, label: str, steps: int, samples_per_step: int):
        self.label, self.steps, self.samples_per_step = label, steps, samples_per_step
        self.every = max(1, steps // 10)

    def __call__(self, step, loss, seconds) -> None:
        if step == "eval":
            print(f"{self.label} step {loss}/{self.steps} held-out loss {seconds:.4f}", file=sys.stderr, flush=True)
        elif (step + 1) % self.every == 0 or step == 0:
            rate = self.samples_per_step / seconds if seconds > 0 else float("nan")
            print(f"{self.label} step {step + 1}/{self.steps} loss {loss:.4f} samples/s {rate:.1f}",
                  file=sys.stderr, flush=True)


def _run_all(args, spec: dict) -> int:
    results = []
    t_all = time.monotonic()
    seeds = spec["seeds"]
    total, done = len(seeds) * len(args.policies), 0
    global_batch = spec["micro_batch"] * spec["grad_accum"] * spec["dp"]
    try:
        for i, seed in enumerate(seeds):  # seed-major: an interrupted comparison still has complete seeds
            for path in args.policies:
                name = _stem(path)
                done += 1
                run_spec = dict(spec, seed=seed, policy=None if path == "unpatched" else os.path.abspath(path))
                if args.capture and i == 0:
                    steps = spec["steps"]
                    run_spec.update(capture=os.path.abspath(os.path.join(args.capture, name)),
                                    capture_steps=sorted({min(1, steps - 1), steps // 2, steps - 1}))
                label = f"[{done}/{total} {name} seed={seed}]"
                run_dir = os.path.join(args.out, "runs", name, f"seed{seed}")
                done_before = load_finished(name, run_spec, run_dir) if args.reuse else None
                if done_before is not None:
                    print(f"{label} reused: {run_dir}", file=sys.stderr, flush=True)
                    results.append(done_before)
                    continue
                results.append(run_policy(name, run_spec, run_dir, on_step=_Progress(label, spec["steps"], global_batch),
                                          timeout_s=args.timeout, netem_rate=args.netem_rate))
    except CcollError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: ranks stopped", file=sys.stderr)
        return 130
    meta = dict(spec, policies=args.policies, global_batch=global_batch,
                data=spec["data"] or "python stdlib sources", netem_rate=args.netem_rate,
                wall_seconds=time.monotonic() - t_all, capture=args.capture)
    write_all(results, args.out, meta)
    with open(os.path.join(args.out, "summary.md")) as f:
        print(f.read())
    if args.demo:
        _print_buys(args.out)
    print(f"plot: {os.path.join(args.out, 'loss.png')}   summary: {os.path.join(args.out, 'summary.json')}")
    return 0


def _print_buys(out: str) -> None:
    """After the loss comparison: what the policy would buy on named clusters (ccoll.model.buys)."""
    import json

    from ..model.buys import print_buys

    with open(os.path.join(out, "summary.json")) as f:
        print_buys(json.load(f))


if __name__ == "__main__":
    sys.exit(main())
