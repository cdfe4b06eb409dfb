"""ccoll's DDP hook against torch's own DDP comm hooks: the same model, seed and data, step time, wire
ratio, held-out loss and the wall time to a target loss.

    python -m ccoll.bench.hooks [--ranks 2] [--size-mb 20] [--bucket-mb 25] [--ccoll-bucket-mb B] [--steps 30]
        [--target-step N] [--max-steps M] [--rounds 2] [--hooks none,fp16,bf16,powersgd,batched_powersgd]
        [--powersgd-ranks 1,4] [--batched-ranks 1] [--codecs int8:block=64 int4:block=64] [--policy hybrid]
        [--rate 100mbit [--delay 1ms]] [--json out.json] [--plot out.png]

What runs: ``--ranks`` gloo ranks (on loopback by default, started by :func:`ccoll.launch.run_gloo`; with
``--rate``, one rank per network namespace behind shaped links, :mod:`ccoll.bench.netem`, as root) train one
model per variant with torch's ``DistributedDataParallel``:

- ``none``: DDP's built-in all_reduce (no hook); ``fp16`` / ``bf16``: torch's ``fp16_compress_hook`` /
  ``bf16_compress_hook`` (the latter through a wrapper: DDP refuses it by name without NCCL);
  ``powersgd`` (one variant per ``--powersgd-ranks`` rank) and ``batched_powersgd``
  (per ``--batched-ranks``): torch's ``powerSGD_hook`` / ``batched_powerSGD_hook`` with
  ``PowerSGDState(matrix_approximation_rank=r, start_powerSGD_iter=--powersgd-start)`` and torch's other
  defaults (error feedback, warm start, ``min_compression_rate`` 2); the batched hook with a fix for torch
  2.13 (:func:`_batched_orthogonalize_fixed`);
- ``ccoll <codec>`` per ``--codecs``: :class:`ccoll.ddp.CompressionState` (error feedback on, ``min_bytes``
  its default unless ``--min-bytes``) with :func:`ccoll.ddp.compress_hook`;
- ``policy <name>`` per ``--policy``: no hook registered; the model is built and trained inside
  ``ccoll.patch.installed(policy)``, so ccoll attaches itself as under ``ccoll-run`` (zero code).

DDP's ``bucket_cap_mb`` is ``--bucket-mb`` (default torch's 25: the 20 MiB model is one bucket) for every
variant, except that ``--ccoll-bucket-mb`` (default: ``--bucket-mb``) sets it for the ccoll and policy variants
alone. Why two: torch's PowerSGD hook on gloo aborts once the model has several buckets (torch 2.13,
``--bucket-mb 6``, loopback and shaped links: ``gloo::EnforceNotMet`` "Received data size doesn't match
expected size", a collective mismatch between the ranks), so the torch variants keep one bucket. ccoll's hook
does host work per bucket (packing, error feedback, encoding) before its first byte is sent, and on two ranks
a bucket goes out in one exchange per segment (8 MiB, :mod:`ccoll.collectives.segments`) that do not hold up
DDP's backward, so smaller buckets let that work and the wire overlap the backward and each other.
The bucket sizes used are in the header and the JSON's meta.

The model: an MLP (128 inputs, four hidden layers of width H, 128 classes) with H, a multiple of 64,
chosen so its fp32 gradients come closest to ``--size-mb`` MiB; He-initialised, trained with SGD (momentum
0.9, ``--lr``) on a Gaussian mixture of 128 classes (:func:`make_data`), 32 samples per rank and step. Every
variant of every round starts from the same weights (``--seed``) and sees the same batches (per rank and
step); the held-out set is the same 512 samples on every rank.

Rounds are interleaved: round r runs every variant once, in the variant order (none first) rotated by r,
so drift in the machine's load hits every variant alike.

Reported per variant (the table; ``--json`` has every run's curves too):

- ``s/step``: median over rounds of the run's median step time (steps 2..S; step 1 builds DDP's buckets
  and hooks' state), rank 0's clock: zero_grad, forward, backward (DDP's communication), optimizer step;
- ``speedup``: the none variant's s/step over this one's;
- ``wire``: bytes a native all_reduce would send for the step (the model's fp32 gradient bytes) over the
  bytes the variant sent, in its last step (steady state, past any warm-up); ``wire_ratio_run`` in the JSON
  is the same over all S steps. Sent bytes: none = the gradient bytes; fp16/bf16 hooks = half of them
  (the whole bucket travels as 16-bit values); PowerSGD = 4 bytes x the elements its state counts after
  compression (``total_numel_after_compression``: P and Q of each compressed matrix, plus the tensors it
  all-reduces uncompressed), a vanilla all_reduce before ``start_powerSGD_iter``; ccoll = the wire bytes
  ``ccoll.stats`` recorded under dimension ``dp`` (native calls included at their size);
- ``held-out``: the held-out loss (mean cross-entropy) after the last step, round 1, and its difference to
  none's;
- ``to target`` (time to target loss): the target is the none variant's held-out loss after step N
  (``--target-step``, default 3/4 of ``--steps`` rounded down) in the same round. A run's wall time at step
  k is the sum of its step times for steps 1..k (rank 0's clock; the held-out evaluation after each step,
  and before step 1, and the barrier that follows each are excluded). With k the first step whose
  held-out loss is <= the target, the time to target is where the straight line between (wall time at
  step k-1, loss after step k-1) and (wall time at step k, loss after step k) crosses the target (step 0:
  wall time 0, the initial loss), so a loss that misses the target by 1e-5 at one step does not cost a
  whole step (:func:`time_to_target`); median over rounds, "-" when a round never reaches it; ``@k``: that
  step, round 1. A run that has not reached the target after S steps goes on until it does or until
  ``--max-steps`` (default 2S): a variant that is cheap per step but slower per step to converge (PowerSGD)
  gets its chance. Those extra steps count for this column only (s/step, wire and held-out are of steps
  1..S). The none variant runs first in round 1, so every later run knows the target (none's runs are
  bit-identical from round to round: same seed, same data, gloo's sums of two ranks).

Also: the machine's load average (``os.getloadavg``) at start and end, in the header and the JSON; a
PNG (``--plot``): held-out loss against that wall time, one curve per variant (round 1), the target
drawn. Bad arguments: one line on stderr, exit status 2.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, NoReturn

PROG = "python -m ccoll.bench.hooks"
TORCH_HOOKS = ("none", "fp16", "bf16", "powersgd", "batched_powersgd")
IN_DIM = 128
CLASSES = 128
HIDDEN_LAYERS = 4
HELDOUT = 512
BATCH = 32


@dataclass(frozen=True)
class Variant:
    """One way of averaging gradients: ``kind`` in TORCH_HOOKS or "ccoll" / "policy"; ``arg``: the
    PowerSGD rank, the codec spec or the policy name."""

    kind: str
    arg: Any = None

    @property
    def name(self) -> str:
        if self.kind in ("powersgd", "batched_powersgd"):
            return f"{self.kind} r{self.arg}"
        if self.kind in ("ccoll", "policy"):
            return f"{self.kind} {self.arg}"
        return self.kind


# --- command line -----------------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        _fail(message)


def _fail(message: str) -> NoReturn:
    print(f"ccoll.bench.hooks: error: {message}", file=sys.stderr)
    sys.exit(2)


def _ints(text: str) -> list[int]:
    try:
        out = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    return out


def _names(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from ..units import rate_arg

    ap = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2, help="gloo ranks (default 2)")
    ap.add_argument("--size-mb", type=float, default=20.0, help="fp32 gradient MiB of the model (default 20)")
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb (default torch's 25)")
    ap.add_argument("--ccoll-bucket-mb", type=float, default=None,
                    help="DDP bucket_cap_mb of the ccoll and policy variants only (default --bucket-mb)")
    ap.add_argument("--steps", type=int, default=30, help="training steps per run (default 30)")
    ap.add_argument("--target-step", type=int, default=None,
                    help="N: the target is none's held-out loss after step N (default 3/4 of --steps)")
    ap.add_argument("--max-steps", type=int, default=None,
                    help="a run that has not reached the target after --steps goes on until it does or until "
                         "this step (default 2 x --steps)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    ap.add_argument("--hooks", type=_names, default=list(TORCH_HOOKS),
                    help=f"torch variants, among {','.join(TORCH_HOOKS)} (none is the reference: required)")
    ap.add_argument("--powersgd-ranks", type=_ints, default=[1, 4], help="PowerSGD ranks (default 1,4)")
    ap.add_argument("--batched-ranks", type=_ints, default=[1], help="batched PowerSGD ranks (default 1)")
    ap.add_argument("--powersgd-start", type=int, default=2,
                    help="PowerSGD's start_powerSGD_iter (default 2, torch's minimum with error feedback)")
    ap.add_argument("--codecs", nargs="*", default=["int8:block=64", "int4:block=64"],
                    help="ccoll DDP hook codecs, space-separated specs (default int8:block=64 int4:block=64)")
    ap.add_argument("--policy", nargs="*", default=[], help="policies (name or YAML) trained under ccoll.patch")
    ap.add_argument("--min-bytes", type=int, default=None, help="ccoll hook's min_bytes (default ccoll's)")
    ap.add_argument("--lr", type=float, default=0.02, help="SGD learning rate (default 0.02)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--rate", type=rate_arg, default=None, help="shaped links of this rate (tc units: 100mbit, "
                                                                  "1gbit; needs root); default loopback")
    ap.add_argument("--delay", default=None, help="one-way latency per shaped link (e.g. 1ms)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--plot", default=None, help="write held-out loss vs wall time here (PNG)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds for the whole measurement")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # a rank on shaped links
    args = ap.parse_args(argv)
    if args.worker:
        return args
    if args.ranks < 2:
        _fail(f"--ranks must be at least 2, got {args.ranks}")
    if args.ccoll_bucket_mb is None:
        args.ccoll_bucket_mb = args.bucket_mb
    if not args.size_mb > 0 or not args.bucket_mb > 0 or not args.ccoll_bucket_mb > 0:
        _fail("--size-mb, --bucket-mb and --ccoll-bucket-mb must be positive")
    if args.steps < 1 or args.rounds < 1:
        _fail(f"--steps and --rounds must be at least 1, got {args.steps} and {args.rounds}")
    if args.target_step is None:
        args.target_step = max(1, args.steps * 3 // 4)
    if not 1 <= args.target_step <= args.steps:
        _fail(f"--target-step must be within 1..--steps ({args.steps}), got {args.target_step}")
    if args.max_steps is None:
        args.max_steps = 2 * args.steps
    if args.max_steps < args.steps:
        _fail(f"--max-steps must be at least --steps ({args.steps}), got {args.max_steps}")
    bad = [h for h in args.hooks if h not in TORCH_HOOKS]
    if bad:
        _fail(f"unknown --hooks {','.join(bad)}; choose among {','.join(TORCH_HOOKS)}")
    if "none" not in args.hooks:
        _fail("--hooks must include none: its loss at --target-step is the target")
    if any(r < 1 for r in args.powersgd_ranks + args.batched_ranks):
        _fail("PowerSGD ranks must be at least 1")
    if args.powersgd_start < 2:
        _fail(f"--powersgd-start must be at least 2 (torch's minimum with error feedback), got {args.powersgd_start}")
    if args.min_bytes is not None and args.min_bytes < 0:
        _fail(f"--min-bytes must be >= 0, got {args.min_bytes}")
    if not args.lr > 0:
        _fail(f"--lr must be positive, got {args.lr}")
    if args.delay is not None and args.rate is None:
        _fail("--delay needs --rate (shaped links)")
    from ..errors import CcollError

    try:
        from ..codecs import get_codec
        from ..policy import load

        for spec in args.codecs:
            get_codec(spec)
        for pol in args.policy:
            load(pol)
        if args.rate is not None:
            from .netem import _check_environment, check_delay

            _check_environment()
            if args.delay is not None:
                check_delay(args.delay)
    except CcollError as e:
        _fail(str(e).splitlines()[0])
    if not variants(args):
        _fail("nothing to compare")
    return args


def variants(args: argparse.Namespace) -> list[Variant]:
    out: list[Variant] = []
    for h in args.hooks:
        if h == "powersgd":
            out += [Variant(h, r) for r in args.powersgd_ranks]
        elif h == "batched_powersgd":
            out += [Variant(h, r) for r in args.batched_ranks]
        else:
            out.append(Variant(h))
    out += [Variant("ccoll", c) for c in args.codecs]
    out += [Variant("policy", p) for p in args.policy]
    # none first: round 1 runs it first, so the target is known to every run after it
    out.sort(key=lambda v: v.kind != "none")
    return list(dict.fromkeys(out))


# --- the model and the data -------------------------------------------------------------------------------

def hidden_width(size_mb: float) -> int:
    """The hidden width (a multiple of 64) whose model's parameter bytes come closest to ``size_mb`` MiB."""
    want = size_mb * (1 << 20) / 4
    best = min(range(64, 1 << 16, 64), key=lambda h: abs(n_params(h) - want))
    return best


def n_params(h: int) -> int:
    return (IN_DIM * h + h) + (HIDDEN_LAYERS - 1) * (h * h + h) + (h * CLASSES + CLASSES)


def build_model(h: int):
    import torch.nn as nn

    layers: list = [nn.Linear(IN_DIM, h), nn.ReLU()]
    for _ in range(HIDDEN_LAYERS - 1):
        layers += [nn.Linear(h, h), nn.ReLU()]
    layers.append(nn.Linear(h, CLASSES))
    model = nn.Sequential(*layers)
    # He initialisation (torch's default init shrinks the signal through four ReLU layers and the loss
    # would barely move in tens of steps); a small output layer, zero biases
    for m in model:
        if isinstance(m, nn.Linear):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            nn.init.zeros_(m.bias)
    nn.init.normal_(model[-1].weight, std=1 / math.sqrt(h))
    return model


def make_data(cfg: dict, rank: int):
    """(per-step training batches of this rank, the held-out set): the same in every variant and round.
    A Gaussian mixture: class c's inputs are ``mu_c + N(0, I)``, ``mu_c ~ N(0, I)`` fixed by the seed, so
    the classes overlap and the loss falls steadily over tens of steps instead of at once."""
    import torch

    g = torch.Generator().manual_seed(cfg["seed"] + 7919)
    centers = torch.randn(CLASSES, IN_DIM, generator=g)

    def sample(n: int, gen):
        y = torch.randint(0, CLASSES, (n,), generator=gen)
        return centers[y] + torch.randn(n, IN_DIM, generator=gen), y

    batches = [sample(BATCH, torch.Generator().manual_seed(cfg["seed"] * 1_000_003 + step * 1009 + rank))
               for step in range(cfg["max_steps"])]
    return batches, sample(HELDOUT, torch.Generator().manual_seed(cfg["seed"] + 104729))


# --- one rank ---------------------------------------------------------------------------------------------

class _Sent:
    """Bytes a variant sent per step, from what its hook's state counts (see the module docstring)."""

    def __init__(self, v: Variant, grad_bytes: int, state: Any):
        self.v, self.grad_bytes, self.state = v, grad_bytes, state
        self.last = self._count()

    def _count(self) -> int:
        if self.v.kind in ("powersgd", "batched_powersgd"):
            return self.state.total_numel_after_compression * 4
        if self.v.kind in ("ccoll", "policy"):
            from ..stats import by_dimension

            return by_dimension().get("dp", {}).get("wire_bytes", 0)
        return 0

    def step(self) -> int:
        now = self._count()
        delta, self.last = now - self.last, now
        if self.v.kind in ("fp16", "bf16"):
            return self.grad_bytes // 2
        if self.v.kind in ("powersgd", "batched_powersgd") and delta == 0:
            return self.grad_bytes  # before start_powerSGD_iter: a vanilla all_reduce
        if self.v.kind == "none":
            return self.grad_bytes
        return delta


def _bf16_compress_hook(state, bucket):
    """torch's ``bf16_compress_hook``, called as is. DDP refuses a hook of that name unless CUDA's NCCL is
    2.10+ (``_check_comm_hook``), a check for NCCL's bf16 support that gloo, which reduces bf16 on the CPU,
    does not need."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.bf16_compress_hook(state, bucket)


@contextlib.contextmanager
def _batched_orthogonalize_fixed():
    """Within: torch's ``batched_powerSGD_hook`` runs. In torch 2.13 it hands ``_orthogonalize`` its one Q
    matrix as a 2-D tensor, which ``_orthogonalize`` (written for a batch of matrices) rejects with an
    AssertionError at the first compressed step; here it gets a batch of one (a view: orthogonalised in
    place as before). powerSGD_hook's 3-D calls pass through unchanged."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    orig = psgd._orthogonalize

    def orthogonalize(matrices, epsilon=0):
        return orig(matrices.unsqueeze(0) if matrices.dim() == 2 else matrices, epsilon=epsilon)

    psgd._orthogonalize = orthogonalize
    try:
        yield
    finally:
        psgd._orthogonalize = orig


def _digest(model) -> str:
    h = hashlib.sha1()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _run_variant(v: Variant, cfg: dict, batches, heldout, target: float | None) -> dict:
    """``cfg["steps"]`` steps of ``v``, then more (up to ``cfg["max_steps"]``) while the held-out loss has not
    reached ``target`` (None: stop at ``cfg["steps"]``)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..callctx import internal

    ctx = contextlib.nullcontext()
    if v.kind == "policy":
        from ..patch import installed

        ctx = installed(v.arg)
    elif v.kind == "batched_powersgd":
        ctx = _batched_orthogonalize_fixed()
    with ctx:
        torch.manual_seed(cfg["seed"])
        model = build_model(cfg["hidden"])
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        bucket_mb = cfg["ccoll_bucket_mb"] if v.kind in ("ccoll", "policy") else cfg["bucket_mb"]
        ddp = DDP(model, bucket_cap_mb=bucket_mb, init_sync=False)
        state = None
        if v.kind in ("fp16", "bf16"):
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hook = default_hooks.fp16_compress_hook if v.kind == "fp16" else _bf16_compress_hook
            ddp.register_comm_hook(None, hook)
        elif v.kind in ("powersgd", "batched_powersgd"):
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

            state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=v.arg,
                                       start_powerSGD_iter=cfg["powersgd_start"])
            ddp.register_comm_hook(state, psgd.powerSGD_hook if v.kind == "powersgd" else psgd.batched_powerSGD_hook)
        elif v.kind == "ccoll":
            from ..ddp import CompressionState, compress_hook

            kw = {} if cfg["min_bytes"] is None else {"min_bytes": cfg["min_bytes"]}
            ddp.register_comm_hook(CompressionState(codec=v.arg, model=ddp, **kw), compress_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=cfg["lr"], momentum=0.9)
        sent = _Sent(v, grad_bytes, state)
        xh, yh = heldout
        times, train, held, sent_bytes = [], [], [], []
        with torch.no_grad():
            held0 = float(F.cross_entropy(model(xh), yh))
        dist.barrier()
        reached = False
        for step, (x, y) in enumerate(batches):
            if step >= cfg["steps"] and (target is None or reached):
                break
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            train.append(float(loss.detach()))
            sent_bytes.append(sent.step())
            with torch.no_grad():
                held.append(float(F.cross_entropy(model(xh), yh)))
            # every rank goes on alike (replicas are equal, but a disagreement would hang the next step); a
            # sync point too: the evaluation's skew between ranks stays out of the next step's clock.
            # internal(): under ccoll.patch this all_reduce is not counted as the variant's traffic.
            flag = torch.tensor([float(target is not None and held[-1] <= target)])
            with internal():
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            reached = reached or bool(flag.item())
        digest = _digest(model)
        del ddp, opt
    return {"variant": v.name, "grad_bytes": grad_bytes, "step_s": times, "train_loss": train, "heldout_loss": held,
            "heldout_loss_initial": held0, "sent_bytes": sent_bytes, "digest": digest}


def rank_main(rank: int, world: int, cfg: dict) -> list[dict] | None:
    """Every round, every variant (rotated order) on this rank; rank 0's runs (others: None)."""
    import gc

    import torch

    torch.set_num_threads(1)
    batches, heldout = make_data(cfg, rank)
    vs = [Variant(k, a) for k, a in cfg["variants"]]
    runs = []
    target = None  # none's held-out loss at the target step, from round 1 (none runs first there)
    for r in range(cfg["rounds"]):
        k = r % len(vs)
        for v in vs[k:] + vs[:k]:
            run = _run_variant(v, cfg, batches, heldout, target)
            run["round"] = r
            if v.kind == "none" and target is None:
                target = run["heldout_loss"][cfg["target_step"] - 1]
            runs.append(run)
            gc.collect()
            if rank == 0:
                print(f"# round {r + 1}/{cfg['rounds']} {v.name}: {statistics.median(_timed(run['step_s'], cfg['steps'])):.3f} "
                      f"s/step, held-out loss {run['heldout_loss'][cfg['steps'] - 1]:.4f} after step {cfg['steps']}, "
                      f"{len(run['step_s'])} steps, load {os.getloadavg()[0]:.1f}",
                      file=sys.stderr, flush=True)
    return runs if rank == 0 else None


def _timed(step_s: list[float], steps: int) -> list[float]:
    """The step times s/step is the median of: steps 2..``steps``."""
    return step_s[1:steps] if steps > 1 else step_s[:1]


def _worker(cfg_path: str) -> int:
    """One rank on shaped links (env:// from :mod:`ccoll.bench.netem`); rank 0 writes the runs."""
    import torch.distributed as dist

    with open(cfg_path) as f:
        cfg = json.load(f)
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=cfg["timeout"]))
    runs = rank_main(dist.get_rank(), dist.get_world_size(), cfg)
    if runs is not None:
        with open(cfg["out"], "w") as f:
            json.dump(runs, f)
    return 0


def _shaped(cfg: dict, rate: str, delay: str | None) -> tuple[list[dict], str]:
    from ..errors import BenchError
    from .netem import ShapedLinks, run_on_links

    links = ShapedLinks(cfg["ranks"], rate, delay, tag=f"{os.getpid()}h")
    with tempfile.TemporaryDirectory(prefix="ccoll-hooks-") as d:
        cfg = dict(cfg, out=os.path.join(d, "runs.json"))
        path = os.path.join(d, "cfg.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        cmd = [sys.executable, "-m", "ccoll.bench.hooks", "--worker", path]
        status = run_on_links(links, links, cmd, 29500, cfg["timeout"], prog="hooks", out=sys.stderr)
        if status != 0:
            raise BenchError(f"the ranks on shaped links failed (exit status {status})")
        with open(cfg["out"]) as f:
            return json.load(f), links.describe()


# --- the report -------------------------------------------------------------------------------------------

def time_to_target(step_s: list[float], initial: float, losses: list[float], target: float) -> tuple | None:
    """(seconds, step) at which the held-out loss first reaches ``target``, or None: ``step`` is the first
    k with ``losses[k-1] <= target``; the time is where the straight line from (wall time at step k-1, its
    loss) to (wall time at step k, its loss) crosses the target, wall time at step 0 being 0 with the
    initial loss."""
    wall, prev_wall, prev_loss = 0.0, 0.0, initial
    if initial <= target:
        return 0.0, 0
    for k, (dt, loss) in enumerate(zip(step_s, losses), start=1):
        wall += dt
        if loss <= target:
            frac = (prev_loss - target) / (prev_loss - loss) if prev_loss > loss else 1.0
            return prev_wall + frac * (wall - prev_wall), k
        prev_wall, prev_loss = wall, loss
    return None


def summarize(runs: list[dict], names: list[str], target_step: int, steps: int) -> tuple[list[dict], dict]:
    """Per variant, the figures of the table (see the module docstring); and the target per round."""
    by = {(run["variant"], run["round"]): run for run in runs}
    rounds = sorted({run["round"] for run in runs})
    targets = {r: by[("none", r)]["heldout_loss"][target_step - 1] for r in rounds}
    none_step = statistics.median(statistics.median(_timed(by[("none", r)]["step_s"], steps)) for r in rounds)
    none_loss = by[("none", rounds[0])]["heldout_loss"][steps - 1]
    rows = []
    for name in names:
        mine = [by[(name, r)] for r in rounds]
        first = mine[0]
        step_s = statistics.median(statistics.median(_timed(run["step_s"], steps)) for run in mine)
        hits = [time_to_target(run["step_s"], run["heldout_loss_initial"], run["heldout_loss"],
                               targets[run["round"]]) for run in mine]
        reached = all(h is not None for h in hits)
        g = first["grad_bytes"]
        rows.append({
            "variant": name,
            "step_s": step_s,
            "speedup": none_step / step_s if step_s > 0 else None,
            "wire_ratio": g / first["sent_bytes"][steps - 1],
            "wire_ratio_run": g * steps / sum(first["sent_bytes"][:steps]),
            "heldout_loss": first["heldout_loss"][steps - 1],
            "heldout_vs_none": first["heldout_loss"][steps - 1] / none_loss - 1,
            "time_to_target_s": statistics.median(h[0] for h in hits) if reached else None,
            "step_at_target": hits[0][1] if hits[0] is not None else None,
            "time_to_target_per_round_s": [h[0] if h else None for h in hits],
            "step_s_per_round": [statistics.median(_timed(run["step_s"], steps)) for run in mine],
            "steps_run": [len(run["step_s"]) for run in mine],
            "identical_across_rounds": all(run["heldout_loss"] == first["heldout_loss"] and
                                           run["digest"] == first["digest"] for run in mine),
        })
    return rows, {"step": target_step, "heldout_loss_per_round": [targets[r] for r in rounds]}


COLUMNS = ("variant", "s/step", "speedup", "wire", "held-out", "vs none", "to target (s)")


def table(rows: list[dict]) -> list[str]:
    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        if r["time_to_target_s"] is None:
            target = "-"
        else:
            target = f"{r['time_to_target_s']:.2f}" + (f" @{r['step_at_target']}" if r["step_at_target"] else "")
        out.append("| " + " | ".join([
            r["variant"], f"{r['step_s']:.3f}", f"{r['speedup']:.2f}x", f"{r['wire_ratio']:.2f}x",
            f"{r['heldout_loss']:.4f}", f"{100 * r['heldout_vs_none']:+.2f}%", target]) + " |")
    return out


def plot(doc: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    first = min(run["round"] for run in doc["runs"])
    for run in doc["runs"]:
        if run["round"] != first:
            continue
        wall, t = [0.0], 0.0
        for dt in run["step_s"]:
            t += dt
            wall.append(t)
        ax.plot(wall, [run["heldout_loss_initial"]] + run["heldout_loss"], marker="o", ms=2, lw=1.2,
                label=run["variant"])
    target = doc["target"]["heldout_loss_per_round"][0]
    ax.axhline(target, color="black", lw=0.8, ls="--", label=f"target: none at step {doc['target']['step']}")
    ax.set_xlabel("wall time of the training steps (s, rank 0)")
    ax.set_ylabel("held-out loss")
    m = doc["meta"]
    ax.set_title(f"{m['ranks']} ranks, {m['link']}, {m['grad_mib']:.1f} MiB fp32 gradients, round 1", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return _worker(args.worker)
    from ..errors import CcollError

    vs = variants(args)
    h = hidden_width(args.size_mb)
    cfg = {"ranks": args.ranks, "hidden": h, "bucket_mb": args.bucket_mb, "ccoll_bucket_mb": args.ccoll_bucket_mb,
           "steps": args.steps,
           "max_steps": args.max_steps, "target_step": args.target_step, "rounds": args.rounds,
           "variants": [(v.kind, v.arg) for v in vs], "powersgd_start": args.powersgd_start,
           "min_bytes": args.min_bytes, "lr": args.lr, "seed": args.seed, "timeout": args.timeout}
    load0 = os.getloadavg()
    started = datetime.datetime.now(datetime.timezone.utc)
    print(f"# ccoll.bench.hooks {started:%Y-%m-%d %H:%M} UTC: load average {load0[0]:.2f} {load0[1]:.2f} "
          f"{load0[2]:.2f} at start, {os.cpu_count()} CPUs", flush=True)
    try:
        if args.rate:
            runs, link = _shaped(cfg, args.rate, args.delay)
        else:
            from ..launch import run_gloo

            runs = run_gloo(args.ranks, rank_main, cfg, timeout_s=args.timeout)[0]
            link = "loopback"
    except CcollError as e:
        print(f"ccoll.bench.hooks: error: {e}", file=sys.stderr)
        return 1
    load1 = os.getloadavg()
    rows, target = summarize(runs, [v.name for v in vs], args.target_step, args.steps)
    grad_bytes = runs[0]["grad_bytes"]
    meta = {"date": started.isoformat(timespec="seconds"), "ranks": args.ranks, "link": link,
            "hidden": h, "params": grad_bytes // 4, "grad_mib": grad_bytes / (1 << 20), "bucket_mb": args.bucket_mb,
            "ccoll_bucket_mb": args.ccoll_bucket_mb,
            "steps": args.steps, "max_steps": args.max_steps, "target_step": args.target_step,
            "rounds": args.rounds, "lr": args.lr, "seed": args.seed,
            "powersgd_start": args.powersgd_start, "load_average_start": list(load0), "load_average_end": list(load1),
            "cpus": os.cpu_count(), "command": " ".join([PROG] + list(sys.argv[1:] if argv is None else argv))}
    doc = {"meta": meta, "target": target, "variants": rows, "runs": runs}
    own = "" if args.ccoll_bucket_mb == args.bucket_mb else f" ({args.ccoll_bucket_mb:g} MB for ccoll and policies)"
    print(f"# {args.ranks} gloo ranks, {link}; MLP {IN_DIM}-{h}x{HIDDEN_LAYERS}-{CLASSES}, {grad_bytes // 4} params = "
          f"{meta['grad_mib']:.1f} MiB fp32 gradients, DDP buckets {args.bucket_mb:g} MB{own}; {args.steps} steps "
          f"(up to "
          f"{args.max_steps} to reach the target) x {args.rounds} interleaved rounds; target = none's held-out loss "
          f"at step {args.target_step} "
          f"({target['heldout_loss_per_round'][0]:.4f}); load average {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} "
          f"at end")
    print("\n".join(table(rows)), flush=True)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    if args.plot:
        plot(doc, args.plot)
    return 0


if __name__ == "__main__":
    from ..launch import run_main

    run_main(lambda: main())
