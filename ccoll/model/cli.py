"""``python -m ccoll.model``'s command line and printing (see :mod:`ccoll.model`)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

from .. import units
from ..errors import CcollError
from .core import (DIMS, DTYPES, PRESETS, RUNNER, Cluster, Layout, codec_gbps_needed, codec_throughput, per_dim,
                   preset_cluster, step_time, traffic)
from .fromrun import validate

# --- printing ----------------------------------------------------------------------------------------
_fmt = units.human_nbytes


def print_traffic(lay: Layout, policy, file=None) -> None:
    file = sys.stdout if file is None else file
    rows = traffic(lay, policy)
    print(f"# ccoll.model: {lay.layers} layers x {lay.hidden} hidden, {lay.heads} heads, seq {lay.seq}, vocab "
          f"{lay.vocab}, micro-batch {lay.micro_batch} x {lay.micro_batches}, dp={lay.dp} tp={lay.tp} pp={lay.pp}, "
          f"ZeRO-{lay.zero}, {lay.dtype}{', sequence-parallel' if lay.sequence_parallel else ''}"
          f"{', FlashAttention' if lay.flash_attention else ''}; policy {policy or 'none (native)'}", file=file)
    print("# bytes per optimizer step: per rank (busiest rank of the stage) and summed over all ranks", file=file)
    print(f"#{'dim':<4} {'op':<15} {'what':<32} {'stage':>5} {'codec':<26} {'calls/rank':>10} {'raw/rank':>12} "
          f"{'wire/rank':>12} {'raw total':>12} {'wire total':>12} {'ratio':>6}", file=file)
    for r in rows:
        ratio = r["raw"] / r["wire"] if r["wire"] else float("nan")
        print(f" {r['dim']:<4} {r['op']:<15} {r['what']:<32} {r['stage']:>5} {r['codec']:<26} {r['calls_per_rank']:>10} "
              f"{_fmt(r['raw_per_rank']):>12} {_fmt(r['wire_per_rank']):>12} {_fmt(r['raw']):>12} {_fmt(r['wire']):>12} "
              f"{ratio:>6.2f}", file=file)
    for d, b in per_dim(rows).items():
        if b["raw"]:
            print(f"# {d}: raw {_fmt(b['raw'])}, wire {_fmt(b['wire'])} per step (all ranks), {b['raw'] / b['wire']:.2f}x",
                  file=file)


def why_line(lay: Layout, cl: Cluster, policy, target: float) -> str:
    """One line: what codec throughput ``target`` needs here, or the most any codec could give."""
    n = codec_gbps_needed(lay, cl, policy, target)
    if n["codec_gbps"] is None:
        return (f"{target:g}x is out of reach at these links: even an infinitely fast codec gives "
                f"{n['max_speedup']:.3f}x (compute and the uncompressed traffic remain)")
    # the throughput that, for encode and decode alike, costs the step what the given rates cost it
    unit = step_time(lay, dataclasses.replace(cl, codec_gbps=1.0, decode_gbps=None), policy)["codec_s"]
    have = unit / step_time(lay, cl, policy)["codec_s"]
    return (f"{target:g}x needs a codec of >= {n['codec_gbps']:.3f} GB/s (encode and decode; have {have:.3f}); "
            f"an infinitely fast codec would give {n['max_speedup']:.3f}x")


def why_line_node(lay: Layout, node, policy, target: float, **kw) -> str:
    """``why_line`` on the mechanistic step time (:func:`ccoll.model.timing.codec_rate_needed`); ``kw``: predict's
    options (mfu or compute_s, codec_table, ...)."""
    from .timing import codec_rate_needed

    n = codec_rate_needed(lay, node, policy, target, **kw)
    if n["codec_gbps"] is None:
        return (f"{target:g}x is out of reach at these links: even an infinitely fast codec gives "
                f"{n['max_speedup']:.3f}x (compute and the uncompressed traffic remain)")
    return (f"{target:g}x needs a codec of >= {n['codec_gbps']:.3f} GB/s (encode and decode); an infinitely fast "
            f"codec would give {n['max_speedup']:.3f}x")


def format_step(t: dict) -> str:
    """One line decomposing a predicted step: where the time goes (compute, wire per dimension, codec)."""
    return (f"predicted step {t['total_s']:.3f} s = compute {t['compute_s']:.3f} + wire dp {t['link_s']['dp']:.3f}"
            f" tp {t['link_s']['tp']:.3f} pp {t['link_s']['pp']:.3f} + codec {t['codec_s']:.3f} s")


def cluster_table(policies: list[str], codec_gbps: float | None = None, file=None) -> list[dict]:
    """Every preset on its own sourced node file (``PRESET_CLUSTERS``) through the mechanistic step time, at the
    preset's MFU, every codec at ``codec_gbps`` (encode and decode; None: each codec at the GPU's memory roofline, as
    the README's table): one row per (preset, policy)."""
    from .clusters import load_cluster
    from .timing import predict

    file = sys.stdout if file is None else file
    rows = []
    rate = f"{codec_gbps:g} GB/s for every codec" if codec_gbps else "each codec at the GPU's memory roofline"
    print(f"# predicted step time and speedup over native on each preset's node file (codec throughput {rate}; "
          f"mechanistic model: ccoll.model.timing)", file=file)
    print(f"#{'preset':<14} {'node':<10} {'policy':<22} {'compute s':>10} {'tp s':>8} {'pp s':>8} {'dp s':>8} "
          f"{'codec s':>8} {'step s':>8} {'speedup':>8}", file=file)
    for name, (lay, cl) in PRESETS.items():
        node = load_cluster(preset_cluster(name))
        kw = dict(mfu=cl.mfu, codec_gbps=(codec_gbps, codec_gbps) if codec_gbps else None)
        base = predict(lay, node, None, **kw)
        for pol in [None, *policies]:
            t = predict(lay, node, pol, **kw)
            label = "native" if pol is None else os.path.splitext(os.path.basename(pol))[0]
            row = {"preset": name, "node": node.name, "policy": label, **{f"{d}_s": t["link_s"][d] for d in DIMS},
                   "compute_s": t["compute_s"], "codec_s": t["codec_s"], "step_s": t["total_s"],
                   "speedup": base["total_s"] / t["total_s"]}
            rows.append(row)
            print(f" {name:<14} {node.name:<10} {label:<22} {row['compute_s']:>10.3f} {row['tp_s']:>8.3f} "
                  f"{row['pp_s']:>8.3f} {row['dp_s']:>8.3f} {row['codec_s']:>8.3f} {row['step_s']:>8.3f} "
                  f"{row['speedup']:>7.3f}x", file=file)
    return rows


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ccoll.model", description="Analytical traffic and step-time model of GPT training per parallel dimension.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), help="a real layout (overrides the layout options), run on "
                                                              "its sourced node file unless --cluster says otherwise")
    for k, v in (("layers", 4), ("hidden", 128), ("heads", 4), ("seq", 128), ("vocab", 256), ("micro-batch", 4),
                 ("micro-batches", 2), ("dp", 2), ("tp", 1), ("pp", 2), ("zero", 1)):
        p.add_argument(f"--{k}", type=int, default=None, help=f"(default {v}; with --preset: the preset's)")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="(default float32; with --preset: the preset's)")
    k = p.add_argument_group("framework knobs (override a preset's)")
    k.add_argument("--grad-dtype", choices=sorted(DTYPES), default=None,
                   help="dtype of the DP gradient reduction (Megatron reduces bf16 gradients in float32: 2x the bytes)")
    k.add_argument("--zero-reduce", choices=("all_reduce", "reduce_scatter"), default=None,
                   help="ZeRO-1/2 gradient reduction (DeepSpeed's reduce_scatter: true)")
    k.add_argument("--distributed-optimizer", action="store_true",
                   help="Megatron's distributed optimizer: gradients reduce-scattered, parameters all-gathered, "
                        "optimizer states sharded over DP (= --zero 1 --zero-reduce reduce_scatter)")
    k.add_argument("--recompute", action=argparse.BooleanOptionalAction, default=None,
                   help="full activation recomputation (the forward and its TP all-reduces again in backward)")
    k.add_argument("--parallel-residual", action=argparse.BooleanOptionalAction, default=None,
                   help="GPT-J/NeoX parallel residual: one forward TP all-reduce per layer")
    k.add_argument("--flash-attention", action=argparse.BooleanOptionalAction, default=None,
                   help="FlashAttention (Megatron --use-flash-attn): the attention scores are not stored (memory)")
    k.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                   help="Megatron sequence parallelism: activations outside the TP regions split over TP too (memory); "
                        "TP all-reduces become reduce-scatter + all-gather, plus a backward re-gather per "
                        "column-parallel linear; PP sends the s/tp shard")
    k.add_argument("--pp-mask", action=argparse.BooleanOptionalAction, default=None,
                   help="NeoX/DeepSpeed pipeline: the fp16 attention mask travels with every forward activation")
    k.add_argument("--dp-bucket-mb", type=float, default=None,
                   help="DP gradient bucket, MiB (DeepSpeed reduce_bucket_size x gradient bytes; DDP bucket_cap_mb)")
    k.add_argument("--rails", type=int, default=None, help="--cluster: NICs per node (overrides the file's)")
    k.add_argument("--rail-gbps", type=float, default=None,
                   help="--cluster: Gbit/s per NIC (overrides the file's rate and its measured rate)")
    p.add_argument("--runner", action="store_true", help="ccoll.convergence's model (replicated byte embedding, "
                                                          "learned positions, gathered logits)")
    p.add_argument("--policy", action="append", default=[], help="policy YAML (repeatable; traffic uses the first)")
    p.add_argument("--codec-gbps", type=float, default=None,
                   help="codec throughput, GB/s of input values, every codec alike (default: --cluster and --clusters: "
                        "each codec at the GPU's memory roofline; the flat model without --cluster: 100)")
    p.add_argument("--decode-gbps", type=float, default=None, help="decode throughput if not --codec-gbps")
    p.add_argument("--tp-gbps", type=float, default=1200.0, help="TP link, Gbit/s per GPU")
    p.add_argument("--inter-gbps", type=float, default=12.5, help="DP/PP link, Gbit/s per GPU")
    p.add_argument("--compute-s", type=float, default=None, help="compute seconds per step (default: from FLOPs)")
    p.add_argument("--peak-tflops", type=float, default=125.0)
    p.add_argument("--mfu", type=float, default=None,
                   help="fraction of the dtype's dense peak reached (default: the preset's, else 0.35)")
    p.add_argument("--dp-overlap", type=float, default=0.0, help="fraction of DP link time hidden under backward")
    p.add_argument("--target-speedup", type=float, default=1.25,
                   help="print the codec throughput this speedup needs (or why no codec reaches it)")
    p.add_argument("--clusters", action="store_true", help="print the table for the real-cluster presets")
    p.add_argument("--validate", metavar="SUMMARY_JSON", help="compare with a ccoll.convergence summary.json")
    p.add_argument("--link-gbps", type=float, default=None, help="--validate: link Gbit/s (default: the run's netem rate)")
    p.add_argument("--ranks-per-node", type=int, default=None,
                   help="--validate: the run's node map (CCOLL_NODE_MAP=L: L consecutive ranks per node), for "
                        "hierarchy: node calls' bytes (default: the summary's meta.ranks_per_node, else no map)")
    p.add_argument("--json", default=None, help="write the result as JSON")
    p.add_argument("--cluster", metavar="NAME_OR_YAML",
                   help="a node description (shipped: lassen, dgx-a100, dgx-h100, h800-8x400g-ib; or your own YAML: "
                        "--cluster-template): the mechanistic step time (placement, rails, alpha-beta, algorithm, "
                        "overlap), after the memory check")
    p.add_argument("--cluster-template", metavar="FILE", help="write a commented cluster file to fill in, and exit")
    p.add_argument("--codec-table", metavar="YAML", help="--cluster: measured codec GB/s per spec (default: roofline)")
    p.add_argument("--algorithm", default="auto", choices=("auto", "ring", "hierarchical", "tree"),
                   help="--cluster: native all-reduce algorithm across nodes")
    p.add_argument("--published", action="store_true", help="the scored protocol over published rows "
                                                              "(ccoll.model.scored) and the seed paper's envelope check")
    p.add_argument("--from-run", metavar="SUMMARY_JSON", nargs="+",
                   help="calibrate on a shaped run's summary.json (several: repeated runs of one configuration, "
                        "whose spread the interval covers) and predict --ranks ranks")
    p.add_argument("--measured", metavar="SUMMARY_JSON", nargs="+", default=None,
                   help="--from-run: summaries measured at --ranks, to compare the prediction with (and the naive "
                        "guess: the calibration's own speed-up)")
    p.add_argument("--ranks", type=int, default=None, help="--from-run: ranks to predict")
    p.add_argument("--cpu-cores", type=int, default=None, help="--from-run on a CPU test bed: the cores the ranks "
                                                                "(of baseline and policy run together) share")
    p.add_argument("--codec-throughput", metavar="SPEC", help="measure one codec's GB/s on this machine "
                                                               "(encode_rows with error feedback + decode_rows); JSON on stdout")
    p.add_argument("--codec-numel", type=int, default=1 << 22, help="--codec-throughput: values per measurement")
    p.add_argument("--no-feedback", action="store_true", help="--codec-throughput: encode without error feedback")
    return p


_DEFAULTS = {"layers": 4, "hidden": 128, "heads": 4, "seq": 128, "vocab": 256, "micro_batch": 4, "micro_batches": 2,
             "dp": 2, "tp": 1, "pp": 2, "zero": 1, "dtype": "float32"}
#: the make target that writes a summary at each path the README names
_MAKES = {"results/convergence": "make convergence", "results/shaped": "make e2e-shaped (as root)",
          "results/demo": "make demo"}


def load_summary(path: str) -> dict:
    """A run's summary.json, or a CcollError naming the command that makes it (a ccoll.convergence.shaped report
    gives its first rate's summary)."""
    if not os.path.exists(path):
        make = next((m for d, m in _MAKES.items() if os.path.normpath(path).startswith(d)), None)
        raise CcollError(f"{path}: no such summary; "
                         + (f"`{make}` writes it" if make else "`python -m ccoll.convergence --out DIR` (bytes, "
                            "--validate) or `python -m ccoll.convergence.shaped --out DIR` (shaped links, --from-run) "
                            "writes DIR/summary.json"))
    with open(path) as f:
        try:
            summary = json.load(f)
        except json.JSONDecodeError as e:
            raise CcollError(f"{path}: not a summary (JSON: {e})") from None
    if "rates" in summary:  # a ccoll.convergence.shaped report: its (first) rate's summary
        summary = next(iter(summary["rates"].values()))["summary"]
    if "meta" not in summary or "policies" not in summary:
        raise CcollError(f"{path}: not a ccoll.convergence summary (no meta / policies)")
    return summary


def build_layout(args) -> tuple:
    """The layout, the flat Cluster and the MFU from the command line: a preset (its fields, then any option given
    overrides them) or the layout options (their defaults), then the framework knobs."""
    given = {k: getattr(args, k) for k in _DEFAULTS if getattr(args, k) is not None}
    if args.preset:
        lay, cl = PRESETS[args.preset]
        lay = dataclasses.replace(lay, **given)
        mfu = cl.mfu if args.mfu is None else args.mfu
    else:
        mfu = 0.35 if args.mfu is None else args.mfu
        extra = RUNNER if args.runner else {}
        fields = {**_DEFAULTS, **given}
        lay = Layout(**{**fields, **{k: v for k, v in extra.items() if k not in ("vocab", "zero", "dtype")},
                        **({"dtype": "float32"} if args.runner and "dtype" not in given else {})})
        cl = Cluster(tp_gbps=args.tp_gbps, inter_gbps=args.inter_gbps, codec_gbps=args.codec_gbps or 100.0,
                     decode_gbps=args.decode_gbps, compute_s=args.compute_s, peak_tflops=args.peak_tflops, mfu=mfu,
                     dp_overlap=args.dp_overlap)
    knobs = {}
    if args.grad_dtype:
        knobs["grad_dtype"] = args.grad_dtype
    if args.distributed_optimizer:
        if args.zero not in (None, 1) or args.zero_reduce == "all_reduce":
            raise CcollError("--distributed-optimizer is ZeRO-1 with a reduce-scatter of gradients: it contradicts "
                             f"--zero {args.zero} / --zero-reduce {args.zero_reduce}")
        knobs.update(zero=1, zero_reduce="reduce_scatter")
    if args.zero_reduce:
        knobs["zero_reduce"] = args.zero_reduce
    for k in ("recompute", "parallel_residual", "flash_attention", "sequence_parallel", "pp_mask"):
        if getattr(args, k) is not None:
            knobs[k] = getattr(args, k)
    if args.dp_bucket_mb is not None:
        knobs["dp_bucket_bytes"] = int(args.dp_bucket_mb * (1 << 20))
    lay = dataclasses.replace(lay, **knobs)
    lay.check()
    if args.preset:
        cl = dataclasses.replace(cl, codec_gbps=args.codec_gbps or 100.0, decode_gbps=args.decode_gbps)
    return lay, cl, mfu


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cluster_template:
            from .clusters import write_template
            write_template(args.cluster_template)
            print(f"# wrote {args.cluster_template}: fill in your node's figures and sources, then "
                  f"python -m ccoll.model --cluster {args.cluster_template} ...")
            return 0
        if args.codec_throughput:
            torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
            print(json.dumps(codec_throughput(args.codec_throughput, args.codec_numel, feedback=not args.no_feedback)))
            return 0
        if args.validate:
            summary = load_summary(args.validate)
            res = validate(summary, link_gbps=args.link_gbps, codec_gbps=args.codec_gbps or 1.0,
                           decode_gbps=args.decode_gbps, ranks_per_node=args.ranks_per_node)
            print(f"# ccoll.model --validate {args.validate}: bytes per step summed over ranks, tolerance "
                  f"{100 * res['tolerance']:.0f}%")
            print(f"#{'policy':<14} {'dim':<4} {'pred raw':>12} {'meas raw':>12} {'pred wire':>12} {'meas wire':>12} ok")
            for name, e in res["policies"].items():
                for d, r in e["dims"].items():
                    print(f" {name:<14} {d:<4} {r['predicted_raw']:>12.0f} {r['measured_raw']:>12.0f} "
                          f"{r['predicted_wire']:>12.0f} {r['measured_wire']:>12.0f} {'yes' if r['ok'] else 'NO'}")
            for name, e in res["policies"].items():
                pred = e.get("predicted_speedup")
                print(f"# {name}: measured speedup {e['measured_speedup']:.3f}x, predicted "
                      + (f"{pred:.3f}x at {e['link_gbps']:g} Gbit/s" if pred else "- (no link rate: unshaped run)"))
                if pred:
                    print(f"#   {format_step(e['predicted_step'])}; measured step {e['measured_step_s']:.3f} s")
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(res, f, indent=1)
            return 0 if res["ok"] else 1
        table = None
        if args.codec_table:
            from .timing import load_codec_table
            table = load_codec_table(args.codec_table)
        if args.published:
            from .published import print_published, published
            from .scored import ROWS, print_scored, score
            from .published import MFU
            res = score(ROWS, MFU, table) if ROWS else None
            print_scored(res, ROWS)
            rows = published(args.cluster or "lassen", table)
            print_published(rows)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"scored": res, "envelope": rows}, f, indent=1, default=str)
            return 0
        if args.from_run:
            from .fromrun import from_runs, print_from_runs
            if not args.ranks:
                raise CcollError("--from-run needs --ranks N")
            summaries = [load_summary(p) for p in args.from_run]
            measured = [load_summary(p) for p in args.measured] if args.measured else None
            res = from_runs(summaries, args.ranks, link_gbps=args.link_gbps, cores=args.cpu_cores, measured=measured)
            print_from_runs(res, args.from_run)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(res, f, indent=1)
            return 0
        if args.clusters:
            rows = cluster_table(args.policy or ["configs/hybrid.yaml"], args.codec_gbps)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1)
            return 0
        lay, cl, mfu = build_layout(args)
        if args.preset and not args.cluster:  # a preset carries its sourced node: never the flat per-GPU rates
            args.cluster = preset_cluster(args.preset)
            print(f"# --preset {args.preset}: on its node file {args.cluster} (configs/clusters/{args.cluster}.yaml);"
                  f" --cluster NAME_OR_YAML for another")
        if (args.rails or args.rail_gbps) and not args.cluster:
            raise CcollError("--rails / --rail-gbps change a node file: give --cluster NAME_OR_YAML")
        pol = args.policy[0] if args.policy else None
        node = None
        if args.cluster:  # the node file and the memory check before anything is printed
            from .clusters import load_cluster, with_rails
            from .memory import require
            node = with_rails(load_cluster(args.cluster), args.rails, args.rail_gbps)
            mem = require(lay, node)
        print_traffic(lay, pol)
        if node is not None:
            from .timing import predict
            kw = dict(mfu=mfu, compute_s=args.compute_s, codec_table=table, algorithm=args.algorithm,
                      dp_overlap=args.dp_overlap > 0,
                      codec_gbps=(args.codec_gbps, args.decode_gbps or args.codec_gbps) if args.codec_gbps else None)
            base = predict(lay, node, None, **kw)
            t = predict(lay, node, pol, **kw)
            print(f"# on {node.name}{' (' + node.machine + ')' if node.machine else ''}: {node.gpus_per_node} x "
                  f"{node.gpu} per node, {node.rails_per_node} x {node.rail_gbps:g} Gbit/s rails (achieved "
                  f"{node.rail_data_gbps:.4g}), intra {node.intra_gbps:g} Gbit/s per GPU (achieved "
                  f"{node.intra_data_gbps:.4g}), MFU {mfu:g}, placement k={t['placement']['k']}; codec "
                  + (f"{args.codec_gbps:g} GB/s" if args.codec_gbps else "at the GPU's memory roofline"
                     + (" or the --codec-table" if table else "")))
            print(f"# {format_step(t)}; native {base['total_s']:.3f} s; speedup {base['total_s'] / t['total_s']:.3f}x")
            if pol is not None:
                kw.pop("codec_gbps")
                print(f"# {why_line_node(lay, node, pol, args.target_speedup, **kw)}")
            if mem is not None:
                print(f"# memory: >= {mem['bytes']['total'] / (1 << 30):.1f} GiB per GPU (stage {mem['stage']}, a lower "
                      f"bound with the CUDA context and one gradient bucket) of {node.memory_gib:g} GiB: may fit")
            return 0
        base = step_time(lay, cl, None)
        t = step_time(lay, cl, pol)
        print(f"# step time (busiest stage {t['stage']}): compute {t['compute_s']:.4f} s, tp {t['link_s']['tp']:.4f} s, "
              f"pp {t['link_s']['pp']:.4f} s, dp {t['link_s']['dp']:.4f} s, codec {t['codec_s']:.4f} s, "
              f"total {t['total_s']:.4f} s; native {base['total_s']:.4f} s; speedup {base['total_s'] / t['total_s']:.3f}x")
        if pol is not None:
            print(f"# {why_line(lay, cl, pol, args.target_speedup)}")
        return 0
    except (CcollError, OSError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
