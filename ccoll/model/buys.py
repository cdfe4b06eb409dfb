"""What a policy would buy on named clusters, from a run's own measured bytes per dimension.

Why: the demo trains a tiny model on loopback, where bytes cost nothing and every codec call only adds
time, so its samples/s says nothing about a real cluster. What it does measure is how much smaller each
dimension's traffic gets under the policy (wire / raw bytes, counted by ``ccoll.stats``). Carried to a real
workload -- GPT-NeoX-20B at 192 GPUs in a layout that fits a 16 GB V100 (``LAYOUTS``: TP 4 x PP 4 x DP 12,
micro-batch 1, 4 or 16 micro-batches; 20B.yml's own TP 2 x PP 4, micro-batch 4 does not fit) -- on a sourced node
(``configs/clusters``), that fraction of each dimension's native wire time plus the policy's codec time
(roofline of that GPU) against the native step is what the policy would buy there.

    speedup = native step / (compute + sum_d measured_wire_d / raw_d x native wire_d + codec)

Assumptions, said where printed: the real workload's traffic compresses per dimension as the demo's did;
native algorithms on the wire (ccoll's all-to-all for compressed all-reduce would cost more across nodes).
"""
from __future__ import annotations

import os
import sys

DEFAULT_CLUSTERS = ("lassen", "dgx-a100", "dgx-h100")


def _layouts():
    from .published import SEED_LAYOUTS

    return [SEED_LAYOUTS[0], SEED_LAYOUTS[2]]
#: fraction of dense peak reached (Megatron-LM's V100 figure, see published.py; for A100/H100 the same 0.30
#: keeps the comparison about the links -- Megatron reports more on A100, which only shrinks the gains)
MFU = 0.30


def what_it_buys(summary: dict, clusters=DEFAULT_CLUSTERS, layouts=None) -> list[dict]:
    """One row per (layout, cluster, policy); ``layouts``: [(label, Layout)] (default ``_layouts()``). A layout that
    does not fit a cluster's GPUs gives one row with ``refused`` (the memory check's message), never a speed-up."""
    from .clusters import load_cluster
    from ..errors import PolicyError
    from ..policy import find_policy
    from .memory import InfeasibleLayout
    from .timing import predict

    rows = []
    for label, lay in (layouts or _layouts()):
        rows += _buys_one(summary, clusters, label, lay, load_cluster, PolicyError, find_policy, InfeasibleLayout,
                          predict)
    return rows


def _buys_one(summary, clusters, label, lay, load_cluster, PolicyError, find_policy, InfeasibleLayout, predict):
    rows = []
    base_name = summary["baseline"]
    paths = {os.path.splitext(os.path.basename(p))[0]: p for p in summary["meta"].get("policies", [])}
    for c in clusters:
        node = load_cluster(c)
        if lay.dtype not in node.peak_tflops:
            continue
        try:
            base = predict(lay, node, None, mfu=MFU)
        except InfeasibleLayout as e:
            rows.append({"cluster": c, "gpu": node.gpu, "layout": label, "refused": str(e)})
            continue
        for name, p in summary["policies"].items():
            if name == base_name or name == "unpatched":
                continue
            frac = {d: (b["wire"] / b["raw"] if b.get("raw") else 1.0) for d, b in p["bytes"].items()}
            path = paths.get(name)
            if path and not os.path.exists(path):
                try:  # a run's relative configs/<name>.yaml read from elsewhere: the shipped policy of that name
                    path = find_policy(path)
                except PolicyError:
                    path = None
            codec = predict(lay, node, path, mfu=MFU)["codec_s"] if path and os.path.exists(path) else 0.0
            wire = {d: base["link_s"][d] * frac.get(d, 1.0) for d in base["link_s"]}
            step = base["compute_s"] + sum(wire.values()) + codec
            rows.append({"cluster": c, "gpu": node.gpu, "layout": label, "policy": name, "fraction": frac,
                         "native_step_s": base["total_s"],
                         "step_s": step, "speedup": base["total_s"] / step, "native_wire_s": base["link_s"],
                         "codec_s": codec})
    return rows


def print_buys(summary: dict, clusters=DEFAULT_CLUSTERS, file=None) -> list[dict]:
    file = sys.stdout if file is None else file
    rows = what_it_buys(summary, clusters)
    print("\n## What would it buy on a real cluster?\n", file=file)
    print("This run is on loopback, where bytes are free: any codec only costs time here, so the samples/s above "
          "is not the speed-up. What the run does measure is each dimension's wire/raw bytes under the policy. "
          "Applied to GPT-NeoX-20B on 192 GPUs in a layout that fits a 16 GB V100 (TP 4 x PP 4 x DP 12, micro-batch "
          "1, ZeRO-1, recomputation; GPT-NeoX's 20B.yml layout, TP 2 x PP 4 with micro-batches of 4, does not fit "
          "one) with 4 or 16 micro-batches per step, on sourced nodes (configs/clusters; `python -m ccoll.model "
          "--cluster NAME`), MFU 0.30, codec at the GPU's memory roofline:\n", file=file)
    print("| layout | cluster | policy | wire/raw dp, tp, pp (measured here) | native step s | with policy s | speed-up |",
          file=file)
    print("|---|---|---|---|---:|---:|---:|", file=file)
    for r in rows:
        if "refused" in r:
            print(f"| {r['layout']} | {r['cluster']} ({r['gpu']}) | - | refused: does not fit | | | |", file=file)
            continue
        f = r["fraction"]
        print(f"| {r['layout']} | {r['cluster']} ({r['gpu']}) | {r['policy']} | {f.get('dp', 1):.2f}, "
              f"{f.get('tp', 1):.2f}, {f.get('pp', 1):.2f} | {r['native_step_s']:.1f} | {r['step_s']:.1f} | "
              f"{r['speedup']:.3f}x |", file=file)
    print("\nA dimension the demo does not exercise (wire/raw 1.00) is counted uncompressed. The gain shrinks with "
          "more micro-batches per step (compute grows, DP's once-a-step bytes do not) and with faster NICs per GPU; "
          "`python -m ccoll.model --published` shows the scored protocol and the seed paper's envelope check.",
          file=file)
    return rows
