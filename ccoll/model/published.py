"""``python -m ccoll.model --published``: the seed paper's GPT-NeoX-20B runs, published speedups beside the model's
prediction from the cluster file alone.

Seed: Xu, Anthony, Zhou, Alnaasan, Gulhane, Shafi, Subramoni, Panda, "Accelerating Large Language Model Training
with Hybrid GPU-based Compression", CCGrid 2024, arXiv 2409.02423 (abstract): GPT-NeoX-20B, 3D parallelism +
ZeRO-1, up to 192 V100 on LLNL Lassen; naive compression +23.6% samples/s and +22.5% TFLOPS per GPU; hybrid
+12.7% samples/s and +17.3% TFLOPS per GPU. Its schemes: naive = ZFP on every collective; hybrid = aggressive
ZFP on DP gradients, milder (ZHybrid: a higher ZFP rate) or lossless (MZHybrid: MPC) on TP/PP -- our
configs/znaive.yaml, zhybrid.yaml, mzhybrid.yaml.

Layout (every field sourced; "assumed" where no source was found):
    GPT-NeoX configs/20B.yml (github.com/EleutherAI/gpt-neox): 44 layers, hidden 6144, 64 heads, seq 2048,
        pipe-parallel-size 4, model-parallel-size 2, train_micro_batch_size_per_gpu 4,
        gradient_accumulation_steps 32, ZeRO stage 1 with ``reduce_scatter: true``, fp16,
        checkpoint-activations (recomputation), gpt_j_residual (parallel residual), no-weight-tying;
        vocabulary padded to 50432 (NeoX-20B model card)
    192 GPUs / (TP 2 x PP 4) = DP 24 (the paper's largest scale)
    NeoX's PipelineModule sends the fp16 attention mask with each forward activation (pp_mask)
    MFU 0.30: the V100 figure Megatron-LM reports for a GPT layer on one V100 (Shoeybi et al. 2019,
        arXiv 1909.08053: 39 TFLOPS = 30% of peak) -- the paper's own baseline TFLOPS were not found
    gradient_accumulation_steps: the paper's value was not found. Three rows: 20B.yml's 32 as written (its
        comment: "assuming 96 GPUs", so at DP 24 twice the global batch); 16, the global batch GPT-NeoX-20B was
        trained with (Black et al. 2022, arXiv 2204.06745: ~3.15M tokens = 1538 contexts of 2048; 1536 / (4 x 24)
        = 16) kept at 192 GPUs; and 1 (the largest share of communication the layout allows)
    DP gradient reduction: all-reduce in fp16. The paper compresses "gradients when performing DP All-reduce"
        (abstract); DeepSpeed's ZeRO-1 with ``reduce_scatter: true`` reduces its buckets by all_reduce when
        ``use_multi_rank_bucket_allreduce`` (default true; deepspeed/runtime/zero/stage_1_and_2.py
        ``average_tensor``, 0.19.8) and otherwise by one ``reduce`` per partition owner -- either way no cheaper
        than a reduce-scatter; all-reduce is what both sources say
    DP buckets: 20B.yml's reduce_bucket_size 1.26e9 elements of fp16 (only matters without pipelining)
    DP after the schedule: DeepSpeed's PipelineEngine runs ``ReduceGrads`` once the micro-batches are done
        (deepspeed/runtime/pipe/engine.py ``_exec_reduce_grads`` -> ``allreduce_gradients``): exposed, as timing.py
        models it
    PP: DeepSpeed's p2p sends are ``dist.broadcast`` in a 2-rank group (deepspeed/runtime/pipe/p2p.py), one
        message per tensor per micro-batch: modelled as sends (same bytes, one latency each)

Memory (:mod:`ccoll.model.memory`, a lower bound): 20B.yml's micro-batch 4 needs >= 18.7 GiB on a stage-0 GPU,
more than a Lassen V100's 16 GiB; micro-batch 2 or 1 may fit. So the paper cannot have run 20B.yml as written on
Lassen: its layout differed in a way it does not publish. The rows keep 20B.yml's micro-batch (at the same global
batch, micro-batch 2 moves the same bytes per token and changes the speedups by latency terms only), and
:func:`bounds` gives the corners that would favour compression most.

What the paper's public record gives (arXiv 2409.02423, abstract; the body could not be retrieved here): the four
speedups below, 192 V100 on Lassen, GPT-NeoX-20B, 3D parallelism + ZeRO-1, MPI collectives with GPU compression
(ZFP lossy, MPC lossless). Not found: its TP/PP/DP degrees, micro-batch size and accumulation steps, baseline
TFLOPS or samples/s, MPI library version and collective algorithms, ZFP rates, and the scale each speedup was
measured at (192 GPUs is assumed).

Achieved bandwidth of the paper's stack (MVAPICH2-GDR-class MPI, GPU buffers, POWER9 AC922 + V100 + dual-rail EDR),
modelled from published measurements (configs/clusters/lassen.yaml): Shafie Khorassani, Chu, Subramoni, Panda,
"Performance Evaluation of MPI Libraries on GPU-enabled OpenPOWER Architectures: Early Experiences" (ISC 2019
workshops, LNCS 11887): MVAPICH2-GDR ~99% of the achievable inter-node bandwidth, MPI libraries ~95% of the achievable
NVLink bandwidth between two GPUs of a socket; one EDR port at 12.2 GB/s of bus bandwidth (NVIDIA/nccl-tests issue
29). Together they move the prediction by a fraction of a percent: the links were near their specification. Zimmer
et al., "An Evaluation of the CORAL Interconnects" (SC19): Sierra's fabric has a 2:1 taper between racks and
aggregation switches -- whether Lassen's does was not found, so it is a bound (:func:`bounds`), not a parameter.
Not found: OSU-benchmark curves of MPI_Allreduce / Allgather on GPU buffers at Lassen's scale, the paper's MPI
version and the collective algorithms it selected, the compressed collectives' own achieved rates.
"""
from __future__ import annotations

import dataclasses
import os
import sys

from .core import Layout
from .clusters import load_cluster
from .timing import predict

#: published samples/s speedups (arXiv 2409.02423, abstract)
PUBLISHED = {"naive": 1.236, "hybrid": 1.127}
#: the paper's TFLOPS per GPU gains (same source), reported beside
PUBLISHED_TFLOPS = {"naive": 1.225, "hybrid": 1.173}
#: which shipped policy stands for each scheme: the paper's ZFP schemes, and MZHybrid (lossless on TP/PP; ours
#: has int4 on DP where the paper has ZFP) -- the abstract does not say which hybrid its +12.7% is, so both
SCHEMES = [("naive", "configs/znaive.yaml"), ("hybrid", "configs/zhybrid.yaml"), ("hybrid", "configs/mzhybrid.yaml")]
#: measured raw/used bytes of the variable-size lossless codec (configs/codecs/measured.yaml)
CODEC_TABLE = "configs/codecs/measured.yaml"
#: within this of the published ratio counts as reproduced (issue 21's target)
TARGET = 0.15
#: see the module docstring
MFU = 0.30
#: Sierra's fabric: 2:1 taper between racks and aggregation switches (Zimmer et al., SC19; :func:`bounds`)
TAPER = 0.5

#: micro-batches per step of the three rows (see the module docstring: 20B.yml as written, NeoX-20B's trained
#: global batch at DP 24, the communication-heaviest)
MICRO_BATCHES = (32, 16, 1)

NEOX20B = Layout(layers=44, hidden=6144, heads=64, seq=2048, vocab=50432, micro_batch=4, micro_batches=32, dp=24,
                 tp=2, pp=4, zero=1, dtype="float16", parallel_residual=True, recompute=True, pp_mask=True,
                 zero_reduce="all_reduce",
                 dp_bucket_bytes=1_260_000_000 * 2)


def _policy_file(policy: str) -> str:
    """A policy of ``SCHEMES`` (``configs/<name>.yaml``) or a caller's file, as a path that opens from any working
    directory: the shipped configs as installed with the package (ccoll.policy.find_policy)."""
    from ..policy import find_policy

    return find_policy(policy)


def _codec_table() -> dict:
    """``CODEC_TABLE`` as shipped with the package (ccoll.resources), whatever the working directory."""
    from ..resources import config_path
    from .timing import load_codec_table

    return load_codec_table(str(config_path(os.path.relpath(CODEC_TABLE, "configs"))))


def published(cluster: str = "lassen", codec_table: dict | None = None, micro_batches=MICRO_BATCHES) -> list[dict]:
    """One row per (scheme, micro-batches): published and predicted speedup, their ratio, and whether it is
    within ``TARGET``."""
    node = load_cluster(cluster)
    if codec_table is None:
        codec_table = _codec_table()
    rows = []
    for m in micro_batches:
        lay = dataclasses.replace(NEOX20B, micro_batches=m)
        base = predict(lay, node, None, mfu=MFU, codec_table=codec_table)
        for scheme, pol in SCHEMES:
            t = predict(lay, node, _policy_file(pol), mfu=MFU, codec_table=codec_table)
            pred = base["total_s"] / t["total_s"]
            rows.append({"scheme": scheme, "policy": pol, "micro_batches": m, "published": PUBLISHED[scheme],
                         "predicted": pred, "ratio": pred / PUBLISHED[scheme],
                         "within_target": abs(pred / PUBLISHED[scheme] - 1) <= TARGET,
                         "gain_captured": (pred - 1) / (PUBLISHED[scheme] - 1),
                         "base_step_s": base["total_s"], "base_comm_s": sum(base["link_s"].values()),
                         "step_s": t["total_s"]})
    return rows


def bounds(cluster: str = "lassen", codec_table: dict | None = None) -> dict:
    """Diagnostics, not predictions: the speedups at the corners that would favour compression most, to say
    which missing fact could close the gap. ``peak``: every FLOP at the V100's full dense peak (MFU 1.0, an upper
    bound nothing reaches) in 20B.yml's layout; ``tiny_batch``: micro-batch 1 and one micro-batch per step (24
    sequences a step; nothing in the public record says the paper ran so; :func:`memory_line` says why its
    micro-batch may have been smaller than 4); ``taper``: 20B.yml's layout with every inter-node rate halved, the
    worst a 2:1 tapered fabric can do when every byte leaving a node also leaves its rack (Sierra's fabric has a
    2:1 taper between racks and aggregation switches, Zimmer et al., "An Evaluation of the CORAL Interconnects",
    SC19, doi 10.1145/3295500.3356166; whether Lassen's has one, and where the paper's 48 nodes sat, was not
    found). Keys ``(corner, scheme)`` -> speedup."""
    node = load_cluster(cluster)
    table = codec_table or _codec_table()
    corners = {"peak": (NEOX20B, 1.0, node),
               "tiny_batch": (dataclasses.replace(NEOX20B, micro_batch=1, micro_batches=1), MFU, node),
               "taper": (NEOX20B, MFU, node.scaled(TAPER, intra=False))}
    out = {}
    for name, (lay, mfu, n) in corners.items():
        base = predict(lay, n, None, mfu=mfu, codec_table=table)["total_s"]
        for scheme, pol in SCHEMES[:2]:
            out[(name, scheme)] = base / predict(lay, n, _policy_file(pol), mfu=mfu,
                                                 codec_table=table)["total_s"]
    return out


def link_fraction_needed(scheme: str = "naive", policy: str = "configs/znaive.yaml", cluster: str = "lassen",
                         micro_batches: int = 32, codec_table: dict | None = None) -> float | None:
    """Diagnostic, not a fit: the fraction of every link's rate in the cluster file (intra and inter alike, after the
    file's published achieved-bandwidth measurements) at which the model would reproduce the published speedup of
    ``scheme`` -- how far achieved bandwidth would have to be below the measured one for the paper's figure to
    follow. None if no fraction in (0.001, 1] does."""
    import dataclasses as dc

    node = load_cluster(cluster)
    table = codec_table or _codec_table()
    lay = dc.replace(NEOX20B, micro_batches=micro_batches)

    def speedup(f):
        n = node.scaled(f)
        return (predict(lay, n, None, mfu=MFU, codec_table=table)["total_s"]
                / predict(lay, n, _policy_file(policy), mfu=MFU, codec_table=table)["total_s"])

    target = PUBLISHED[scheme]
    lo, hi = 1e-3, 1.0
    if speedup(hi) >= target or speedup(lo) < target:
        return None
    for _ in range(40):  # speedup falls as links get faster: bisect on the fraction
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if speedup(mid) >= target else (lo, mid)
    return lo


def memory_line(cluster: str = "lassen") -> str:
    """Whether 20B.yml's layout fits the cluster's GPUs (:mod:`ccoll.model.memory`, a lower bound), and the largest
    micro-batch that may: the paper ran on 16 GB V100s, 20B.yml was written for 40 GB A100s."""
    from .memory import fits

    node = load_cluster(cluster)
    f = fits(NEOX20B, node)
    if f is None:
        return f"# memory: {node.name} gives no memory_gib"
    ok = [b for b in (4, 2, 1) if fits(dataclasses.replace(NEOX20B, micro_batch=b), node)["fits"]]
    need = f["bytes"]["total"] / (1 << 30)
    verdict = ("fits" if f["fits"] else "does NOT fit: the paper's layout must differ from 20B.yml in a way it does "
               "not publish (more TP/PP, smaller micro-batch, or activation partitioning/offload)")
    return (f"# memory: 20B.yml's micro-batch 4 needs >= {need:.1f} GiB per GPU (stage {f['stage']}: weights, "
            f"gradients, ZeRO-1 states, 1F1B checkpointed activations) of the {node.gpu}'s {node.memory_gib:g} GiB: "
            f"{verdict}; micro-batches that may fit: {ok or 'none'}")


def print_published(rows: list[dict], file=None) -> None:
    file = sys.stdout if file is None else file
    print("# GPT-NeoX-20B on 192 V100 (Lassen: 4 x V100 per AC922 node, 2 x EDR 100 Gbit/s), TP 2 x PP 4 x DP 24, "
          "ZeRO-1, fp16, recomputation, parallel residual; MFU 0.30 (Megatron-LM's V100 figure)", file=file)
    print("# published: Xu et al., CCGrid 2024 (arXiv 2409.02423); layout: GPT-NeoX configs/20B.yml; DP gradients "
          "all-reduced in fp16 after the pipeline schedule (DeepSpeed PipelineEngine ReduceGrads); m = 32 (20B.yml), "
          "16 (NeoX-20B's 1538-context batch at DP 24), 1", file=file)
    print("# found in the public record: the 4 speedups, 192 V100, Lassen, NeoX-20B, 3D + ZeRO-1, MPI + GPU ZFP/MPC; "
          "achieved bandwidth of MPI on POWER9 + V100 + EDR nodes (Shafie Khorassani et al., ISC 2019 workshops: "
          "MVAPICH2-GDR ~99% of achievable inter-node, ~95% NVLink) and of one EDR port (12.2 GB/s, nccl-tests issue 29), "
          "modelled in configs/clusters/lassen.yaml; Sierra's 2:1 fabric taper (Zimmer et al., SC19). Not found: the "
          "paper's TP/PP/DP, micro-batch and accumulation, baseline TFLOPS or samples/s, MPI version and collective "
          "algorithms, ZFP rates, the scale of each figure, MPI_Allreduce/Allgather curves on GPU buffers at its "
          "scale, whether Lassen's fabric is tapered", file=file)
    print(memory_line(), file=file)
    print(f"#{'scheme':<7} {'policy':<22} {'m':>3} {'published':>9} {'predicted':>9} {'pred/pub':>8} "
          f"{'gain seen':>9} {'base step s':>11} {'base comm s':>11} within {100 * TARGET:.0f}%", file=file)
    for r in rows:
        print(f" {r['scheme']:<7} {r['policy']:<22} {r['micro_batches']:>3} {r['published']:>8.3f}x "
              f"{r['predicted']:>8.3f}x {r['ratio']:>8.3f} {100 * r['gain_captured']:>8.0f}% {r['base_step_s']:>11.2f} {r['base_comm_s']:>11.2f} "
              f"{'yes' if r['within_target'] else 'NO'}", file=file)
    print("# gain seen = predicted gain / published gain. A ratio within 15% is not a reproduction when the gain "
          "itself is missed: hybrid's +12.7% leaves 1.00x within 15% of 1.127x.", file=file)
    if not all(r["within_target"] and r["gain_captured"] > 0.5 for r in rows):
        print("# target missed with these sourced parameters: from the public specs, communication is a few percent "
              "of a NeoX-20B step on Lassen (compute-bound: 4 x 2048 tokens per micro-batch on 2.5B parameters per GPU, "
              "recomputation), so no codec can buy +12..24% -- not even at one micro-batch, where the 1F1B bubble is "
              "compute too. The published gains imply communication >= ~20% of the baseline step. The achieved "
              "bandwidth published for this stack is modelled (configs/clusters/lassen.yaml): MVAPICH2-GDR reaches ~99% "
              "of the achievable inter-node and ~95% of the NVLink bandwidth on POWER9 + V100 nodes (Shafie Khorassani "
              "et al., ISC 2019 workshops), one EDR port 97.6 of 100 Gbit/s (nccl-tests issue 29) -- near the "
              "specification, so it does not close the gap.", file=file)
        f = link_fraction_needed()
        if f is not None:
            print(f"# diagnostic: the model gives naive's +23.6% (m=32) only with every link at {100 * f:.1f}% of its "
                  "achieved rate (the cluster file's) -- the size of the gap, not a parameter.", file=file)
        b = bounds()
        print(f"# bounds, not predictions: every FLOP at the V100's peak (MFU 1.0, m=32): naive "
              f"{b[('peak', 'naive')]:.3f}x, hybrid {b[('peak', 'hybrid')]:.3f}x -- compute efficiency cannot close "
              f"the gap; micro-batch 1 x 1 micro-batch (24 sequences a step, unsourced): naive "
              f"{b[('tiny_batch', 'naive')]:.3f}x, hybrid {b[('tiny_batch', 'hybrid')]:.3f}x -- the published "
              "figures need about that little work per step, or links far below their specification; a 2:1 "
              f"tapered fabric (Sierra's, Zimmer et al. SC19; Lassen's not found) with every inter-node byte crossing "
              f"it: naive {b[('taper', 'naive')]:.3f}x, hybrid {b[('taper', 'hybrid')]:.3f}x -- a taper cannot close "
              "it either.", file=file)
