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


def _stats(xs: list[float]) -> dict:
    """Mean, min, max and relative half-range of repeated measurements (half-range 0 for one)."""
    m = sum(xs) / len(xs)
    return {"values": list(xs), "mean": m, "min": min(xs), "max": max(xs),
            "half_range": (max(xs) - min(xs)) / 2 / m if m else 0.0}


def from_runs(summaries: list[dict], ranks: int, link_gbps: float | None = None, policy_dir: str | None = None,
              cores: int | None = None, runs: int = 2, measured: list[dict] | None = None) -> dict:
    """:func:`from_run` over repeated runs of one configuration, honest about their noise.

    Per policy: the prediction at ``ranks`` from each calibration run, their mean (the prediction), and an interval
    of relative half-width = the model's miss at the measured scale (mean over runs of |predicted / measured speed-up
    - 1|) + the run-to-run half-range of the calibration runs' measured speed-ups (what one more run of the same
    configuration may differ by; 0 with one run, so ``spread_known`` False: repeat the run). With ``measured``
    (summaries of runs at ``ranks``): their speed-ups, spread, the prediction's error against their mean, whether the
    interval covers every one, and the naive guess's error (the calibration runs' own mean speed-up, "same speed-up
    as at the small scale")."""
    if not summaries:
        raise CcollError("--from-run: no summaries")
    each = [from_run(s, ranks, link_gbps=link_gbps, policy_dir=policy_dir, cores=cores, runs=runs) for s in summaries]
    small = {e["measured_ranks"] for e in each}
    if len(small) > 1:
        raise CcollError(f"--from-run: the runs were made at different scales ({sorted(small)} ranks): repeat ONE "
                         "configuration")
    out = {"ranks": ranks, "measured_ranks": small.pop(), "runs": len(each), "link_gbps": each[0]["link_gbps"],
           "cpu_slowdown": each[0]["cpu_slowdown"], "policies": {}}
    meas_at_n = {}
    for s in measured or []:
        base = s["policies"][s["baseline"]]
        if s["meta"]["dp"] * s["meta"]["tp"] * s["meta"]["pp"] != ranks:
            raise CcollError(f"--measured: a run at {s['meta']['dp'] * s['meta']['tp'] * s['meta']['pp']} ranks, "
                             f"not --ranks {ranks}")
        for name, p in s["policies"].items():
            if name != s["baseline"]:
                meas_at_n.setdefault(name, []).append(p["samples_per_s"] / base["samples_per_s"])
    for name in each[0]["policies"]:
        preds = [e["policies"][name]["predicted_speedup"] for e in each]
        cal = _stats([e["policies"][name]["measured_speedup"] for e in each])
        miss = sum(e["policies"][name]["relative_error_at_measured_scale"] for e in each) / len(each)
        p = sum(preds) / len(preds)
        half = miss + cal["half_range"]
        entry = {"predicted_speedup": p, "predictions": preds, "interval": (p * (1 - half), p * (1 + half)),
                 "model_miss_at_measured_scale": miss, "calibration": cal, "spread_known": len(each) > 1,
                 "naive_guess": cal["mean"]}
        if name in meas_at_n:
            m = _stats(meas_at_n[name])
            entry["measured"] = m
            entry["error"] = p / m["mean"] - 1
            entry["naive_error"] = cal["mean"] / m["mean"] - 1
            entry["covers"] = all(entry["interval"][0] <= v <= entry["interval"][1] for v in m["values"])
        out["policies"][name] = entry
    return out


def print_from_runs(res: dict, paths, file=None) -> None:
    import sys

    file = sys.stdout if file is None else file
    print(f"# ccoll.model --from-run ({res['runs']} run(s) at {res['measured_ranks']} ranks: {', '.join(paths)}): "
          f"predicted at {res['ranks']} ranks, {res['link_gbps']:g} Gbit/s links, CPU slowdown {res['cpu_slowdown']:g}x",
          file=file)
    for name, e in res["policies"].items():
        lo, hi = e["interval"]
        c = e["calibration"]
        print(f" {name}: predicted {e['predicted_speedup']:.3f}x at {res['ranks']} ranks [{lo:.3f}, {hi:.3f}] "
              f"(model miss at {res['measured_ranks']} ranks {100 * e['model_miss_at_measured_scale']:.1f}% + run-to-run "
              f"+-{100 * c['half_range']:.1f}%); measured at {res['measured_ranks']} ranks "
              + ", ".join(f"{v:.3f}x" for v in c["values"]), file=file)
        if not e["spread_known"]:
            print(f"   one calibration run: its run-to-run spread is unknown and NOT in the interval -- repeat the run "
                  f"(pass every summary to --from-run)", file=file)
        if "measured" in e:
            m = e["measured"]
            print(f"   measured at {res['ranks']} ranks: " + ", ".join(f"{v:.3f}x" for v in m["values"])
                  + f" (mean {m['mean']:.3f}x, +-{100 * m['half_range']:.1f}%): prediction {100 * e['error']:+.1f}%, "
                  f"naive guess (the {res['measured_ranks']}-rank speed-up {e['naive_guess']:.3f}x) "
                  f"{100 * e['naive_error']:+.1f}%; interval {'covers' if e['covers'] else 'does NOT cover'} every run",
                  file=file)
