"""Analytical traffic and step-time model of GPT training per parallel dimension (``python -m ccoll.model``).

Why: a user deciding whether to turn ccoll on needs to know what it buys on *their* cluster; measuring
every cluster is impossible, but the bytes each dimension moves follow from the layout, and step time
follows from bytes, link bandwidths, codec throughput and compute time.

Traffic per optimizer step, per rank, for a GPT of ``L`` layers, hidden ``h``, sequence ``s``, vocabulary
``V``, micro-batch ``b``, ``m`` micro-batches, degrees dp/tp/pp (Megatron TP, DeepSpeed/Megatron PP,
ZeRO for DP; "elements" are of the activation / gradient dtype):

TP (Megatron column/row-parallel layers, per micro-batch, on a stage holding ``l`` layers):
    forward:  2 all-reduces per layer (attention output, MLP output) of b*s*h elements; 1 with NeoX's
              parallel residual (``parallel_residual``: both outputs summed, one all-reduce); doubled with
              activation recomputation (``recompute``: the forward runs again in backward)
    backward: 2 all-reduces per layer (inputs of QKV and of the first MLP linear) of b*s*h elements
    embedding: vocab-parallel: 1 forward all-reduce of b*s*h; replicated: none
    LM head:  column-parallel input: 1 backward all-reduce of b*s*h; output gathered (``gathered``):
              1 all-gather of b*s*V/tp per rank, or vocab-parallel cross-entropy (``parallel``):
              3 all-reduces of b*s elements
    sequence parallelism (``sequence_parallel``): each all-reduce above becomes a reduce-scatter of b*s*h and an
              all-gather of its b*s*h/tp shard (the same ring bytes), plus the all-gather each column-parallel linear
              repeats in backward for its weight gradient (``core._sp_flows``)
PP (per micro-batch and stage boundary, sender side): the activation b*s*h forward and its gradient
    b*s*h backward; every TP rank of a stage sends its full copy (DeepSpeed; ``pp_scatter_gather``
    divides by tp as Megatron's scatter-gather optimisation does, and so does ``sequence_parallel``); with ``pp_mask`` GPT-NeoX's fp16
    attention mask [b, 1, s, s] travels with every forward activation
DP (per step): the gradient reduction of this rank's parameters P_rank (the local shard: sharded
    weights / tp + replicated ones), as ``all_reduce`` (ZeRO-0/1 by default) or ``reduce_scatter``
    (ZeRO-2/3, or ``zero_reduce="reduce_scatter"``: DeepSpeed's ``reduce_scatter: true``), in ``grad_dtype``
    (fp32 reduction of bf16 training); with ZeRO-1/2 the updated parameter partition P_rank/dp is
    all-gathered once per step; ZeRO-3 gathers it before every forward and backward of every micro-batch
    (2m all-gathers; its prefetch/overlap with compute is not modelled)

Raw bytes count what a rank contributes (the tensor it passes to the collective, as ``ccoll.stats``
does); wire bytes what ccoll's collectives put on the wire for them under the policy (the codec's
``encoded_nbytes`` over the same segments/chunks the collectives use; calls the policy keeps native,
including those below ``min_bytes``, count raw).

Flat step time (``step_time`` with a ``Cluster`` of per-GPU rates, for rates given by hand: ``--tp-gbps`` /
``--inter-gbps`` without ``--cluster``; ``--preset`` runs on its sourced node file, ``core.PRESET_CLUSTERS``, and
``--clusters``, ``--validate``, ``--from-run``, the shaped runs and ``--cluster`` use the mechanistic ``timing.predict``,
below) -- per rank, no overlap unless ``dp_overlap``: compute + TP + PP + DP link time + codec time,
where link time = bytes moved by a bandwidth-optimal algorithm / bandwidth of that dimension
(all-reduce 2(n-1)/n x size, reduce-scatter / all-gather (n-1)/n x size, p2p 1 x size) and codec time =
values encoded and decoded / codec throughput. Compute: given, or 6 x parameters x tokens (+ attention)
/ (GPUs x peak x MFU), stretched by the pipeline bubble (m + pp - 1) / m.

    python -m ccoll.model --preset neox20b-v100 --policy configs/hybrid.yaml      # on its node file (lassen)
    python -m ccoll.model --layers 4 --hidden 128 --heads 4 --seq 128 --vocab 256 --micro-batch 4 \\
        --micro-batches 2 --dp 2 --pp 2 --tp 1 --zero 1 --dtype float32 --policy configs/hybrid.yaml
    python -m ccoll.model --clusters --codec-gbps 100         # every preset on its node file
    python -m ccoll.model --validate results/convergence/summary.json
    python -m ccoll.model --preset neox20b-v100 --cluster lassen --policy configs/zhybrid.yaml   # mechanistic
    python -m ccoll.model --published                         # the scored protocol + the seed paper's envelope
    python -m ccoll.model --from-run run1/summary.json run2/summary.json --ranks 8   # repeated runs: their spread
    python -m ccoll.model --cluster-template my-node.yaml     # a commented node file for your machine

The mechanistic step time (``--cluster``: placement on nodes, rails shared by a node's GPUs, alpha-beta per
message, ring / hierarchical / all-to-all algorithms, codec roofline, codec pipelined with the wire, 1F1B
pipeline slots, DP after the schedule) is :mod:`ccoll.model.timing`; node descriptions are
:mod:`ccoll.model.clusters` (``configs/clusters/*.yaml``, each naming its machine, each figure with its public source).
Every prediction on a node file checks memory first and refuses a layout that cannot fit (:mod:`ccoll.model.memory`);
the framework knobs (``--grad-dtype``, ``--distributed-optimizer``, ``--zero-reduce``, ``--recompute``,
``--parallel-residual``, ``--flash-attention``, ``--sequence-parallel``, ``--pp-mask``, ``--dp-bucket-mb``, ``--rails``,
``--rail-gbps``) set :class:`Layout` fields and
the node's NICs; :mod:`ccoll.model.scored` is the scored protocol for published results.
"""
from __future__ import annotations

from .cli import cluster_table, format_step, main, print_traffic, why_line, why_line_node
from .core import (_CODEC_PASSES, _LATE_STEP, DIMS, DTYPES, PRESET_CLUSTERS, PRESETS, RUNNER, Cluster, Flow, Layout, _policy_op,
                   _rate_gbps, codec_gbps_needed, codec_throughput, compute_seconds, flows, per_dim, preset_cluster,
                   runner_layout,
                   step_time, traffic, training_flops, wire_nbytes)
from .fromrun import from_run, validate

__all__ = ["Cluster", "Flow", "Layout", "PRESETS", "PRESET_CLUSTERS", "preset_cluster", "RUNNER", "cluster_table", "codec_gbps_needed", "codec_throughput",
           "compute_seconds", "flows", "format_step", "main", "per_dim", "print_traffic", "runner_layout",
           "step_time", "traffic", "training_flops", "validate", "from_run", "why_line", "why_line_node",
           "wire_nbytes"]
