"""``python -m ccoll.model --from-run SUMMARY --ranks N``: calibrate on the user's own small run, predict N ranks.

Why: public specs leave out what a user's run measures for free -- its compute time per step, what its codec
really achieves under training's contention, its exact bytes. A run on one node (or a few) measures those;
only the link model has to carry the prediction to N.

What is measured and what is assumed:
    measured  compute per step = the baseline's measured step minus the model's baseline wire time at the run's
              link rate (as ``validate``); per-rank compute stays the same at N ranks (DP grows, the batch per
              rank does not: weak scaling); the codec's encode/decode GB/s (``codec_in_run`` of the policy's
              summary, the host clock around every batched codec call); bytes per call (the model's, checked
              against ``ccoll.stats`` by ``validate``)
    assumed   the link rate at N ranks (the run's netem rate, or ``link_gbps``) and the alpha-beta per-rank
              bandwidth-optimal algorithm (ccoll.model.step_time)
CPU test beds (``cores``): when the ranks are processes sharing ``cores`` CPU cores (ccoll.convergence.shaped
runs baseline and policy at once: ``runs`` = 2), each process gets cores / processes of a core once processes
exceed cores, so compute and codec time scale by max(1, P_N / cores) / max(1, P_measured / cores), P = ranks x
runs. Linear in the share: an upper bound, since ranks waiting on a link leave their core to others. Off (None)
for GPU runs, where each rank has its own device.

Interval: the model's own error at the measured scale (|predicted / measured speedup - 1| of the run itself)
applied to the prediction at N: what the calibration could not explain is assumed to carry over, no more.
"""
from __future__ import annotations

import dataclasses
import os

from ..errors import CcollError


def from_run(summary: dict, ranks: int, link_gbps: float | None = None, policy_dir: str | None = None,
             cores: int | None = None, runs: int = 2) -> dict:
    from .core import Cluster, _rate_gbps, runner_layout, step_time, validate

    meta = summary["meta"]
    lay = runner_layout(meta)
    per_dp = lay.tp * lay.pp
    if ranks % per_dp:
        raise CcollError(f"--ranks {ranks}: must be a multiple of tp x pp = {per_dp}")
    gbps = link_gbps or _rate_gbps(meta.get("netem_rate"))
    if not gbps:
        raise CcollError("--from-run: the run has no netem_rate (unshaped); give --link-gbps")
    base = summary["policies"][summary["baseline"]]
    base_step = meta["global_batch"] / base["samples_per_s"]
    slow = 1.0
    if cores:
        slow = max(1.0, ranks * runs / cores) / max(1.0, lay.world * runs / cores)
    out = {"ranks": ranks, "measured_ranks": lay.world, "link_gbps": gbps, "cpu_slowdown": slow, "policies": {}}
    big = dataclasses.replace(lay, dp=ranks // per_dp)
    policies = meta.get("policies") or list(summary["policies"])
    paths = {os.path.splitext(os.path.basename(p))[0]: p for p in policies}
    for name, p in summary["policies"].items():
        if name == summary["baseline"]:
            continue
        inrun = p.get("codec_in_run") or {}
        enc, dec = inrun.get("encode_gbps"), inrun.get("decode_gbps")
        if not enc:
            raise CcollError(f"--from-run: policy {name} has no codec_in_run (run with ccoll.stats codec timing)")
        path = paths.get(name)
        pol = path if policy_dir is None else os.path.join(policy_dir, os.path.basename(path))
        small = validate(summary, policy_dir=policy_dir, link_gbps=gbps, codec_gbps=enc, decode_gbps=dec)
        e = small["policies"][name]
        err = abs(e["predicted_speedup"] / e["measured_speedup"] - 1)
        cl = Cluster(tp_gbps=gbps, inter_gbps=gbps, codec_gbps=enc, decode_gbps=dec, compute_s=0.0)
        comp = max(0.0, base_step - step_time(lay, cl, None)["total_s"])
        cl = dataclasses.replace(cl, compute_s=comp * slow, codec_gbps=enc / slow,
                                 decode_gbps=(dec / slow) if dec else None)
        b, t = step_time(big, cl, None), step_time(big, cl, pol)
        sp = b["total_s"] / t["total_s"]
        out["policies"][name] = {"measured_speedup": e["measured_speedup"], "predicted_speedup_measured_scale":
                                 e["predicted_speedup"], "predicted_speedup": sp,
                                 "interval": (sp * (1 - err), sp * (1 + err)), "relative_error_at_measured_scale": err,
                                 "compute_s": comp, "encode_gbps": enc, "decode_gbps": dec or enc,
                                 "predicted_step_s": t["total_s"], "predicted_base_step_s": b["total_s"],
                                 "predicted_samples_per_s": big.micro_batch * big.micro_batches * big.dp / t["total_s"],
                                 "predicted_base_samples_per_s": big.micro_batch * big.micro_batches * big.dp / b["total_s"]}
    return out
