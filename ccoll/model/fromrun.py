"""A run's own measurements against the model: ``--validate SUMMARY`` (bytes and speedup at the run's scale) and
``--from-run SUMMARY --ranks N`` (calibrate on the user's small run, predict N ranks).

Why: public specs leave out what a user's run measures for free -- its compute time per step, what its codec
really achieves under training's contention, its exact bytes. A run on one node (or a few) measures those;
only the link model has to carry the prediction to N.

Both use the mechanistic step time (:func:`ccoll.model.timing.predict`) on the run's test bed as a cluster
(:func:`ccoll.model.clusters.shaped_node`: ccoll.bench.netem gives every rank its own link of the run's rate, so
each rank is a one-GPU node), with the pipeline schedule, DP after it, and codec work pipelined with the wire
over ccoll's segments, as on a real cluster.

What is measured and what is assumed:
    measured  compute per step = the baseline's measured step minus the model's baseline wire time at the run's
              link rate; per-rank compute stays the same at N ranks (DP grows, the batch per rank does not: weak
              scaling); the codec's encode/decode GB/s (``codec_in_run`` of the policy's summary, the host clock
              around every batched codec call); bytes per call (the model's, checked against ``ccoll.stats`` by
              ``validate``)
    assumed   the link rate at N ranks (the run's netem rate, or ``link_gbps``), one link per rank as netem gives
CPU test beds (``cores``): when the ranks are processes sharing ``cores`` CPU cores (ccoll.convergence.shaped
runs baseline and policy at once: ``runs`` = 2), each process gets cores / processes of a core once processes
exceed cores, so compute and codec time scale by max(1, P_N / cores) / max(1, P_measured / cores), P = ranks x
runs. Linear in the share: an upper bound, since ranks waiting on a link leave their core to others. And once
P >= cores no core is free to encode one segment while another is on the wire, so codec and wire add up
(``predict(overlap_codec=False)``). Off (None) for GPU runs, where each rank has its own device and the codec
overlaps the wire on its side stream.

Interval: the model's own error at the measured scale (|predicted / measured speedup - 1| of the run itself)
applied to the prediction at N: what the calibration could not explain is assumed to carry over, no more.
"""
from __future__ import annotations

import dataclasses
import os

from ..errors import CcollError
from .core import DIMS, _close, _rate_gbps, per_dim, runner_layout, traffic


def _calibrated(lay, node, base_step: float) -> float:
    """Compute seconds per step: the baseline's measured step minus its predicted wire (never below 0)."""
    from .timing import predict

    return max(0.0, base_step - predict(lay, node, None, compute_s=0.0)["total_s"])


def codec_overlaps(ranks: int, cores: int | None, runs: int) -> bool:
    """Can codec work overlap the wire (see the module docstring)? Always on GPUs (``cores`` None)."""
    return cores is None or ranks * runs < cores


def validate(summary: dict, policy_dir: str | None = None, tolerance: float = 0.05, link_gbps: float | None = None,
             codec_gbps: float = 1.0, decode_gbps: float | None = None, cores: int | None = None,
             runs: int = 2, ranks_per_node: int | None = None) -> dict:
    """Compare the model with a convergence summary: per policy and dimension, predicted vs measured raw
    and wire bytes (per step, summed over ranks; ``ok`` when within ``tolerance``), and predicted vs
    measured speedup over the baseline (compute taken from the baseline's measured step time minus its
    predicted wire time at ``link_gbps``; meaningful only for runs on shaped links). ``cores``, ``runs``: a CPU
    test bed's cores and the runs sharing them (see the module docstring). ``ranks_per_node``: the run's node map
    (``CCOLL_NODE_MAP=L``: L consecutive ranks per node), so ``hierarchy: node`` calls count as ccoll.stats records
    them (:func:`ccoll.model.core.hierarchy_nbytes`); default the summary's ``meta.ranks_per_node``, else none."""
    from .clusters import shaped_node
    from .timing import predict

    meta = summary["meta"]
    lay = runner_layout(meta)
    steps = meta["steps"]
    ranks_per_node = ranks_per_node or meta.get("ranks_per_node")
    policies = meta.get("policies") or list(summary["policies"])
    paths = {os.path.splitext(os.path.basename(p))[0]: p for p in policies}
    out = {"layout": dataclasses.asdict(lay), "tolerance": tolerance, "policies": {}, "ok": True}
    base = summary["policies"][summary["baseline"]]
    gbps = link_gbps or _rate_gbps(meta.get("netem_rate"))
    base_step = meta["global_batch"] / base["samples_per_s"] if base["samples_per_s"] else None
    node = shaped_node(gbps) if gbps else None
    comp = _calibrated(lay, node, base_step) if node and base_step else None
    for name, p in summary["policies"].items():
        path = paths.get(name)
        if path == "unpatched" or path is None:
            pol = None
        else:
            pol = path if policy_dir is None else os.path.join(policy_dir, os.path.basename(path))
        pred = per_dim(traffic(lay, pol, steps=steps, ranks_per_node=ranks_per_node))
        dims = {}
        for d in DIMS:
            meas = {k: p["bytes"][d][k] / steps for k in ("raw", "wire")}
            row = {"predicted_raw": pred[d]["raw"], "measured_raw": meas["raw"], "predicted_wire": pred[d]["wire"],
                   "measured_wire": meas["wire"]}
            row["ok"] = all(_close(pred[d][k], meas[k], tolerance) for k in ("raw", "wire"))
            out["ok"] &= row["ok"]
            dims[d] = row
        entry = {"dims": dims, "measured_speedup": p["samples_per_s"] / base["samples_per_s"]}
        if comp is not None:
            kw = dict(compute_s=comp, codec_gbps=(codec_gbps, decode_gbps or codec_gbps),
                      overlap_codec=codec_overlaps(lay.world, cores, runs))
            predicted = predict(lay, node, pol, **kw)
            entry["predicted_speedup"] = predict(lay, node, None, **kw)["total_s"] / predicted["total_s"]
            entry["predicted_step"] = predicted
            entry["measured_step_s"] = meta["global_batch"] / p["samples_per_s"]
            entry["link_gbps"] = gbps
        out["policies"][name] = entry
    return out


def from_run(summary: dict, ranks: int, link_gbps: float | None = None, policy_dir: str | None = None,
             cores: int | None = None, runs: int = 2) -> dict:
    from .clusters import shaped_node
    from .timing import predict

    meta = summary["meta"]
    lay = runner_layout(meta)
    per_dp = lay.tp * lay.pp
    if ranks % per_dp:
        raise CcollError(f"--ranks {ranks}: must be a multiple of tp x pp = {per_dp}")
    gbps = link_gbps or _rate_gbps(meta.get("netem_rate"))
    if not gbps:
        raise CcollError("--from-run: the run has no netem_rate (unshaped); give --link-gbps")
    node = shaped_node(gbps)
    base = summary["policies"][summary["baseline"]]
    base_step = meta["global_batch"] / base["samples_per_s"]
    slow = 1.0
    if cores:
        slow = max(1.0, ranks * runs / cores) / max(1.0, lay.world * runs / cores)
    out = {"ranks": ranks, "measured_ranks": lay.world, "link_gbps": gbps, "cpu_slowdown": slow, "policies": {}}
    big = dataclasses.replace(lay, dp=ranks // per_dp)
    policies = meta.get("policies") or list(summary["policies"])
    paths = {os.path.splitext(os.path.basename(p))[0]: p for p in policies}
    comp = _calibrated(lay, node, base_step)
    for name, p in summary["policies"].items():
        if name == summary["baseline"]:
            continue
        inrun = p.get("codec_in_run") or {}
        enc, dec = inrun.get("encode_gbps"), inrun.get("decode_gbps")
        if not enc:
            raise CcollError(f"--from-run: policy {name} has no codec_in_run (run with ccoll.stats codec timing)")
        path = paths.get(name)
        pol = path if policy_dir is None else os.path.join(policy_dir, os.path.basename(path))
        small = validate(summary, policy_dir=policy_dir, link_gbps=gbps, codec_gbps=enc, decode_gbps=dec, cores=cores,
                         runs=runs)
        e = small["policies"][name]
        err = abs(e["predicted_speedup"] / e["measured_speedup"] - 1)
        kw = dict(compute_s=comp * slow, codec_gbps=(enc / slow, (dec or enc) / slow),
                  overlap_codec=codec_overlaps(ranks, cores, runs))
        b, t = predict(big, node, None, **kw), predict(big, node, pol, **kw)
        sp = b["total_s"] / t["total_s"]
        samples = big.micro_batch * big.micro_batches * big.dp
        out["policies"][name] = {"measured_speedup": e["measured_speedup"], "predicted_speedup_measured_scale":
                                 e["predicted_speedup"], "predicted_speedup": sp,
                                 "interval": (sp * (1 - err), sp * (1 + err)), "relative_error_at_measured_scale": err,
                                 "compute_s": comp, "encode_gbps": enc, "decode_gbps": dec or enc,
                                 "predicted_step_s": t["total_s"], "predicted_base_step_s": b["total_s"],
                                 "predicted_samples_per_s": samples / t["total_s"],
                                 "predicted_base_samples_per_s": samples / b["total_s"]}
    return out
