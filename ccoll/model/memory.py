"""Does a layout fit in a GPU's memory? A lower bound of the bytes one GPU holds in training.

Why: a speedup predicted for a layout that cannot run says nothing. The seed paper's GPT-NeoX-20B runs were on
16 GB V100s, while ``configs/20B.yml`` was written for 40 GB A100s; whether its micro-batch fits on a V100 says
whether the paper can have run that layout as written (``--published`` prints it).

Per GPU of pipeline stage ``i`` holding ``P`` parameters (:meth:`Layout.stage_params`), ``l`` layers:
    weights, gradients, optimizer (Rajbhandari et al., ZeRO, arXiv 1910.02054 sec. 3.1: mixed-precision Adam
        holds 2 + 2 bytes of 16-bit weights and gradients and K = 12 bytes of fp32 master weights, momentum and
        variance per parameter; fp32 training: 4 + 4 + 8): optimizer / dp from ZeRO-1, gradients / dp from
        ZeRO-2, weights / dp at ZeRO-3
    activations (Korthikanti et al. 2022, arXiv 2205.05198, 16-bit activations, tensor parallelism ``t``): one layer
        of one micro-batch holds s b h (10 + 24/t + 5 a s / (h t)) bytes (eq. 2: the 10 s b h of layernorms,
        dropouts and residuals replicated over TP); with sequence parallelism (``Layout.sequence_parallel``, sec.
        4.2.2) those are split too: s b h / t (34 + 5 a s / h); with FlashAttention (``Layout.flash_attention``) the
        5 a s^2 b score term (softmax output, its dropout mask and output) is never stored: s b h (10 + 24/t), or
        34 s b h / t with both (FlashAttention's per-row softmax statistics, 4 a s b bytes, are left out). With
        full recomputation (NeoX's ``checkpoint_num_layers: 1``) a layer keeps only its input, 2 s b h bytes
        (2 s b h / t with sequence parallelism: the input is the layer's s/t shard), and one layer's full set exists
        while it is recomputed. 1F1B keeps at most pp - i micro-batches in flight on stage i (Narayanan et al.,
        SC'21, sec. 2.2), never more than m. fp32 training doubles the 16-bit count (an approximation: the 1-byte
        dropout masks stay 1 byte). Two assumptions of the 34 can overstate a run: it holds 2 s b h of 1-byte
        dropout masks (a run with dropout 0 stores none) and every saved GEMM input in 16 bits (FP8 training with
        Transformer Engine keeps some in 8): for such runs this one term is not a strict lower bound.
    CUDA context: ``CONTEXT_BYTES`` = 0.3 GiB, below what one process holds before it allocates anything
        (PyTorch issue 34323: nvidia-smi shows 781 MB for a process that has only initialised CUDA; the context's
        size varies with the GPU and CUDA version, so the bound takes less than any figure found)
    the framework's gradient bucket: one DP reduction bucket of ``Layout.dp_bucket_bytes`` when dp > 1 (DeepSpeed
        ZeRO-1/2 with ``contiguous_gradients`` reduces through a buffer of ``reduce_bucket_size`` elements,
        deepspeed/runtime/zero/stage_1_and_2.py ``ipg_buffer``; torch DDP copies gradients into buckets of
        ``bucket_cap_mb`` unless ``gradient_as_bucket_view``); one, though DeepSpeed allocates two with
        ``overlap_comm`` -- the bound takes the least any of them holds
Left out, so the total is a LOWER bound ("does not fit" is certain, "fits" is not): the all-gather bucket, the
output layer's logits and cross-entropy, temporary buffers of the codecs, NCCL's buffers, allocator fragmentation.

Feasible or refused: :func:`require` raises :class:`InfeasibleLayout` for a layout whose lower bound exceeds the
GPU's memory, naming layouts of the same GPUs and global batch that may fit (:func:`alternatives`: more TP inside
a node, more PP, a smaller micro-batch with more micro-batches, recomputation). Every prediction on a node file
with ``memory_gib`` checks it first (:func:`ccoll.model.timing.predict`).
"""
from __future__ import annotations

import dataclasses

from ..errors import CcollError
from .core import DTYPES

#: bytes per GiB (cluster files give HBM capacity in GiB: HBM stacks are binary)
GIB = 1 << 30
#: CUDA context and the framework's own start-up allocations, a lower bound (see the module docstring)
CONTEXT_BYTES = int(0.3 * GIB)


class InfeasibleLayout(CcollError):
    """The layout's lower-bound memory per GPU exceeds the GPU's: no prediction is made for it."""


def stage_bytes(lay, stage: int) -> dict:
    """Lower-bound bytes on one GPU of ``stage``, by part (see the module docstring)."""
    p = lay.stage_params(stage)
    half = DTYPES[lay.dtype].itemsize == 2
    weights = p * (2 if half else 4)
    grads = p * DTYPES[lay.grad_dtype or lay.dtype].itemsize
    optim = p * (12 if half else 8)
    if lay.zero >= 1:
        optim /= lay.dp
    if lay.zero >= 2:
        grads /= lay.dp
    if lay.zero >= 3:
        weights /= lay.dp
    s, b, h, a, t = lay.seq, lay.micro_batch, lay.hidden, lay.heads, lay.tp
    scale = 1 if half else 2
    score = 0 if lay.flash_attention else 5 * a * s / h
    if lay.sequence_parallel:
        full = s * b * h * (34 + score) / t * scale
    else:
        full = s * b * h * (10 + 24 / t + score / t) * scale
    layers = lay.stage_layers()[stage]
    inflight = min(lay.micro_batches, lay.pp - stage)
    if lay.recompute:
        kept = 2 * s * b * h / (t if lay.sequence_parallel else 1)
        acts = inflight * layers * kept * scale + full
    else:
        acts = inflight * layers * full
    bucket = min(lay.dp_bucket_bytes, grads) if lay.dp > 1 else 0
    return {"weights": weights, "gradients": grads, "optimizer": optim, "activations": acts,
            "context": CONTEXT_BYTES, "bucket": bucket,
            "total": weights + grads + optim + acts + CONTEXT_BYTES + bucket}


def fits(lay, node) -> dict | None:
    """The stage needing the most memory, its lower-bound bytes and the GPU's capacity; ``fits`` False when even
    the lower bound exceeds it. None when the cluster file gives no ``memory_gib``."""
    if node.memory_gib is None:
        return None
    need = [stage_bytes(lay, st) for st in range(lay.pp)]
    worst = max(range(lay.pp), key=lambda st: need[st]["total"])
    cap = node.memory_gib * GIB
    return {"stage": worst, "bytes": need[worst], "capacity": cap, "fits": need[worst]["total"] <= cap}


def describe(lay) -> str:
    """A layout in one phrase: degrees, micro-batch, ZeRO, recomputation, sequence parallelism, FlashAttention."""
    return (f"TP {lay.tp} x PP {lay.pp} x DP {lay.dp}, micro-batch {lay.micro_batch} x {lay.micro_batches}, "
            f"ZeRO-{lay.zero}{', recomputation' if lay.recompute else ''}"
            f"{', sequence parallelism' if lay.sequence_parallel else ''}"
            f"{', FlashAttention' if lay.flash_attention else ''}")


def alternatives(lay, node, limit: int = 4) -> list:
    """Layouts of the same GPUs and global batch that may fit ``node`` (lower bound within its memory), the
    smallest change first: more TP inside a node (DP shrinks), more PP (DP shrinks), a smaller micro-batch with
    more micro-batches, recomputation on. Empty when the node gives no ``memory_gib``."""
    if node.memory_gib is None:
        return []
    world, batch = lay.world, lay.micro_batch * lay.micro_batches * lay.dp
    cands = []
    for tp in sorted({lay.tp * 2 ** i for i in range(5)}):
        for pp in sorted({lay.pp * 2 ** i for i in range(5)}):
            if tp > node.gpus_per_node or lay.heads % tp or lay.layers < pp or world % (tp * pp):
                continue
            dp = world // (tp * pp)
            for mb in sorted({lay.micro_batch // 2 ** i for i in range(8)} - {0}, reverse=True):
                if batch % (mb * dp):
                    continue
                for rec in sorted({lay.recompute, True}):
                    c = dataclasses.replace(lay, tp=tp, pp=pp, dp=dp, micro_batch=mb,
                                            micro_batches=batch // (mb * dp), recompute=rec)
                    try:
                        c.check()
                    except CcollError:
                        continue
                    f = fits(c, node)
                    if f["fits"]:
                        change = ((tp != lay.tp) + (pp != lay.pp) + (mb != lay.micro_batch) + (rec != lay.recompute),
                                  tp * pp, -mb)
                        cands.append((change, c))
    cands.sort(key=lambda x: x[0])
    return [c for _, c in cands[:limit]]


def require(lay, node) -> dict | None:
    """:func:`fits`, or :class:`InfeasibleLayout` naming what would fit when even the lower bound does not."""
    f = fits(lay, node)
    if f is None or f["fits"]:
        return f
    alt = alternatives(lay, node)
    need = f["bytes"]["total"] / GIB
    hint = ("; layouts of the same GPUs and global batch that may fit: " + "; ".join(describe(a) for a in alt)
            if alt else "; no layout of the same GPUs and global batch with more TP (inside a node), more PP, a "
            "smaller micro-batch or recomputation fits: more GPUs, ZeRO-2/3 or offload")
    raise InfeasibleLayout(f"layout does not fit {node.name}'s {node.gpu} ({node.memory_gib:g} GiB): {describe(lay)} "
                           f"needs >= {need:.1f} GiB per GPU on stage {f['stage']} (a lower bound: weights, gradients, "
                           f"optimizer states, 1F1B activations, CUDA context, one gradient bucket){hint}")
