"""Does a layout fit in a GPU's memory? A lower bound of the bytes one GPU holds in training.

Why: a speedup predicted for a layout that cannot run says nothing. The seed paper's GPT-NeoX-20B runs were on
16 GB V100s, while ``configs/20B.yml`` was written for 40 GB A100s; whether its micro-batch fits on a V100 says
whether the paper can have run that layout as written (``--published`` prints it).

Per GPU of pipeline stage ``i`` holding ``P`` parameters (:meth:`Layout.stage_params`), ``l`` layers:
    weights, gradients, optimizer (Rajbhandari et al., ZeRO, arXiv 1910.02054 sec. 3.1: mixed-precision Adam
        holds 2 + 2 bytes of 16-bit weights and gradients and K = 12 bytes of fp32 master weights, momentum and
        variance per parameter; fp32 training: 4 + 4 + 8): optimizer / dp from ZeRO-1, gradients / dp from
        ZeRO-2, weights / dp at ZeRO-3
    activations (Korthikanti et al. 2022, arXiv 2205.05198, eq. 2 with tensor parallelism ``t``, no sequence
        parallelism, 16-bit activations): one layer of one micro-batch holds s b h (10 + 24/t + 5 a s / (h t))
        bytes; with full recomputation (NeoX's ``checkpoint_num_layers: 1``) a layer keeps only its input,
        2 s b h bytes, and one layer's full set exists while it is recomputed. 1F1B keeps at most pp - i
        micro-batches in flight on stage i (Narayanan et al., SC'21, sec. 2.2), never more than m. fp32 training
        doubles the 16-bit count (an approximation: the 1-byte dropout masks stay 1 byte).
Left out, so the total is a LOWER bound ("does not fit" is certain, "fits" is not): framework buffers (DeepSpeed's
reduce / all-gather buckets -- 20B.yml sets 1.26e9 elements each), the CUDA context, the output layer's logits
and cross-entropy, temporary buffers of the codecs, allocator fragmentation.
"""
from __future__ import annotations

from .core import DTYPES

#: bytes per GiB (cluster files give HBM capacity in GiB: HBM stacks are binary)
GIB = 1 << 30


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
    full = s * b * h * (10 + 24 / t + 5 * a * s / (h * t)) * scale
    layers = lay.stage_layers()[stage]
    inflight = min(lay.micro_batches, lay.pp - stage)
    if lay.recompute:
        acts = inflight * layers * 2 * s * b * h * scale + full
    else:
        acts = inflight * layers * full
    return {"weights": weights, "gradients": grads, "optimizer": optim, "activations": acts,
            "total": weights + grads + optim + acts}


def fits(lay, node) -> dict | None:
    """The stage needing the most memory, its lower-bound bytes and the GPU's capacity; ``fits`` False when even
    the lower bound exceeds it. None when the cluster file gives no ``memory_gib``."""
    if node.memory_gib is None:
        return None
    need = [stage_bytes(lay, st) for st in range(lay.pp)]
    worst = max(range(lay.pp), key=lambda st: need[st]["total"])
    cap = node.memory_gib * GIB
    return {"stage": worst, "bytes": need[worst], "capacity": cap, "fits": need[worst]["total"] <= cap}
