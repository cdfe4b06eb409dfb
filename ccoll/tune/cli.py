"""``python -m ccoll.tune``'s command line: options, checks before any rank starts, and local ranks."""
from __future__ import annotations

import argparse
import os
import sys

from .. import launch
from ..bench import harness
from ..bench.harness import BenchError, size_sweep, split_codecs
from ..units import nbytes_arg, nbytes_list_arg, parse_nbytes
from .options import DEFAULT_CODECS, DEFAULT_DIMS, DEFAULT_OPS, DIM_OPS, POLICY_OPS
from .run import STATS, _resolve, run_rank


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
    p = argparse.ArgumentParser(prog="python -m ccoll.tune", description=sys.modules[__package__].__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="tuned.yaml", help="the policy to write (default tuned.yaml)")
    p.add_argument("--json", default=None, metavar="PATH", help="raw table (default: --out with .json)")
    p.add_argument("--ops", default=DEFAULT_OPS, help=f"harness collectives to tune (default {DEFAULT_OPS})")
    p.add_argument("--dims", default=DEFAULT_DIMS, help=f"dimensions to write rules for (default {DEFAULT_DIMS})")
    p.add_argument("--codecs", default=DEFAULT_CODECS, help=f"candidates, native included (default {DEFAULT_CODECS})")
    p.add_argument("--transports", default="torch", help="torch, or torch,mpi (under mpirun; default torch)")
    p.add_argument("-b", "--minbytes", type=nbytes_arg, default=parse_nbytes("64K"))
    p.add_argument("-e", "--maxbytes", type=nbytes_arg, default=parse_nbytes("64M"))
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("--sizes", default=None, type=nbytes_list_arg,
                   help="explicit comma list of sizes instead of -b/-e/-f (e.g. 64K,1M,8M,64M)")
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
        args.sizes = sorted(set(args.sizes)) if args.sizes else None
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
    except (BenchError, launch.LaunchError) as e:
        print(f"ccoll.tune: error: {e}", file=sys.stderr)
        return 2


def _launch(args, argv: list[str]) -> int:
    """``--np`` local ranks running this same command line (under mpiexec when ``--transports`` has mpi)."""
    return launch.run_local([sys.executable, "-m", "ccoll.tune", *argv], args.np, mpi="mpi" in args.transports,
                            timeout_s=args.timeout)
