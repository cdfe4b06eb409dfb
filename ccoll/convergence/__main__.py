"""``python -m ccoll.convergence``: train the same small GPT once per policy file and compare.

Example::

    python -m ccoll.convergence --policies configs/baseline.yaml configs/hybrid.yaml --steps 300 --out results/cmp
    python -m ccoll.convergence --demo --out results/demo      # baseline vs hybrid, a few minutes on 2 cores

Every run uses the same seed, initial weights and batches; only the policy differs. The special policy
name ``unpatched`` runs without ccoll installed (a reference for ``baseline.yaml``).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from ..errors import CcollError
from .model import GPTConfig
from .report import write_all
from .runner import run_policy

DEMO = dict(policies=["configs/baseline.yaml", "configs/hybrid.yaml"], steps=120, hidden=64, layers=2, heads=4,
            seq_len=64, micro_batch=4, grad_accum=2)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ccoll.convergence", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--policies", nargs="+", default=["configs/baseline.yaml", "configs/naive.yaml", "configs/hybrid.yaml"],
                   help="policy YAML files, one run each (the stem names the run; 'unpatched' = no ccoll)")
    p.add_argument("--demo", action="store_true",
                   help=f"short baseline-vs-hybrid comparison ({DEMO['steps']} steps, {DEMO['layers']}x{DEMO['hidden']} model); "
                        "explicit options still override")
    p.add_argument("--steps", type=int, default=None, help="training steps per policy (default 400; demo 120)")
    p.add_argument("--dp", type=int, default=2, help="data-parallel degree")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    p.add_argument("--pp", type=int, default=2, help="pipeline-parallel degree")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", default="results/convergence", help="output directory")
    p.add_argument("--data", default=None, help="training text file (default: the Python stdlib's own sources)")
    p.add_argument("--netem-rate", default=None, metavar="RATE",
                   help="run ranks on shaped links via ccoll.bench.netem, e.g. 1gbit (needs root)")
    m = p.add_argument_group("model and batch (defaults: 4 layers x 128 hidden, 4 heads, 128-byte context, micro-batch 4 x 2)")
    m.add_argument("--hidden", type=int, default=None)
    m.add_argument("--layers", type=int, default=None)
    m.add_argument("--heads", type=int, default=None)
    m.add_argument("--seq-len", type=int, default=None)
    m.add_argument("--micro-batch", type=int, default=None, help="sequences per micro-batch per DP rank")
    m.add_argument("--grad-accum", type=int, default=None, help="micro-batches per step (pipeline depth)")
    m.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate (warm-up, cosine to 10%%)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed per policy run")
    return p


def _resolve(args) -> dict:
    defaults = dict(steps=400, hidden=128, layers=4, heads=4, seq_len=128, micro_batch=4, grad_accum=2)
    if args.demo:
        defaults.update({k: v for k, v in DEMO.items() if k != "policies"})
        if args.policies == _parser().get_default("policies"):
            args.policies = DEMO["policies"]
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    for k in ("steps", "dp", "tp", "pp", "hidden", "layers", "heads", "seq_len", "micro_batch", "grad_accum"):
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
                data=os.path.abspath(args.data) if args.data else None)


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
    from tqdm import tqdm

    # SIGTERM (timeout, job schedulers) must unwind like Ctrl-C so the runner stops the ranks it started
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return _run_all(args, spec, tqdm)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_all(args, spec: dict, tqdm) -> int:
    results = []
    t_all = time.monotonic()
    try:
        for path in args.policies:
            name = _stem(path)
            run_spec = dict(spec, policy=None if path == "unpatched" else os.path.abspath(path))
            with tqdm(total=spec["steps"], desc=f"{name:>12}", unit="step", dynamic_ncols=True) as bar:
                def on_step(step, loss, bar=bar):
                    bar.update(step + 1 - bar.n)
                    bar.set_postfix(loss=f"{loss:.3f}")
                results.append(run_policy(name, run_spec, os.path.join(args.out, "runs", name), on_step=on_step,
                                          timeout_s=args.timeout, netem_rate=args.netem_rate))
    except CcollError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: ranks stopped", file=sys.stderr)
        return 130
    meta = dict(spec, policies=args.policies, global_batch=spec["micro_batch"] * spec["grad_accum"] * spec["dp"],
                data=spec["data"] or "python stdlib sources", netem_rate=args.netem_rate,
                wall_seconds=time.monotonic() - t_all)
    write_all(results, args.out, meta)
    with open(os.path.join(args.out, "summary.md")) as f:
        print(f.read())
    print(f"plot: {os.path.join(args.out, 'loss.png')}   summary: {os.path.join(args.out, 'summary.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
