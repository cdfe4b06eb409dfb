"""The traffic and flat step-time model (see :mod:`ccoll.model` for the formulas)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from .. import units
from ..errors import CcollError
from ..policy import DENSE_DIMS

DIMS = DENSE_DIMS
DTYPES = {k: units.DTYPES[k] for k in ("float32", "float16", "bfloat16")}
#: step at which the policy is asked (past any warm-up)
_LATE_STEP = 10**9


@dataclass(frozen=True)
class Layout:
    """A GPT training layout. ``embedding``: "replicated" (ccoll.convergence's model) or "vocab_parallel"
    (Megatron/NeoX); ``lm_head``: "gathered" (logits all-gathered; ccoll.convergence) or "parallel"
    (vocab-parallel cross-entropy; Megatron/NeoX); ``learned_positions``: a learned s x h position table."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    micro_batch: int
    micro_batches: int
    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 1
    dtype: str = "float16"
    ffn_mult: int = 4
    embedding: str = "vocab_parallel"
    lm_head: str = "parallel"
    learned_positions: bool = False
    lm_head_bias: bool = False
    pp_scatter_gather: bool = False
    #: GPT-J/NeoX parallel residual (``gpt_j_residual``): attention and MLP outputs summed before one TP
    #: all-reduce, so 1 forward all-reduce per layer instead of 2 (backward keeps 2: both branches' inputs)
    parallel_residual: bool = False
    #: activation recomputation (``checkpoint-activations``): the forward runs again in backward, with its
    #: TP all-reduces, and compute is 8 instead of 6 FLOPs per parameter per token
    recompute: bool = False
    #: FlashAttention (Megatron ``--use-flash-attn``, Transformer Engine's fused attention): the a x s x s attention
    #: scores, their softmax and dropout are never stored (recomputed in backward), so a layer's activations lose
    #: Korthikanti et al.'s 5 a s / h score term (:mod:`ccoll.model.memory`); bytes and FLOPs counted are unchanged
    flash_attention: bool = False
    #: Megatron sequence parallelism (``--sequence-parallel``; Korthikanti et al. 2022, arXiv 2205.05198, sec. 4.2.2):
    #: the layernorms, dropouts and residuals run on s/t of the sequence, so every activation of a layer is split
    #: over TP (memory: s b h / t (34 + 5 a s / h)); each TP all-reduce becomes a reduce-scatter + all-gather of the
    #: same tensor (the same ring bytes), plus the all-gather each column-parallel linear repeats in backward for
    #: its weight gradient (it keeps only its s/t input), and PP sends the s/t shard (see :func:`flows`)
    sequence_parallel: bool = False
    #: GPT-NeoX / DeepSpeed's pipeline engine sends the attention mask [b, 1, s, s] in fp16 with every
    #: forward activation: b*s*s elements beside the b*s*h activation, +s/h: +33% forward PP bytes for
    #: NeoX-20B (s 2048, h 6144); never compressed by a policy that excludes 4-D fp16 tensors
    pp_mask: bool = False
    #: ZeRO-1/2 gradient reduction: "" = this module's historical choice (ZeRO-0/1 all-reduce, ZeRO-2
    #: reduce-scatter), or "all_reduce" / "reduce_scatter" (DeepSpeed's ``reduce_scatter: true``)
    zero_reduce: str = ""
    #: dtype the DP gradient reduction runs in: "" = ``dtype``; "float32" = Megatron's fp32 gradient
    #: accumulation and reduction of bf16 training (``accumulate_allreduce_grads_in_fp32``)
    grad_dtype: str = ""
    #: bytes per DP gradient bucket: reductions start as backward fills buckets, so all but the last bucket can
    #: hide under the backward (``timing.predict(dp_overlap=True)``). Default: torch DDP's ``bucket_cap_mb`` = 25
    #: (torch.nn.parallel.DistributedDataParallel docs); DeepSpeed ZeRO ``overlap_comm``: ``reduce_bucket_size``
    #: elements x gradient bytes (default 5e8 elements, deepspeed.ai config-json docs)
    dp_bucket_bytes: int = 25 << 20

    def check(self) -> None:
        bad = [f"{k}={getattr(self, k)}" for k in ("layers", "hidden", "heads", "seq", "vocab", "micro_batch",
                                                   "micro_batches", "dp", "tp", "pp", "dp_bucket_bytes")
               if getattr(self, k) < 1]
        if bad:
            raise CcollError(f"layout: must be >= 1: {', '.join(bad)}")
        if self.zero not in (0, 1, 2, 3):
            raise CcollError(f"layout: zero stage {self.zero} not modelled (0, 1, 2 or 3)")
        if self.zero_reduce not in ("", "all_reduce", "reduce_scatter"):
            raise CcollError(f"layout: zero_reduce {self.zero_reduce!r}: '', 'all_reduce' or 'reduce_scatter'")
        if self.grad_dtype and self.grad_dtype not in DTYPES:
            raise CcollError(f"layout: grad_dtype {self.grad_dtype!r}; one of {sorted(DTYPES)}")
        if self.dtype not in DTYPES:
            raise CcollError(f"layout: dtype {self.dtype!r}; one of {sorted(DTYPES)}")
        if self.layers < self.pp:
            raise CcollError(f"layout: layers={self.layers} < pp={self.pp}")
        if self.heads % self.tp or self.hidden % self.heads:
            raise CcollError(f"layout: tp={self.tp} must divide heads={self.heads}, heads must divide hidden")
        if self.sequence_parallel and self.seq % self.tp:
            raise CcollError(f"layout: sequence parallelism splits seq={self.seq} over tp={self.tp}: tp must divide it")
        if self.embedding not in ("replicated", "vocab_parallel") or self.lm_head not in ("gathered", "parallel"):
            raise CcollError(f"layout: embedding {self.embedding!r} / lm_head {self.lm_head!r} unknown")

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    def stage_layers(self) -> list[int]:
        """Blocks per pipeline stage, balanced (DeepSpeed's type:TransformerBlock partition: earlier
        stages take the remainder)."""
        q, r = divmod(self.layers, self.pp)
        return [q + (1 if i < r else 0) for i in range(self.pp)]

    def stage_params(self, stage: int) -> int:
        """Parameters one TP rank of ``stage`` holds (its shard of split weights + replicated ones)."""
        h, f, v, tp = self.hidden, self.ffn_mult, self.vocab, self.tp
        sharded = (4 + 2 * f) * h * h + (3 + f) * h  # qkv, dense, fc1, fc2 weights; qkv and fc1 biases
        replicated = 6 * h  # two layer norms, dense and fc2 biases (added after the all-reduce)
        n = self.stage_layers()[stage] * (sharded // tp + replicated)
        if stage == 0:
            n += v * h // (tp if self.embedding == "vocab_parallel" else 1)
            n += self.seq * h if self.learned_positions else 0
        if stage == self.pp - 1:
            n += 2 * h + (v * h + (v if self.lm_head_bias else 0)) // tp
        return n

    def total_params(self) -> int:
        """Model parameters (each counted once)."""
        return sum(dataclasses.replace(self, tp=1).stage_params(s) for s in range(self.pp))


@dataclass(frozen=True)
class Flow:
    """``calls`` calls per step on every rank of ``ranks``, each of ``numel`` elements of ``dtype``;
    ``group`` = the collective's group size."""

    dim: str
    op: str
    what: str
    numel: int
    calls: int
    ranks: int
    group: int
    dtype: str
    stage: int
    shape: tuple | None = None  #: when the policy must see the tensor's rank (the 4-D attention mask)


def flows(lay: Layout) -> list[Flow]:
    """Every collective/p2p message of one optimizer step (see the module docstring)."""
    lay.check()
    b, s, h, v, m = lay.micro_batch, lay.seq, lay.hidden, lay.vocab, lay.micro_batches
    act = b * s * h
    out: list[Flow] = []
    per_stage = lay.dp * lay.tp  # ranks of one pipeline stage
    grad_dtype = lay.grad_dtype or lay.dtype
    for st, nl in enumerate(lay.stage_layers()):
        first, last = st == 0, st == lay.pp - 1
        if lay.tp > 1 and lay.sequence_parallel:
            out += _sp_flows(lay, st, nl, act)
        elif lay.tp > 1:
            per_layer = 1 if lay.parallel_residual else 2
            fwd = per_layer * nl * (2 if lay.recompute else 1) + (1 if first and lay.embedding == "vocab_parallel" else 0)
            bwd = 2 * nl + (1 if last else 0)
            out.append(Flow("tp", "all_reduce", "activations (forward)", act, fwd * m, per_stage, lay.tp, lay.dtype, st))
            out.append(Flow("tp", "all_reduce", "activation gradients (backward)", act, bwd * m, per_stage, lay.tp,
                            lay.dtype, st))
            if last and lay.lm_head == "gathered":
                out.append(Flow("tp", "all_gather", "logits", b * s * v // lay.tp, m, per_stage, lay.tp, lay.dtype, st))
            elif last:
                out.append(Flow("tp", "all_reduce", "vocab-parallel cross-entropy", b * s, 3 * m, per_stage, lay.tp,
                                "float32", st))
        if lay.pp > 1:
            # Megatron's scatter-gather optimisation, or sequence parallelism (each TP rank holds and sends s/t)
            n = act // lay.tp if lay.pp_scatter_gather or lay.sequence_parallel else act
            if not last:
                out.append(Flow("pp", "send", "activations", n, m, per_stage, 2, lay.dtype, st))
                if lay.pp_mask:
                    out.append(Flow("pp", "send", "attention mask", b * s * s, m, per_stage, 2, "float16", st,
                                    (b, 1, s, s)))
            if not first:
                out.append(Flow("pp", "send", "activation gradients", n, m, per_stage, 2, lay.dtype, st))
        if lay.dp > 1:
            p_rank = lay.stage_params(st)
            op = lay.zero_reduce or ("reduce_scatter" if lay.zero >= 2 else "all_reduce")
            if lay.zero == 3:
                op = "reduce_scatter"
            out.append(Flow("dp", op, "gradients", p_rank, 1, per_stage, lay.dp, grad_dtype, st))
            if lay.zero == 3:  # parameters gathered before each forward and each backward of every micro-batch
                out.append(Flow("dp", "all_gather", "parameters (ZeRO-3, per micro-batch)", -(-p_rank // lay.dp),
                                2 * m, per_stage, lay.dp, lay.dtype, st))
            elif lay.zero >= 1:
                out.append(Flow("dp", "all_gather", "parameters (ZeRO)", -(-p_rank // lay.dp), 1, per_stage, lay.dp,
                                lay.dtype, st))
    return out


def _sp_flows(lay: Layout, st: int, nl: int, act: int) -> list[Flow]:
    """TP flows of one stage of ``nl`` layers under sequence parallelism (Megatron ``--sequence-parallel``), derived
    from which linears are column- and row-parallel, per micro-batch (``act`` = b s h; an all-gather's numel is the
    s/t shard a rank passes, a reduce-scatter's the whole b s h tensor, as ``wire_nbytes`` and ``timing`` take them):
        forward   all-gather of each column-parallel linear's input (QKV, FC1: 2 per layer; the LM head's on the
                  last stage) and reduce-scatter of each row-parallel output (attention dense, FC2: 2 per layer, 1
                  with parallel residual, whose branch outputs are summed first; the vocab-parallel embedding's on the
                  first stage; a replicated embedding's output is split, no traffic) -- the layers' again with
                  recomputation
        backward  each forward all-gather's gradient is a reduce-scatter and each reduce-scatter's an all-gather;
                  and each column-parallel linear all-gathers its s/t input again for its weight gradient
                  (megatron/core/tensor_parallel/layers.py ``LinearWithGradAccumulationAndAsyncCommunication.backward``;
                  Transformer Engine's Linear likewise): Megatron overlaps it with the input-gradient GEMM, which this
                  model does not (no TP collective is overlapped here)
    An all-reduce is a reduce-scatter + an all-gather on a ring, so every pair replacing one of :func:`flows`' TP
    all-reduces moves its bytes; the backward re-gathers are the only added bytes: per layer and micro-batch 2 x
    (t-1)/t b s h on top of 8 (+25%; on top of 12 with recomputation) (first stage: the embedding's all-reduce becomes a reduce-scatter, half its bytes, and
    its gradient an all-gather; a replicated embedding's split has an all-gather as its gradient)."""
    first, last = st == 0, st == lay.pp - 1
    col, row = 2 * nl, (1 if lay.parallel_residual else 2) * nl
    rc = 2 if lay.recompute else 1
    emb = 1 if first and lay.embedding == "vocab_parallel" else 0
    head = 1 if last else 0
    m, g, ranks, dt, shard = lay.micro_batches, lay.tp, lay.dp * lay.tp, lay.dtype, act // lay.tp
    out = [Flow("tp", "all_gather", "SP activations (forward)", shard, (col * rc + head) * m, ranks, g, dt, st),
           Flow("tp", "reduce_scatter", "SP activations (forward)", act, (row * rc + emb) * m, ranks, g, dt, st),
           Flow("tp", "reduce_scatter", "SP act. gradients (backward)", act, (col + head) * m, ranks, g, dt, st),
           Flow("tp", "all_gather", "SP act. gradients (backward)", shard, (row + first) * m, ranks, g, dt, st),
           Flow("tp", "all_gather", "SP inputs re-gathered (wgrad)", shard, (col + head) * m,
                ranks, g, dt, st)]
    out = [f for f in out if f.calls]
    b, s, v = lay.micro_batch, lay.seq, lay.vocab
    if last and lay.lm_head == "gathered":
        out.append(Flow("tp", "all_gather", "logits", b * s * v // lay.tp, m, ranks, g, dt, st))
    elif last:
        out.append(Flow("tp", "all_reduce", "vocab-parallel cross-entropy", b * s, 3 * m, ranks, g, "float32", st))
    return out


def _policy_op(op: str) -> str:
    return "send_recv" if op == "send" else op


def wire_nbytes(codec, op: str, numel: int, dtype: torch.dtype, group: int) -> int:
    """Bytes ccoll's collectives record as sent for one call (mirrors ccoll.collectives' segmenting)."""
    from ..collectives.segments import segments, spans

    elt = torch.empty((), dtype=dtype).element_size()
    if codec is None:
        return numel * elt
    if op == "all_reduce":
        cuts = segments(numel, group, elt, codec.align_numel)
        if group == 2:  # one exchange per segment (ccoll.collectives.small): the segment's one payload
            return sum(codec.encoded_nbytes(seg_numel, dtype) for _, seg_numel, _ in cuts)
        return sum(group * codec.encoded_nbytes(chunk, dtype) for _, _, chunk in cuts)
    if op == "reduce_scatter":
        return sum(group * codec.encoded_nbytes(n, dtype) for _, n in spans(numel // group, group, elt, codec.align_numel))
    if op == "all_gather":
        return sum(codec.encoded_nbytes(n, dtype) for _, n in spans(numel, group, elt, codec.align_numel))
    return codec.encoded_nbytes(numel, dtype)


def refresh_fraction(weight_delta: int, calls: int, steps: int | None = None) -> float:
    """Fraction of a ``weight_delta`` all-gather's calls that are exact refreshes (ccoll.wdelta: a call site
    re-seeds at its first call and whenever ``weight_delta`` optimizer steps have passed, so ``steps`` steps hold
    ceil(steps / T) refreshes; in the steady state (``steps`` None) 1 / T per step), over its ``calls`` per step."""
    per_step = math.ceil(steps / weight_delta) / steps if steps else 1 / weight_delta
    return min(1.0, per_step / calls)


def members_per_node(lay: Layout, ranks_per_node: int) -> dict[str, int]:
    """Members of one group of each dimension on a node of ``ranks_per_node`` consecutive ranks (Megatron / NeoX /
    DeepSpeed order: model fastest, then data, then pipe): TP takes min(tp, g); DP members are tp apart, so
    min(dp, g / tp) share a node when tp < g; PP neighbours are tp x dp apart. ``timing.placement`` uses it too."""
    g = ranks_per_node
    if lay.tp < g and g % lay.tp:
        raise CcollError(f"placement: tp={lay.tp} does not divide gpus_per_node={g}")
    return {"tp": min(lay.tp, g), "dp": 1 if lay.tp >= g else min(lay.dp, g // lay.tp),
            "pp": 1 if lay.tp * lay.dp >= g else min(lay.pp, g // (lay.tp * lay.dp))}


#: ops ``hierarchy: node`` runs in two levels (ccoll.collectives.hierarchy)
_HIER_OPS = ("all_reduce", "reduce_scatter", "all_gather")


def hierarchy_nbytes(codec, op: str, numel: int, dtype: torch.dtype, group: int, k: int) -> tuple[int, int]:
    """(raw, wire) bytes ``ccoll.stats`` records for one ``hierarchy: node`` call of a rank whose group of ``group``
    has ``k`` members on each of its ``group / k`` nodes (ccoll.collectives.hierarchy, "Stats"): raw is what enters
    the compressed inter-node phase, wire that phase's payload bytes; the exact intra-node phases are not counted
    (they are the traffic the call would have without ccoll). ``numel``: the tensor a rank passes (all_reduce and
    reduce_scatter: the whole input; all_gather: its shard). With N = group / k nodes:
        all_reduce, N = 2   per segment of the flat collectives (``segments(numel, k, ...)``, chunk c_s), the
                            rank's node-partial chunk c_s crosses once: raw sum c_s elements, wire sum encoded(c_s)
        all_reduce, N > 2   the chunk ceil(numel / k) runs ccoll's flat all_reduce among the N peers
        reduce_scatter      the numel / k partial sums run the flat reduce_scatter among the N peers
        all_gather          the shard runs the flat all_gather among the N peers."""
    from ..collectives.segments import segments

    elt = torch.empty((), dtype=dtype).element_size()
    n = group // k
    if op == "all_reduce" and n == 2:
        pieces = segments(numel, k, elt, codec.align_numel)
        return (sum(c for _, _, c in pieces) * elt, sum(codec.encoded_nbytes(c, dtype) for _, _, c in pieces))
    if op == "all_reduce":
        c = -(-numel // k)
        return c * elt, wire_nbytes(codec, "all_reduce", c, dtype, n)
    if op == "reduce_scatter":
        return numel // k * elt, wire_nbytes(codec, "reduce_scatter", numel // k, dtype, n)
    if op == "all_gather":
        return numel * elt, wire_nbytes(codec, "all_gather", numel, dtype, n)
    raise CcollError(f"hierarchy: node has no {op}")


def traffic(lay: Layout, policy=None, steps: int | None = None, ranks_per_node: int | None = None) -> list[dict]:
    """Per (dim, op, what): calls, raw and wire bytes per step summed over all ranks, the codec, and the
    same per rank of the busiest stage (for step time). ``steps``: a run's length, for the exact refreshes of
    ``weight_delta`` all-gathers it holds (None: the steady state). ``ranks_per_node``: consecutive ranks per node
    (what ``CCOLL_NODE_MAP=L`` / ``LOCAL_WORLD_SIZE`` tell ccoll); with it, a ``hierarchy: node`` rule's calls whose
    group spans several nodes with several members on each count as ccoll.stats records them
    (:func:`hierarchy_nbytes`); ccoll runs a group inside one node, or with one member per node, flat -- so do
    these counts. None: no node map, every call flat."""
    from ..policy import load

    pol = load(policy) if policy is not None else None
    per_node = members_per_node(lay, ranks_per_node) if ranks_per_node else None
    rows = []
    for f in flows(lay):
        dt = DTYPES[f.dtype]
        codec = (pol.resolve(f.dim, _policy_op(f.op), (f.shape or f.numel, dt), step=_LATE_STEP)
                 if pol is not None else None)
        raw = f.numel * torch.empty((), dtype=dt).element_size()
        wire = wire_nbytes(codec, f.op, f.numel, dt, f.group)
        rule = pol.rule(f.dim, _policy_op(f.op)) if codec is not None else None
        t = rule.weight_delta if rule is not None and f.op == "all_gather" else 0
        k = per_node[f.dim] if per_node else 1
        if t:  # ccoll.wdelta: fp32 deltas (the codec's feedback dtype), and exact refreshes counted native
            frac = refresh_fraction(t, f.calls, steps)
            wire = frac * raw + (1 - frac) * wire_nbytes(codec, f.op, f.numel, codec.feedback_dtype(dt), f.group)
        elif (rule is not None and rule.hierarchy == "node" and f.op in _HIER_OPS and not codec.variable_size
              and k > 1 and f.group % k == 0 and f.group // k > 1):
            raw, wire = hierarchy_nbytes(codec, f.op, f.numel, dt, f.group, k)
        rows.append({"dim": f.dim, "op": f.op, "what": f.what, "stage": f.stage, "codec": codec.spec if codec else "native",
                     "numel": f.numel, "calls_per_rank": f.calls, "ranks": f.ranks, "group": f.group,
                     "raw_per_rank": raw * f.calls, "wire_per_rank": wire * f.calls,
                     "raw": raw * f.calls * f.ranks, "wire": wire * f.calls * f.ranks})
    return rows


def per_dim(rows: list[dict]) -> dict[str, dict[str, int]]:
    """Raw and wire bytes per step per dimension, summed over ranks (the convergence summary's unit)."""
    out = {d: {"raw": 0, "wire": 0} for d in DIMS}
    for r in rows:
        out[r["dim"]]["raw"] += r["raw"]
        out[r["dim"]]["wire"] += r["wire"]
    return out


# --- step time -------------------------------------------------------------------------------------
_ALGO = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
         "all_gather": lambda n: (n - 1), "send": lambda n: 1.0}


#: values through the codec per value a rank contributes, (encoded, decoded), for a group of n, as ccoll's
#: collectives do it: all_reduce encodes its tensor, decodes-and-sums the n chunks it owns (n x 1/n), encodes
#: the reduced chunk (1/n) and decodes the n gathered chunks; all_gather encodes its shard and decodes n;
#: reduce_scatter encodes the tensor and decodes n payloads of its 1/n chunk; send encodes, recv decodes
_CODEC_PASSES = {"all_reduce": lambda n: (1 + 1 / n, 2.0), "reduce_scatter": lambda n: (1.0, 1.0),
                 "all_gather": lambda n: (1.0, float(n)), "send": lambda n: (1.0, 1.0)}


@dataclass(frozen=True)
class Cluster:
    """Bandwidths in Gbit/s per GPU; TP inside a node, DP and PP across nodes (the usual placement).
    ``codec_gbps``: codec throughput in GB/s of input values (encode; decode too unless ``decode_gbps``)."""

    tp_gbps: float
    inter_gbps: float
    codec_gbps: float
    compute_s: float | None = None
    peak_tflops: float = 125.0
    mfu: float = 0.35
    dp_overlap: float = 0.0
    latency_us: float = 10.0
    decode_gbps: float | None = None


def training_flops(lay: Layout) -> float:
    """FLOPs of one optimizer step, all GPUs: 6 per parameter per token (forward 2, backward 4), 8 with
    recomputation (the forward again), plus attention scores 12 x layers x hidden x seq per token (16 with
    recomputation) -- Narayanan et al., SC'21 (arXiv 2104.04473) eq. 3's accounting."""
    tokens = lay.micro_batch * lay.micro_batches * lay.dp * lay.seq
    k = 8 if lay.recompute else 6
    return k * lay.total_params() * tokens + 2 * k * lay.layers * lay.hidden * lay.seq * tokens


def compute_seconds(lay: Layout, cl: Cluster) -> float:
    """Given, or training FLOPs / (GPUs x peak x MFU) x pipeline bubble (m + pp - 1) / m."""
    if cl.compute_s is not None:
        return cl.compute_s
    tokens = lay.micro_batch * lay.micro_batches * lay.dp * lay.seq
    flops = training_flops(lay)
    return flops / (lay.world * cl.peak_tflops * 1e12 * cl.mfu) * (lay.micro_batches + lay.pp - 1) / lay.micro_batches


def step_time(lay: Layout, cl: Cluster, policy=None) -> dict:
    """Predicted seconds per step: compute, link time per dimension, codec time, total (busiest stage)."""
    rows = traffic(lay, policy)
    comp = compute_seconds(lay, cl)
    worst = None
    for st in range(lay.pp):
        link = {d: 0.0 for d in DIMS}
        codec_s = 0.0
        for r in rows:
            if r["stage"] != st:
                continue
            gbps = cl.tp_gbps if r["dim"] == "tp" else cl.inter_gbps
            # ccoll's compressed all_reduce (all-to-all + all-gather of encoded chunks) moves 2(n-1)/n of
            # its wire bytes, as the ring does of the raw ones
            moved = r["wire_per_rank"] * _ALGO[r["op"]](r["group"])
            t = moved * 8 / (gbps * 1e9) + r["calls_per_rank"] * cl.latency_us * 1e-6
            if r["dim"] == "dp":
                t *= 1.0 - cl.dp_overlap
            link[r["dim"]] += t
            if r["codec"] != "native":
                enc, dec = _CODEC_PASSES[r["op"]](r["group"])
                codec_s += r["raw_per_rank"] * (enc / cl.codec_gbps + dec / (cl.decode_gbps or cl.codec_gbps)) / 1e9
        total = comp + sum(link.values()) + codec_s
        if worst is None or total > worst["total_s"]:
            worst = {"stage": st, "compute_s": comp, "link_s": link, "codec_s": codec_s, "total_s": total}
    return worst


def codec_gbps_needed(lay: Layout, cl: Cluster, policy, speedup: float) -> dict:
    """The codec throughput (GB/s, encode = decode) at which ``policy`` reaches ``speedup`` over native on
    ``cl``, or why it cannot: ``max_speedup`` is what an infinitely fast codec would give (compute and
    the remaining wire time bound it). Returns {"max_speedup", "codec_gbps"} (codec_gbps None if
    unreachable)."""
    base = step_time(lay, cl, None)["total_s"]
    free = step_time(lay, dataclasses.replace(cl, codec_gbps=float("inf"), decode_gbps=None), policy)
    # codec seconds at 1 GB/s: the step's codec time scales as 1 / throughput
    per_gbps = step_time(lay, dataclasses.replace(cl, codec_gbps=1.0, decode_gbps=None), policy)["codec_s"]
    slack = base / speedup - free["total_s"]
    need = None if slack <= 0 else (per_gbps / slack if per_gbps > 0 else 0.0)
    return {"max_speedup": base / free["total_s"], "codec_gbps": need}


# --- codec throughput on this machine ---------------------------------------------------------------
def codec_throughput(spec: str, numel: int = 1 << 22, rows: int = 4, feedback: bool = True, repeat: int = 3,
                     dtype: str = "float32") -> dict:
    """Measured wall-clock GB/s of input values of one codec on this process's device (CPU here) through
    the batched API the collectives call: ``encode_rows`` of ``numel`` values in ``rows`` rows (with error
    feedback when ``feedback``, as hybrid's DP gradients) and ``decode_rows`` of the payloads; best of
    ``repeat``. ``codec_gbps`` is the harmonic mean of the two -- the figure ``Cluster.codec_gbps`` takes,
    since step_time charges encodes and decodes alike. Wall clock on purpose: on a shared machine it
    includes the contention the ranks see (run it in as many processes at once as there are ranks)."""
    import time

    from ..codecs import get_codec

    codec = get_codec(spec)
    dt = DTYPES[dtype]
    row = -(-numel // rows)
    row += (-row) % codec.align_numel
    src = torch.randn(rows * row, dtype=dt)
    out = torch.empty(rows, codec.encoded_nbytes(row, dt), dtype=torch.uint8)
    fb = torch.zeros(rows * row, dtype=codec.feedback_dtype(dt)) if feedback else None
    dst = torch.empty_like(src)
    codec.encode_rows(src, out, row, feedback=fb)  # warm-up: allocations, lazy imports
    codec.decode_rows(out, dst, row)
    enc = dec = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        codec.encode_rows(src, out, row, feedback=fb)
        t1 = time.perf_counter()
        codec.decode_rows(out, dst, row)
        t2 = time.perf_counter()
        enc, dec = min(enc, t1 - t0), min(dec, t2 - t1)
    nbytes = src.numel() * src.element_size()
    return {"spec": codec.spec, "numel": src.numel(), "feedback": feedback, "encode_gbps": nbytes / enc / 1e9,
            "decode_gbps": nbytes / dec / 1e9, "codec_gbps": 2 * nbytes / (enc + dec) / 1e9}


# --- presets and the cluster table ------------------------------------------------------------------
PRESETS = {
    # GPT-NeoX-20B (GPT-NeoX configs/20B.yml's model: 44 layers, hidden 6144, 64 heads, seq 2048, fp16, recomputation,
    # parallel residual, ZeRO-1, reduce_bucket_size 1.26e9 elements) at 192 V100 in the layout nearest 20B.yml that
    # FITS a 16 GB V100 (ccoll.model.memory: 20B.yml's TP 2 x PP 4, micro-batch 4 needs >= 21 GiB; TP 4 x PP 4 x DP 12,
    # micro-batch 1 >= 10 GiB), 4 micro-batches per step (ccoll.model.published.SEED_LAYOUTS: the layout that
    # reproduces the seed paper's figures on Lassen), MFU 0.30 (Megatron-LM's V100 figure). The flat Cluster view is
    # the old per-GPU-rate model, kept for ``step_time`` callers; the command line runs a preset on its node file.
    "neox20b-v100": (Layout(layers=44, hidden=6144, heads=64, seq=2048, vocab=50432, micro_batch=1, micro_batches=4,
                            dp=12, tp=4, pp=4, zero=1, dtype="float16", parallel_residual=True, recompute=True,
                            pp_mask=True, zero_reduce="all_reduce",
                            dp_bucket_bytes=1_260_000_000 * 2),
                     Cluster(tp_gbps=600.0, inter_gbps=50.0, codec_gbps=100.0, peak_tflops=125.0, mfu=0.30)),
    # GPT-NeoX configs/20B.yml exactly as written (TP 2, PP 4, micro-batch 4 x 32, ZeRO-1), written for A100s: at
    # 192 GPUs (DP 24) on a DGX A100 (80 GB: fits; on a 16 GB V100 it is refused). MFU 0.30 as above (Megatron-LM
    # reports more on A100, which only shrinks the gains).
    "neox20b-a100": (Layout(layers=44, hidden=6144, heads=64, seq=2048, vocab=50432, micro_batch=4, micro_batches=32,
                            dp=24, tp=2, pp=4, zero=1, dtype="float16", parallel_residual=True, recompute=True,
                            pp_mask=True, zero_reduce="all_reduce",
                            dp_bucket_bytes=1_260_000_000 * 2),
                     Cluster(tp_gbps=2400.0, inter_gbps=200.0, codec_gbps=100.0, peak_tflops=312.0, mfu=0.30)),
}

#: the sourced node file (configs/clusters/) each preset was written for: ``--preset`` without ``--cluster`` and
#: ``--clusters`` run the preset's layout there through the mechanistic model (ccoll.model.timing), so a preset
#: never falls back to the flat per-GPU rates above
PRESET_CLUSTERS = {"neox20b-v100": "lassen", "neox20b-a100": "dgx-a100"}


def preset_cluster(name: str) -> str:
    """The node file a preset runs on by default (``PRESET_CLUSTERS``); a preset without one is an error."""
    if name not in PRESETS:
        raise CcollError(f"preset {name!r}: unknown; presets: {', '.join(sorted(PRESETS))}")
    if name not in PRESET_CLUSTERS:
        raise CcollError(f"preset {name!r} has no node file in PRESET_CLUSTERS; give --cluster NAME_OR_YAML")
    return PRESET_CLUSTERS[name]


#: ccoll.convergence's model: replicated byte embedding with learned positions, gathered logits, fp32
RUNNER = dict(vocab=256, dtype="float32", embedding="replicated", lm_head="gathered", learned_positions=True,
              lm_head_bias=True, zero=1)


def runner_layout(meta: dict) -> Layout:
    """The Layout of a ``python -m ccoll.convergence`` run from its summary's ``meta``."""
    m = meta["model"]
    return Layout(layers=m["layers"], hidden=m["hidden"], heads=m["heads"], seq=m["seq_len"],
                  micro_batch=meta["micro_batch"], micro_batches=meta["grad_accum"], dp=meta["dp"], tp=meta["tp"],
                  pp=meta["pp"], **RUNNER)


def _close(pred: float, meas: float, tol: float) -> bool:
    if meas == 0:
        return pred == 0
    return abs(pred - meas) <= tol * meas


def _rate_gbps(rate: str | None) -> float | None:
    """netem rate string ("1gbit", "100mbit") -> Gbit/s."""
    if not rate:
        return None
    return units.parse_rate_bits(rate) / 1e9


