"""A small GPT in GPT-NeoX's layout: mpu-style tensor-parallel layers inside a DeepSpeed PipelineModule.

Tensor parallelism follows Megatron/NeoX's mpu: ``ColumnParallelLinear`` splits the output features
(forward: identity on the input, backward: all-reduce of the input gradient over the TP group),
``RowParallelLinear`` splits the input features (forward: all-reduce of the partial outputs, backward:
identity). Those collectives are plain ``torch.distributed`` calls on the TP group, exactly what NeoX
issues, so ``ccoll.patch`` sees and compresses them like it would in NeoX.

Simplifications (documented, deliberate): the byte-level embedding (256 x hidden) and the layer norms are
replicated on every TP rank rather than vocab-parallel; the LM head is a column-parallel linear whose
output is all-gathered (NeoX's ``parallel_output=False`` path). Every weight is initialised from the full
(unsplit) matrix drawn with a per-layer seed and then sliced, so the model is the same whatever the TP
degree and whatever the policy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..errors import CcollError


@dataclass(frozen=True)
class TPState:
    """This rank's tensor-parallel group (None when TP degree is 1), its rank in it and its size."""

    group: object | None
    rank: int
    size: int


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256
    seq_len: int = 128
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    ffn_mult: int = 4

    def check(self, tp: int) -> None:
        if self.hidden % self.heads:
            raise CcollError(f"hidden={self.hidden} is not divisible by heads={self.heads}")
        if self.heads % tp or (self.ffn_mult * self.hidden) % tp or self.vocab_size % tp:
            raise CcollError(f"tp={tp} must divide heads={self.heads}, ffn={self.ffn_mult * self.hidden} "
                             f"and vocab={self.vocab_size}")


# ---- mpu-style autograd functions: the TP collectives NeoX issues, on torch.distributed directly ----

class _CopyToTP(torch.autograd.Function):
    """Forward identity; backward all-reduce (the input of a column-parallel layer)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Forward all-reduce of the partial sums; backward identity (the output of a row-parallel layer)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    """Forward all-gather along the last dimension; backward keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x, tp: TPState):
        ctx.tp = tp
        x = x.contiguous()
        out = x.new_empty((tp.size * x.shape[0], *x.shape[1:]))  # ranks' slices stacked along dim 0
        dist.all_gather_into_tensor(out, x, group=tp.group)
        return torch.cat(out.view(tp.size, *x.shape).unbind(0), dim=-1)

    @staticmethod
    def backward(ctx, grad):
        tp = ctx.tp
        return grad.chunk(tp.size, dim=-1)[tp.rank].contiguous(), None


def _mark_split(*params: nn.Parameter) -> None:
    """Tell DeepSpeed these are shards (as Megatron does): its gradient-norm all-reduce over the TP group
    then counts every shard once, while replicated parameters are counted on TP rank 0 only."""
    for p in params:
        p.tensor_model_parallel = True


def _full_init(shape: tuple[int, ...], std: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * std


class ColumnParallelLinear(nn.Module):
    """y = x A^T + b with A split by rows (output features) across the TP group."""

    def __init__(self, in_features: int, out_features: int, tp: TPState, seed: int, std: float = 0.02,
                 gather_output: bool = False):
        super().__init__()
        self.tp, self.gather_output = tp, gather_output
        local = out_features // tp.size
        full = _full_init((out_features, in_features), std, seed)
        self.weight = nn.Parameter(full[tp.rank * local:(tp.rank + 1) * local].clone())
        self.bias = nn.Parameter(torch.zeros(local))
        if tp.size > 1:
            _mark_split(self.weight, self.bias)

    def forward(self, x):
        if self.tp.size > 1:
            x = _CopyToTP.apply(x, self.tp.group)
        y = F.linear(x, self.weight, self.bias)
        if self.gather_output and self.tp.size > 1:
            y = _GatherFromTP.apply(y, self.tp)
        return y


class RowParallelLinear(nn.Module):
    """y = x A^T + b with A split by columns (input features); partial outputs all-reduced, then bias."""

    def __init__(self, in_features: int, out_features: int, tp: TPState, seed: int, std: float = 0.02):
        super().__init__()
        self.tp = tp
        local = in_features // tp.size
        full = _full_init((out_features, in_features), std, seed)
        self.weight = nn.Parameter(full[:, tp.rank * local:(tp.rank + 1) * local].clone())
        self.bias = nn.Parameter(torch.zeros(out_features))  # added after the all-reduce: replicated
        if tp.size > 1:
            _mark_split(self.weight)

    def forward(self, x):
        y = F.linear(x, self.weight)
        if self.tp.size > 1:
            y = _ReduceFromTP.apply(y, self.tp.group)
        return y + self.bias


# ---- pipeline layers (each takes and returns one tensor, as DeepSpeed's PipelineModule needs) ----

class Embedding(nn.Module):
    """Byte embedding + learned positions (replicated across TP ranks)."""

    def __init__(self, cfg: GPTConfig, seed: int):
        super().__init__()
        self.tok = nn.Parameter(_full_init((cfg.vocab_size, cfg.hidden), 0.02, seed))
        self.pos = nn.Parameter(_full_init((cfg.seq_len, cfg.hidden), 0.01, seed + 1))

    def forward(self, tokens):
        return F.embedding(tokens, self.tok) + self.pos[: tokens.shape[1]]


class TransformerBlock(nn.Module):
    """Pre-LN block, NeoX-style: column-parallel QKV, local heads, row-parallel dense; same for the MLP."""

    def __init__(self, cfg: GPTConfig, tp: TPState, seed: int):
        super().__init__()
        self.local_heads = cfg.heads // tp.size
        self.head_dim = cfg.hidden // cfg.heads
        out_std = 0.02 / math.sqrt(2 * cfg.layers)  # GPT-2/NeoX scaled init of residual projections
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        # QKV laid out head-major ([h0: q k v][h1: q k v]...) so a row split gives whole heads per rank
        self.qkv = ColumnParallelLinear(cfg.hidden, 3 * cfg.hidden, tp, seed)
        self.dense = RowParallelLinear(cfg.hidden, cfg.hidden, tp, seed + 1, std=out_std)
        self.fc1 = ColumnParallelLinear(cfg.hidden, cfg.ffn_mult * cfg.hidden, tp, seed + 2)
        self.fc2 = RowParallelLinear(cfg.ffn_mult * cfg.hidden, cfg.hidden, tp, seed + 3, std=out_std)

    def forward(self, x):
        b, s, _ = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, s, self.local_heads, 3, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(3))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.dense(a.transpose(1, 2).reshape(b, s, self.local_heads * self.head_dim))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class LMHead(nn.Module):
    """Final layer norm + column-parallel vocabulary projection, gathered to full logits."""

    def __init__(self, cfg: GPTConfig, tp: TPState, seed: int):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.hidden)
        self.proj = ColumnParallelLinear(cfg.hidden, cfg.vocab_size, tp, seed, gather_output=True)

    def forward(self, x):
        return self.proj(self.ln(x))


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))


def build_pipeline(cfg: GPTConfig, topology, tp: TPState, seed: int):
    """The GPT as a DeepSpeed PipelineModule over ``topology`` (a PipeModelDataParallelTopology).

    Blocks are balanced across stages (``partition_method="type:TransformerBlock"``); each layer's
    initial weights come from ``seed`` and its index, so every policy starts from the same model."""
    from deepspeed.pipe import LayerSpec, PipelineModule

    cfg.check(tp.size)
    pp = topology.get_dim("pipe")
    if cfg.layers < pp:
        raise CcollError(f"layers={cfg.layers} must be >= pp={pp} (one block per pipeline stage at least)")
    base = seed * 10_000
    specs = [LayerSpec(Embedding, cfg, base)]
    specs += [LayerSpec(TransformerBlock, cfg, tp, base + 100 * (i + 1)) for i in range(cfg.layers)]
    specs.append(LayerSpec(LMHead, cfg, tp, base + 100 * (cfg.layers + 1)))
    return PipelineModule(layers=specs, loss_fn=lm_loss, topology=topology,
                          partition_method="type:TransformerBlock")
