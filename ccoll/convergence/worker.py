"""One training rank: ``python -m ccoll.convergence.worker SPEC.json`` with RANK, WORLD_SIZE, MASTER_ADDR
and MASTER_PORT in the environment (set by the runner, or by ``ccoll.bench.netem`` per namespace).

Order matters and mirrors GPT-NeoX: the ccoll patch is installed with the policy before
``deepspeed.init_distributed`` (so the groups DeepSpeed creates and the functions deepspeed.comm caches
are already wrapped); TP groups are built from the same PipeModelDataParallelTopology object the
PipelineModule gets, so the resolver maps every group to dp/tp/pp by its rank set.

Writes, in the spec's ``run_dir``: ``progress.txt`` (rank 0: "step loss seconds" per training step and
"eval step val_loss" per evaluation, for the progress lines) and ``rank<R>.json`` (losses, validation
losses, timing, ``ccoll.stats()`` of this rank's training steps: evaluation traffic is subtracted).

Validation: every ``eval_every`` steps and after the last one, the engine evaluates the same fixed
micro-batches of the held-out split (see data.py); the loss is averaged over them and over DP replicas.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
import time


#: seed of the held-out batches: fixed, so every policy and every training seed is scored on the same text
VAL_SEED = 99_991


def subtract_stats(after: list[dict], before: list[dict]) -> list[dict]:
    """``ccoll.stats()`` rows of ``after`` minus those of ``before`` (per dim, op, codec), dropping rows
    left with no calls: the traffic of what happened in between taken out (or, swapped, kept alone)."""
    old = {(r["dim"], r["op"], r["codec"]): r for r in before}
    out = []
    for r in after:
        b = old.get((r["dim"], r["op"], r["codec"]))
        if b is not None:
            hist = {k: v - b["histogram"].get(k, 0) for k, v in r["histogram"].items()}
            r = dict(r, calls=r["calls"] - b["calls"], raw_bytes=r["raw_bytes"] - b["raw_bytes"],
                     wire_bytes=r["wire_bytes"] - b["wire_bytes"], seconds=r["seconds"] - b["seconds"],
                     histogram={k: v for k, v in hist.items() if v})
        if r["calls"]:
            out.append(r)
    return out


def codec_totals() -> dict[str, dict[str, float]]:
    """Host-clock codec seconds and values by phase (encode; decode = decode_rows + decode_sum), summed
    over dimensions: the in-run codec throughput ccoll.model.validate takes."""
    import ccoll

    out = {"encode": {"nbytes": 0, "seconds": 0.0}, "decode": {"nbytes": 0, "seconds": 0.0}}
    for r in ccoll.stats.codec_stats():
        o = out["encode" if r["phase"] == "encode" else "decode"]
        o["nbytes"] += r["nbytes"]
        o["seconds"] += r["seconds"]
    return out


def minus(a: dict, b: dict) -> dict:
    """``codec_totals()`` a minus b: the codec work of what happened in between taken out."""
    return {k: {f: a[k][f] - b[k][f] for f in a[k]} for k in a}


def _tp_state(topology, rank: int):
    import torch.distributed as dist

    from .gpt import TPState

    lists = topology.get_axis_comm_lists("model")
    if topology.get_dim("model") == 1:
        return TPState(None, 0, 1)
    mine = None
    for ranks in lists:  # every rank creates every group, in the same order (torch.distributed rule)
        g = dist.new_group(ranks=ranks)
        if rank in ranks:
            mine = TPState(g, ranks.index(rank), len(ranks))
    return mine


def _install_patch(policy_path: str | None, topology):
    """Install ccoll's patch for ``policy_path`` (None: run unpatched). Returns the uninstall callable."""
    if policy_path is None:
        return lambda: None
    from .. import patch
    from ..resolvers import TopologyResolver

    patch.install(policy_path, resolver=TopologyResolver(topology))
    return patch.uninstall


def run(spec: dict) -> dict:
    import torch

    torch.set_num_threads(int(spec.get("threads", 1)))
    torch.manual_seed(spec["seed"])
    import deepspeed
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    from deepspeed.utils import logger as ds_logger

    import ccoll

    from .data import BatchSampler, load_corpus, split_corpus
    from .gpt import GPTConfig, build_pipeline

    ds_logger.setLevel(logging.WARNING)
    t_start = time.perf_counter()

    def phase(what: str) -> None:
        print(f"[ccoll.convergence rank {rank}] {what} at {time.perf_counter() - t_start:.1f} s", flush=True)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    os.environ.setdefault("LOCAL_RANK", "0")
    dp, tp, pp = spec["dp"], spec["tp"], spec["pp"]
    topology = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
    from .. import capture

    if spec.get("capture"):
        capture.context.update(pp_stage=topology.get_coord(rank).pipe, pp_size=pp, tp_size=tp, dp_size=dp)
    uninstall = _install_patch(spec.get("policy"), topology)
    deepspeed.init_distributed(dist_backend="gloo", verbose=False, rank=rank, world_size=world)
    phase("process group up")

    tp_state = _tp_state(topology, rank)
    cfg = GPTConfig(**spec["model"])
    module = build_pipeline(cfg, topology, tp_state, spec["seed"])
    steps, mb, gas, lr = spec["steps"], spec["micro_batch"], spec["grad_accum"], spec["lr"]
    warmup = max(1, min(spec.get("warmup_steps", 20), steps // 5))
    optimizer = torch.optim.AdamW(module.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / steps)))))
    ds_config = {
        "train_micro_batch_size_per_gpu": mb,
        "gradient_accumulation_steps": gas,
        "train_batch_size": mb * gas * dp,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 1, "overlap_comm": False, "reduce_scatter": spec.get("reduce_scatter", True)},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, lr_scheduler=schedule,
                                           config=ds_config)
    phase("engine ready")
    dp_rank = topology.get_coord(rank).data
    train_text, heldout_text = split_corpus(load_corpus(spec.get("data")), spec.get("heldout_fraction", 0.05))
    sampler = BatchSampler(train_text, cfg.seq_len, mb, spec["seed"])
    batches = sampler.iterator(dp_rank, gas)
    # the held-out batches depend on neither the run's seed nor the policy: every run is scored alike
    val_sampler = BatchSampler(heldout_text, cfg.seq_len, mb, VAL_SEED)
    n_val = spec.get("eval_batches", 4)
    eval_every = spec.get("eval_every", 0) or steps

    def evaluate() -> float:
        before, codec_before = ccoll.stats(), codec_totals()
        val = iter([val_sampler.micro_batch_at(0, dp_rank, i) for i in range(n_val)])
        with capture.paused():  # capture training traffic only
            loss = float(engine.eval_batch(data_iter=val, num_micro_batches=n_val))
        engine.module.train()
        eval_traffic.append(subtract_stats(ccoll.stats(), before))
        untimed_codec.append(minus(codec_totals(), codec_before))
        return loss

    # count only training traffic: init-time parameter broadcasts are never compressed by design
    ccoll.reset_stats()
    ccoll.stats.time_codecs()  # the codec's in-run throughput (ccoll.convergence.shaped predicts from it)
    losses, step_seconds, val_losses, eval_traffic, untimed_codec = [], [], [], [], []
    progress = open(os.path.join(spec["run_dir"], "progress.txt"), "a") if rank == 0 else None
    for step in range(steps):
        t0 = time.perf_counter()
        loss = engine.train_batch(data_iter=batches)
        step_seconds.append(time.perf_counter() - t0)
        if step == 0:  # the codec's one-off warm-up is step 1's, as the setup is (throughput times steps 2..)
            untimed_codec.append(codec_totals())
        losses.append(float(loss))
        if progress is not None:
            progress.write(f"{step} {losses[-1]:.6f} {step_seconds[-1]:.6f}\n")
            progress.flush()
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            val_losses.append([step + 1, evaluate()])
            if progress is not None:
                progress.write(f"eval {step + 1} {val_losses[-1][1]:.6f}\n")
                progress.flush()
    if progress is not None:
        progress.close()
    phase(f"{steps} steps done")
    stats = ccoll.stats()
    for t in eval_traffic:
        stats = subtract_stats(stats, t)
    codec = codec_totals()
    for c in untimed_codec:  # evaluation's and step 1's codec calls out: the codec time of steps 2..
        codec = minus(codec, c)
    result = {
        "rank": rank, "coord": topology.get_coord(rank)._asdict(), "losses": losses, "val_losses": val_losses,
        "step_seconds": step_seconds, "samples_per_step": mb * gas * dp, "stats": stats, "codec": codec,
    }
    uninstall()
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        spec = json.load(f)
    result = run(spec)
    path = os.path.join(spec["run_dir"], f"rank{result['rank']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    from ..launch import exit_process

    exit_process(main())  # no interpreter teardown after gloo (see ccoll.launch)
