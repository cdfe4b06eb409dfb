"""Step time from mechanisms: placement on nodes, alpha-beta per message, collective algorithm, rails
shared by a node's GPUs, codec roofline, pipelining of codec work with the wire, the pipeline schedule.

Why: the old ``step_time`` charged every byte at one per-GPU rate; the same bytes cost very different
time depending on whether a group is inside a node (NVLink), how many of a group's members share a node
(a ring leaves a node once per group, an all-to-all once per member), and how many GPUs share the node's
NICs. Each of those is computed here from the cluster file; nothing is fitted.

Placement (Megatron / GPT-NeoX / DeepSpeed topology, axes pipe > data > model, model fastest): a TP group is
``tp`` consecutive ranks, DP members are ``tp`` apart, PP neighbours ``tp*dp`` apart; nodes hold
``gpus_per_node`` consecutive ranks. ``k`` = members of one group on a node.

The per-call forms are nccl-tests' (doc/PERFORMANCE.md): time = overhead + size / bandwidth, with the bus-bandwidth
factors of the bandwidth-optimal algorithms -- all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n, broadcast
and reduce 1 (so DeepSpeed's pipeline p2p, a broadcast in a 2-rank group, costs a send). The per-message overhead
``a`` is the cluster file's latency; achieved bandwidth below the link's is modelled by its causes below (rails
shared, packet headers, algorithm) and, where the cluster file cites one, by a published large-message measurement
of that link under that library (``achieved_*``: :mod:`ccoll.model.clusters`; ``B_i`` and ``B_n`` below are those
achieved rates), never by a factor chosen to match a result.

Per call, ``W`` = bytes a rank contributes on the wire, ``n`` = group size, ``B_i`` = intra-node Gbit/s per
GPU, ``B_n`` = the node's inter-node Gbit/s (rails x rail x payload efficiency), ``g`` = GPUs per node (all
running the same dimension's collective at once -- true for DP at the end of a step and for TP/PP, whose
groups are symmetric), ``a`` = per-message latency:

    inside a node (k = n):   all_reduce 2(n-1)(a + W/(n B_i));  reduce_scatter (n-1)(a + W/(n B_i));
                             all_gather (n-1)(a + W/B_i);        send a + W/B_i
    across nodes:            time = g x e / B_n + messages x a, with e = bytes one GPU sends off its node:
      native ring (node-ordered)     all_reduce e = 2(n-1)/n W/k     reduce_scatter (n-1)/n W/k
                                     all_gather  e = (n-1) W/k (W = the shard)
      native hierarchical (k > 1)    all_reduce e = 2(n/k-1)/(n/k) W/k  (intra reduce-scatter, inter ring,
                                     intra all-gather)
      ccoll compressed all_reduce    all-to-all of encoded chunks (direct: (n-k)/n W off the node) + ring
                                     all-gather of the reduced chunk ((n-1)/n W/k): e = (n-k)/n W + (n-1)/(n k) W
      ccoll compressed reduce_scatter  e = (n-k)/n W (all-to-all)
      send (PP)                      e = W
      native tree (NCCL's double binary tree over the n/k nodes, a pipelined chain inside each; Jeaugey,
                                     "Massively Scale Your Deep Learning Training with NCCL 2.4", NVIDIA blog 2019):
                                     two trees each carry half of the node's reduced W; a node sends W/2 up each tree
                                     and, as an inner node of one, W/2 to each of 2 children: e = 2 W/k, latency
                                     2 ceil(log2(n/k)) a; the chain adds 2 (W/B_i + (k-1) a_i)
    "auto" takes the fastest of ring, hierarchical and tree for native all-reduces (what NCCL's and MVAPICH2's
    tuners do): the tree wins on latency (log of the nodes), never on bandwidth (2 W against 2 (m-1)/m W).

Codec seconds per call = values encoded / encode rate + values decoded / decode rate (ccoll's passes per
value, ``_CODEC_PASSES``). Rates: a ``--codec-table`` file, else the roofline of a memory-bound kernel on
this GPU: HBM GB/s / bytes moved per value (encode: read the input + write the payload + read and write the
fp32 error-feedback residual when the rule has it; decode: read the payload + write the output). The
roofline is an upper bound; ZFP's transform is compute-heavier than the block quantisers, so a measured
table (``make gpu-check``, ``python -m ccoll.model --codec-throughput``) is better for it.
``hierarchy: node`` (ccoll.collectives.hierarchy; a group within one node is modelled exact, the module's stated
intent -- but note ccoll's router today runs such a group, and one with one member per node, through the flat
compressed path (``nodes.layout_or_flat`` answers None), which ``core.traffic``'s byte counts follow; variable-size
codecs never take it), across nodes, ``N = n/k`` peers of the same local index, ``R`` = raw bytes a rank contributes:
    all_reduce      exact intra reduce-scatter (k-1)(a_i + R/(k B_i)), the compressed all-reduce of the GPU's
                    1/k chunk among N, exact intra all-gather (k-1)(a_i + R/(k B_i)); codec on R/k, group N
    reduce_scatter  exact intra reduce-scatter (k-1)(a_i + R/(k B_i)) (local rank l gets its node's partial sums of
                    the N chunks its peers own), then the compressed reduce-scatter of those R/k among N; codec
                    on R/k, group N
    all_gather      the compressed all-gather of the shard R among N, then an exact intra all-gather of the N
                    decoded shards (k-1)(a_i + N R/B_i); codec: encode R, decode N R
``weight_delta: T`` (ZeRO parameter all-gathers, ccoll.wdelta): the all-gather sends encoded weight changes, and
every T-th optimizer step an exact all-gather re-seeds the reconstruction: a fraction f = 1/T of a once-a-step
call is native, 1 - f the compressed call's wire and codec (``core.refresh_fraction``). The delta is encoded in fp32 (the codec's feedback dtype) and
its roofline counts the reconstruction's traffic (``wdelta_roofline_gbps``).
ccoll pipelines all_reduce (and the spans of reduce_scatter / all_gather) in segments of
``SEGMENT_BYTES``: with ``s`` segments, call time = max(wire, codec) + min(wire, codec) / s (a GPU's side stream;
on a CPU test bed whose processes fill its cores, ``overlap_codec=False``: wire + codec). A send is not
segmented: wire + codec.

Step (1F1B pipeline, DeepSpeed's PipelineEngine and Megatron): every micro-batch's compute, TP collectives
and PP sends are on the critical path and the schedule takes (m + pp - 1) micro-batch slots of the
slowest stage; DP's gradient reduction runs after the schedule (DeepSpeed's pipeline engine reduces
gradients in its last instruction, ``ReduceGrads``: deepspeed/runtime/pipe/engine.py ``_exec_reduce_grads``;
the engine turns the ZeRO optimizer's backward-time reduction off) and is exposed. With pp = 1
and ``dp_overlap`` (DDP's bucket hooks; DeepSpeed ZeRO-1/2 ``overlap_comm``: ``process_gradients`` ->
``reduce_ready_partitions_and_remove_grads`` from each gradient's hook, stage_1_and_2.py) the gradient
reduction of every bucket but the last starts while the last micro-batch's backward still runs: hidden =
min(gradient reduction x (1 - last bucket's share), that backward: 2/3 of the micro-batch's compute, 3/4
with recomputation). The last bucket (``Layout.dp_bucket_bytes``; buckets fill from the end of the backward,
so the last holds the remainder) and ZeRO's parameter all-gather (after the optimizer step) stay exposed.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from ..errors import CcollError
from .clusters import Node

DIMS = ("dp", "tp", "pp")


@dataclass(frozen=True)
class Placement:
    """Members of one group of each dimension on a node (``k``) and whether the group fits in a node."""

    k: dict
    intra: dict


def placement(lay, node: Node) -> Placement:
    from .core import members_per_node

    k = members_per_node(lay, node.gpus_per_node)
    dp_k, pp_k = k["dp"], k["pp"]
    intra = {"tp": lay.tp <= node.gpus_per_node, "dp": dp_k >= lay.dp, "pp": pp_k >= lay.pp}
    return Placement(k, intra)


def call_seconds(op: str, w: float, n: int, k: int, intra: bool, node: Node, compressed: bool,
                 algorithm: str = "auto") -> float:
    """Wire seconds of one call (see the module docstring); ``w`` bytes per rank on the wire."""
    if n <= 1 and op != "send":
        return 0.0
    if intra:
        b, a = node.intra_data_gbps * 1e9 / 8, node.intra_latency_us * 1e-6
        if op == "all_reduce":
            return 2 * (n - 1) * (a + w / (n * b))
        if op == "reduce_scatter":
            return (n - 1) * (a + w / (n * b))
        if op == "all_gather":
            return (n - 1) * (a + w / b)
        return a + w / b
    bn, a, g = node.node_gbps * 1e9 / 8, node.inter_latency_us * 1e-6, node.gpus_per_node
    if op == "send":
        return a + g * w / bn
    if compressed and op == "all_reduce":
        return g * ((n - k) / n * w + (n - 1) / (n * k) * w) / bn + 2 * (n - 1) * a
    if compressed and op == "reduce_scatter":
        return g * (n - k) / n * w / bn + (n - 1) * a
    if op == "all_gather":
        return g * (n - 1) * w / k / bn + (n - 1) * a
    if op == "reduce_scatter":
        return g * (n - 1) / n * w / k / bn + (n - 1) * a
    ring = g * 2 * (n - 1) / n * w / k / bn + 2 * (n - 1) * a
    if k > 1 and n % k == 0:
        m = n // k
        ib = node.intra_data_gbps * 1e9 / 8
        hier = (g * 2 * (m - 1) / m * w / k / bn + 2 * (m - 1) * a
                + 2 * (k - 1) * (node.intra_latency_us * 1e-6 + w / (k * ib)))
    else:
        hier = math.inf
    tree = tree_seconds(w, n, k, node) if n % k == 0 else math.inf
    if algorithm == "ring":
        return ring
    if algorithm == "hierarchical":
        return hier if hier < math.inf else ring
    if algorithm == "tree":
        return tree if tree < math.inf else ring
    return min(ring, hier, tree)


def tree_seconds(w: float, n: int, k: int, node: Node) -> float:
    """Native all-reduce by NCCL's double binary tree across the n/k nodes (see the module docstring)."""
    m = n // k
    bn, a, g = node.node_gbps * 1e9 / 8, node.inter_latency_us * 1e-6, node.gpus_per_node
    chain = 2 * (w / (node.intra_data_gbps * 1e9 / 8) + (k - 1) * node.intra_latency_us * 1e-6) if k > 1 else 0.0
    return g * 2 * w / k / bn + 2 * math.ceil(math.log2(m)) * a + chain


# --- codec rates ---------------------------------------------------------------------------------------------
def roofline_gbps(codec, dtype: torch.dtype, hbm_gbytes_per_s: float, feedback: bool) -> tuple[float, float]:
    """(encode, decode) GB/s of input values of a memory-bound codec kernel: HBM bandwidth x input bytes per
    value / bytes moved per value (see the module docstring)."""
    elt = torch.empty((), dtype=dtype).element_size()
    n = 1 << 20
    wire = codec.encoded_nbytes(n, dtype) / n
    enc = elt + wire + (8 if feedback else 0)
    dec = wire + elt
    return hbm_gbytes_per_s * elt / enc, hbm_gbytes_per_s * elt / dec


def wdelta_roofline_gbps(codec, dtype: torch.dtype, hbm_gbytes_per_s: float) -> tuple[float, float]:
    """(encode, decode) GB/s of input values of ccoll.wdelta's delta all-gather at the memory roofline. Why not
    ``roofline_gbps``: the delta is formed and decoded against an fp32 reconstruction, which the bytes moved
    are dominated by. Per value (``e`` = input bytes, ``r`` = feedback-dtype bytes, ``c`` = payload bytes of an
    fp32 value): encode reads the input and the reconstruction, writes the delta, reads it to encode and
    writes the payload (e + 3r + c); decode (per gathered value) reads the payload, writes the decoded delta,
    reads it and the reconstruction, writes the reconstruction, reads it and writes the output (c + 5r + e)."""
    e = torch.empty((), dtype=dtype).element_size()
    rdt = codec.feedback_dtype(dtype)
    r = torch.empty((), dtype=rdt).element_size()
    n = 1 << 20
    c = codec.encoded_nbytes(n, rdt) / n
    return hbm_gbytes_per_s * e / (e + 3 * r + c), hbm_gbytes_per_s * e / (c + 5 * r + e)


def hierarchy_seconds(op: str, raw: float, w_inter: float, n: int, k: int, node: Node,
                      algorithm: str = "auto") -> float:
    """Wire seconds of one ``hierarchy: node`` call across nodes (see the module docstring): ``raw`` bytes a
    rank contributes, ``w_inter`` the wire bytes of what its compressed inter-node phase carries (all_reduce
    and reduce_scatter: its 1/k chunk of partial sums; all_gather: its encoded shard), ``k`` members per node."""
    a_i, b_i = node.intra_latency_us * 1e-6, node.intra_data_gbps * 1e9 / 8
    peers = n // k
    inter = call_seconds(op, w_inter, peers, 1, False, node, True, algorithm)
    if op == "all_reduce":
        return 2 * (k - 1) * (a_i + raw / (k * b_i)) + inter
    if op == "reduce_scatter":
        return (k - 1) * (a_i + raw / (k * b_i)) + inter
    if op == "all_gather":
        return inter + (k - 1) * (a_i + peers * raw / b_i)
    raise CcollError(f"hierarchy: node has no {op}")


#: the ops ``hierarchy: node`` runs in two levels (ccoll.collectives.hierarchy)
HIER_OPS = ("all_reduce", "reduce_scatter", "all_gather")


def load_codec_table(path: str) -> dict:
    """``{spec or family: {"encode_gbps": x, "decode_gbps": y, "ratio": {dtype: {dim: r}}}}``: measured GB/s of
    input values, and for variable-size codecs (lossless) the measured raw / used bytes per dtype and dimension
    (their ``encoded_nbytes`` is a capacity, not what travels). Either part may be left out (roofline rates;
    capacity bytes). YAML or JSON; a list of ``--codec-throughput`` outputs is accepted too."""
    import yaml

    with open(path) as f:
        d = yaml.safe_load(f)
    if isinstance(d, list):
        d = {e["spec"]: e for e in d}
    if not isinstance(d, dict):
        raise CcollError(f"{path}: codec table must map a codec spec to encode_gbps / decode_gbps")
    out = {}
    for k, v in d.items():
        e = {}
        try:
            if "encode_gbps" in v or "decode_gbps" in v:
                e["rates"] = (float(v["encode_gbps"]), float(v["decode_gbps"]))
            if "ratio" in v:
                e["ratio"] = {str(dt): {str(dim): float(r) for dim, r in per.items()} for dt, per in v["ratio"].items()}
        except (KeyError, TypeError, ValueError, AttributeError):
            raise CcollError(f"{path}: {k}: needs numeric encode_gbps and decode_gbps, and/or ratio: "
                             "{dtype: {dim: raw/used}}") from None
        if not e:
            raise CcollError(f"{path}: {k}: neither rates nor ratio")
        out[str(k)] = e
    return out


def _entry(codec, table: dict | None) -> dict:
    if table:
        for key in (codec.spec, codec.spec.split(":")[0]):
            if key in table:
                return table[key]
    return {}


def measured_ratio(codec, dtype: str, dim: str, table: dict | None) -> float | None:
    """raw / used bytes measured for a variable-size codec on this dtype and dimension, or None."""
    return _entry(codec, table).get("ratio", {}).get(dtype, {}).get(dim)


def codec_rates(codec, dtype, node: Node, feedback: bool, table: dict | None) -> tuple[float, float, str]:
    rates = _entry(codec, table).get("rates")
    if rates:
        return (*rates, "table")
    return (*roofline_gbps(codec, dtype, node.hbm_gbytes_per_s, feedback), "roofline")


def last_bucket_share(lay, stage: int) -> float:
    """Share of a rank's gradient in the last DP bucket (the one only the end of the backward completes):
    ``P`` gradient bytes in buckets of ``Layout.dp_bucket_bytes``, the last holding the remainder."""
    from .core import DTYPES

    p = lay.stage_params(stage) * DTYPES[lay.grad_dtype or lay.dtype].itemsize
    n = max(1, math.ceil(p / lay.dp_bucket_bytes))
    return (p - (n - 1) * lay.dp_bucket_bytes) / p


# --- the step --------------------------------------------------------------------------------------------------
def predict(lay, node: Node, policy=None, *, mfu: float | None = None, codec_table: dict | None = None,
            algorithm: str = "auto", dp_overlap: bool = False, compute_s: float | None = None,
            codec_gbps: tuple | None = None, overlap_codec: bool = True, check_memory: bool = True) -> dict:
    """Predicted seconds per optimizer step on ``node``s: compute, exposed wire per dimension, exposed codec,
    total (see the module docstring). ``mfu``: the fraction of the dtype's dense peak the kernels reach; or
    ``compute_s``: the step's compute measured (all m + pp - 1 slots of the slowest stage, as a run's own step
    minus its predicted wire: ``--validate``, ``--from-run``). ``codec_gbps``: (encode, decode) GB/s measured for
    every codec of the policy (a run's ``codec_in_run``), instead of the table or roofline. ``overlap_codec``:
    whether codec work overlaps the wire over segments -- on a GPU the codec runs on its side stream while the
    NIC moves bytes; on a CPU test bed whose processes fill its cores no core is free for it (``--from-run``
    ``--cpu-cores``), so each call is wire + codec. ``check_memory``: refuse (:class:`ccoll.model.memory.InfeasibleLayout`,
    naming layouts that may fit) a layout whose lower-bound memory exceeds a node file's ``memory_gib`` -- no prediction
    for a layout that cannot run; False only for diagnostics that say so."""
    from .memory import require
    from .core import (_CODEC_PASSES, DTYPES, _LATE_STEP, _policy_op, flows, refresh_fraction, training_flops,
                       wire_nbytes)
    from ..collectives.segments import SEGMENT_BYTES
    from ..policy import load

    if check_memory:
        require(lay, node)
    pol = load(policy) if policy is not None else None
    pl = placement(lay, node)
    m = lay.micro_batches
    if compute_s is not None:
        comp_mb = compute_s / (m + lay.pp - 1)
    elif mfu is not None:
        comp_mb = training_flops(lay) / (lay.world * node.peak(lay.dtype) * 1e12 * mfu) / m
    else:
        raise CcollError("predict: give mfu (compute from FLOPs) or compute_s (measured)")
    per_mb = {}
    dp_cost = {}
    dp_grad = {}  # stage -> (wire, codec) of the gradient reduction alone: what dp_overlap can hide
    detail = {}
    for f in flows(lay):
        dt = DTYPES[f.dtype]
        codec = pol.resolve(f.dim, _policy_op(f.op), (f.shape or f.numel, dt), step=_LATE_STEP) if pol else None
        rule = pol.rule(f.dim, _policy_op(f.op)) if codec is not None else None
        hier = (rule is not None and rule.hierarchy == "node" and f.op in HIER_OPS and not codec.variable_size)
        delta = rule is not None and f.op == "all_gather" and rule.weight_delta > 0
        k = pl.k[f.dim]
        if hier and pl.intra[f.dim]:
            codec = None  # ``hierarchy: node``: exact inside a node
        # ccoll.wdelta encodes the fp32 delta (the codec's feedback dtype), not the weights' dtype
        wdt = codec.feedback_dtype(dt) if delta and codec is not None else dt
        w = wire_nbytes(codec, f.op, f.numel, wdt, f.group)
        r = measured_ratio(codec, f.dtype, f.dim, codec_table) if codec is not None else None
        if r:  # a variable-size codec: what travels is the measured fraction of the raw bytes
            w = wire_nbytes(None, f.op, f.numel, dt, f.group) / r
        raw = f.numel * dt.itemsize
        if hier and codec is not None and k > 1 and f.group % k == 0:
            peers = f.group // k
            if f.op == "all_gather":  # every shard encoded once, decoded by the N peers
                w_inter = wire_nbytes(codec, "all_gather", f.numel, wdt, peers)
                values, group = raw, peers
            else:  # the GPU's 1/k chunk of its node's partial sums
                w_inter = wire_nbytes(codec, f.op, f.numel // k, wdt, peers)
                values, group = raw / k, peers
            wire = hierarchy_seconds(f.op, raw, w_inter, f.group, k, node, algorithm)
        else:
            wire = call_seconds(f.op, w, f.group, k, pl.intra[f.dim], node, codec is not None, algorithm)
            values, group = raw, f.group
        cod = 0.0
        if codec is not None:
            fb = bool(rule.error_feedback) and f.op != "send"
            enc_r, dec_r, _ = codec_rates(codec, dt, node, fb, codec_table)
            if codec_gbps is not None:
                enc_r, dec_r = codec_gbps
            elif delta and not _entry(codec, codec_table).get("rates"):
                enc_r, dec_r = wdelta_roofline_gbps(codec, dt, node.hbm_gbytes_per_s)
            enc, dec = _CODEC_PASSES[f.op](group)
            cod = values * (enc / (enc_r * 1e9) + dec / (dec_r * 1e9))
        if delta and codec is not None:  # every T-th step an exact refresh instead of the delta
            frac = refresh_fraction(rule.weight_delta, f.calls)
            native = call_seconds(f.op, raw, f.group, k, pl.intra[f.dim], node, False, algorithm)
            wire, cod = (1 - frac) * wire + frac * native, (1 - frac) * cod
        elt = dt.itemsize
        nseg = max(1, math.ceil(f.numel * elt / SEGMENT_BYTES)) if f.op != "send" else 1
        both = max(wire, cod) + min(wire, cod) / nseg if nseg > 1 and overlap_codec else wire + cod
        key = (f.stage, f.dim)
        acc = dp_cost if f.dim == "dp" else per_mb
        w_s, c_s = acc.get(key, (0.0, 0.0))
        acc[key] = (w_s + wire * f.calls, c_s + (both - wire) * f.calls)
        if f.dim == "dp" and f.what == "gradients":
            dp_grad[f.stage] = (wire * f.calls, (both - wire) * f.calls)
        detail.setdefault(f.dim, []).append({"what": f.what, "op": f.op, "stage": f.stage,
                                             "codec": codec.spec if codec else "native", "wire_s": wire,
                                             "codec_s": both - wire, "calls": f.calls})
    slots = m + lay.pp - 1
    stages = range(lay.pp)

    def stage_mb(st):
        wire = {d: per_mb.get((st, d), (0.0, 0.0))[0] / m for d in ("tp", "pp")}
        cod = sum(per_mb.get((st, d), (0.0, 0.0))[1] / m for d in ("tp", "pp"))
        return comp_mb + sum(wire.values()) + cod, wire, cod

    slow = max(stages, key=lambda st: stage_mb(st)[0])
    _, wire_mb, cod_mb = stage_mb(slow)
    dps = [sum(dp_cost.get((st, "dp"), (0.0, 0.0))) for st in stages]
    dp_stage = max(stages, key=lambda st: dps[st])
    dp_w, dp_c = dp_cost.get((dp_stage, "dp"), (0.0, 0.0))
    g_w, g_c = dp_grad.get(dp_stage, (0.0, 0.0))
    hidden = 0.0
    if dp_overlap and lay.pp == 1 and g_w + g_c:
        hidden = min((g_w + g_c) * (1 - last_bucket_share(lay, dp_stage)),
                     comp_mb * (0.75 if lay.recompute else 2 / 3))
    cut = hidden / (g_w + g_c) if g_w + g_c else 0.0  # taken from the gradients' wire and codec alike
    link = {"tp": slots * wire_mb["tp"], "pp": slots * wire_mb["pp"], "dp": dp_w - g_w * cut}
    codec_s = slots * cod_mb + dp_c - g_c * cut
    compute = slots * comp_mb
    return {"stage": slow, "compute_s": compute, "link_s": link, "codec_s": codec_s,
            "total_s": compute + sum(link.values()) + codec_s, "bubble": (lay.pp - 1) / m,
            "placement": dataclasses.asdict(pl), "detail": detail}


def codec_rate_needed(lay, node: Node, policy, speedup: float, **kw) -> dict:
    """The codec GB/s (encode = decode, every codec of ``policy``) at which ``policy`` reaches ``speedup`` over native
    in :func:`predict` (``kw``: its options, ``codec_gbps`` excepted), or why it cannot: ``max_speedup`` is an
    infinitely fast codec's (compute and the remaining wire bound it). Why a search and not the flat model's closed
    form: codec work pipelined with the wire over segments makes step time a max(), not a sum, of codec seconds;
    it still falls as the codec gets faster, so bisection on log(rate) finds the threshold.
    Returns {"max_speedup", "codec_gbps"} (codec_gbps None if unreachable)."""
    base = predict(lay, node, None, **kw)["total_s"]

    def gain(rate: float) -> float:
        return base / predict(lay, node, policy, codec_gbps=(rate, rate), **kw)["total_s"]

    best = gain(math.inf)
    if best < speedup:
        return {"max_speedup": best, "codec_gbps": None}
    lo, hi = 1e-9, 1e9
    if gain(lo) >= speedup:
        return {"max_speedup": best, "codec_gbps": lo}
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if gain(mid) >= speedup else (mid, hi)
    return {"max_speedup": best, "codec_gbps": hi}
