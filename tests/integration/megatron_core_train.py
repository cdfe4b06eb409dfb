"""A Megatron-core GPT training script that knows nothing about ccoll (used by test_megatron_core.py):
``torchrun --nproc_per_node 4 megatron_core_train.py --tp 2 --pp 1 --steps 3 --out OUT``.

Megatron-core 0.16.1's own pieces, wired as Megatron-LM's pretrain_gpt.py wires them: ``parallel_state``
groups (``initialize_model_parallel``), ``GPTModel`` with the local layer spec (``get_gpt_layer_local_spec``,
``use_cpu_initialization``), its ``DistributedDataParallel`` (contiguous gradient buffer, buckets reduced
as backward fills them: ``overlap_grad_reduce``, ``bucket_size``), ``get_megatron_optimizer`` (Adam in
its ``FP32Optimizer``) and ``get_forward_backward_func``'s schedule (1F1B with PP > 1) calling
``finalize_model_grads``. 4 CPU gloo ranks; every rank writes ``OUT.rank<R>.json``: its coordinates, its
losses as float.hex (last pipeline stage), a digest of its parameters, whether its DP replicas hold
identical parameters, and whether the functions Megatron bound at import are torch.distributed's current
ones.

What Megatron-core cannot do on a CPU-only torch (2.13.0+cpu), and what this script does about it
(nothing else is changed):

- ``torch.cuda.current_device()`` (``megatron.core.distributed.param_and_grad_buffer._ParamAndGradBuffer``
  allocates the gradient buffer on it; ``pipeline_parallel.p2p_communication.P2PCommunicator._communicate``
  its receive buffers) raises ``AssertionError: Torch not compiled with CUDA enabled``: it returns the CPU
  device here.
- ``tensor_parallel.model_parallel_cuda_manual_seed`` (``CudaRNGStatesTracker.add`` ->
  ``torch.cuda.get_rng_state()``) raises the same: the script makes Megatron's own RNG tracker that never
  touches a CUDA generator (``tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True)``,
  whose ``fork`` is a no-op); dropout is 0, so no random number is drawn inside model-parallel regions, and
  ``use_cpu_initialization`` initialises every weight from the CPU generator.
- ``torch.zeros([], dtype=torch.int, device="cuda")`` (``megatron.core.pipeline_parallel.schedules``:
  ``forward_backward_no_pipelining`` and ``forward_backward_pipelining_without_interleaving``'s
  ``total_num_tokens``) and ``torch.tensor([1.0], device='cuda')`` (``optimizer.FP32Optimizer.__init__``'s
  ``_scale``) raise the same: factory calls asking for ``device="cuda"`` get the CPU device, through a
  ``TorchFunctionMode`` around the optimizer's construction and each training step only.
- ``optimizer.clip_grads.clip_grad_by_total_norm_fp32`` asserts ``param.grad.type() ==
  'torch.cuda.FloatTensor'`` (``AssertionError``): ``clip_grad=0.0`` (the gradient norm is still computed).
- The distributed optimizer cannot be built: ``optimizer.distrib_optimizer.DistributedOptimizer.
  _build_model_and_main_param_groups`` raises ``TypeError: Wrapped parameters must be one of
  torch.cuda.FloatTensor, torch.cuda.HalfTensor, or torch.cuda.BFloat16Tensor. Received torch.FloatTensor``
  (``--distributed-optimizer`` shows it). So its DDP's reduce-scatter / all-gather path
  (``dist_reduce_scatter_func`` / ``dist_all_gather_func``) does not run here; ``cached_current`` checks
  that those names are bound to what torch.distributed holds (ccoll's wrappers under ccoll-run).
"""
import argparse
import hashlib
import json
import sys

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

VOCAB, SEQ, HIDDEN, HEADS, LAYERS, MICRO, NUM_MICRO = 128, 32, 64, 4, 2, 2, 2

p = argparse.ArgumentParser()
p.add_argument("--tp", type=int, default=2)
p.add_argument("--pp", type=int, default=1)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--distributed-optimizer", action="store_true")
p.add_argument("--out", required=True)
args = p.parse_args()

torch.set_num_threads(1)
torch.cuda.current_device = lambda: torch.device("cpu")  # CPU-only torch: see the docstring


class CudaFactoriesOnCpu(TorchFunctionMode):
    """``device="cuda"`` in a tensor factory -> the CPU (the schedules' total_num_tokens)."""

    def __torch_function__(self, func, types, fargs=(), kwargs=None):
        kwargs = kwargs or {}
        dev = kwargs.get("device")
        if dev is not None and torch.device(dev).type == "cuda":
            kwargs = {**kwargs, "device": torch.device("cpu")}
        return func(*fargs, **kwargs)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

from megatron.core import parallel_state as ps  # noqa: E402
from megatron.core import tensor_parallel  # noqa: E402
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: E402
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: E402
from megatron.core.pipeline_parallel import get_forward_backward_func  # noqa: E402
from megatron.core.transformer import TransformerConfig  # noqa: E402

ps.initialize_model_parallel(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp)
tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True)  # see the docstring
torch.manual_seed(1234)
tp_rank, pp_rank, dp_rank = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank(), ps.get_data_parallel_rank()
dp_size = ps.get_data_parallel_world_size()

config = TransformerConfig(
    num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, use_cpu_initialization=True,
    tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp, pipeline_dtype=torch.float32,
    hidden_dropout=0.0, attention_dropout=0.0, bias_dropout_fusion=False, bias_activation_fusion=False,
    masked_softmax_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
    apply_rope_fusion=False, batch_p2p_sync=False,
)
model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=VOCAB,
                 max_sequence_length=SEQ, pre_process=ps.is_pipeline_first_stage(),
                 post_process=ps.is_pipeline_last_stage(), parallel_output=True,
                 share_embeddings_and_output_weights=False)
ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=False, overlap_grad_reduce=True,
                                           use_distributed_optimizer=args.distributed_optimizer, bucket_size=20000)
model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
with CudaFactoriesOnCpu():
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-3, clip_grad=0.0, use_distributed_optimizer=args.distributed_optimizer,
                        bf16=False, fp16=False, params_dtype=torch.float32), [model])
config.finalize_model_grads_func = finalize_model_grads
config.no_sync_func = model.no_sync
config.grad_scale_func = optimizer.scale_loss


def batches():
    g = torch.Generator().manual_seed(100 + dp_rank)  # every TP / PP rank of a replica: the same data
    pos = torch.arange(SEQ).unsqueeze(0).expand(MICRO, SEQ)
    pool = [torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=g) for _ in range(NUM_MICRO)]
    while True:  # the same micro-batches every step: the loss falls
        for t in pool:
                yield {"tokens": t[:, :-1].contiguous(), "labels": t[:, 1:].contiguous(), "position_ids": pos,
                   "loss_mask": torch.ones(MICRO, SEQ)}


def forward_step(data_iterator, model):
    b = next(data_iterator)
    out = model(b["tokens"], b["position_ids"], None, labels=b["labels"])

    def loss_func(output_tensor):
        loss = (output_tensor.float().view(-1) * b["loss_mask"].view(-1)).sum() / b["loss_mask"].sum()
        return loss, {"lm loss": loss.detach().clone()}  # the schedule divides `loss` in place

    return out, loss_func


data = batches()
fwd_bwd = get_forward_backward_func()
losses = []
for step in range(args.steps):
    model.zero_grad_buffer()
    optimizer.zero_grad()
    with CudaFactoriesOnCpu():
        out = fwd_bwd(forward_step_func=forward_step, data_iterator=data, model=[model],
                      num_microbatches=NUM_MICRO, seq_length=SEQ, micro_batch_size=MICRO, forward_only=False)
        ok, grad_norm, _ = optimizer.step()
    assert ok, "optimizer step skipped"
    if ps.is_pipeline_last_stage():
        losses.append(float(torch.stack([o["lm loss"] for o in out]).mean()))

flat = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
got = [torch.empty_like(flat) for _ in range(dp_size)]
dist.all_gather(got, flat, group=ps.get_data_parallel_group())  # list form: exact under ccoll
from megatron.core.distributed import param_and_grad_buffer as pgb  # noqa: E402

result = {"rank": rank, "tp": tp_rank, "pp": pp_rank, "dp": dp_rank, "losses": [x.hex() for x in losses],
          # the functions Megatron bound at import (its reduce-scatter / all-gather for the distributed
          # optimizer) are the ones torch.distributed holds now (under ccoll-run: ccoll's)
          "cached_current": (pgb.dist_reduce_scatter_func is dist.reduce_scatter_tensor
                             and pgb.dist_all_gather_func is dist.all_gather_into_tensor),
          "params_sha": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
          "replicas_identical": all(torch.equal(x.view(torch.int32), got[0].view(torch.int32)) for x in got)}
if "ccoll" in sys.modules:  # only to say what ccoll counted; the training above never touched it
    import ccoll.patch

    result["ccoll_steps"] = ccoll.patch.steps()
with open(f"{args.out}.rank{rank}.json", "w") as f:
    json.dump(result, f)
print(f"rank {rank} tp {tp_rank} pp {pp_rank} dp {dp_rank} losses {losses}", flush=True)
ps.destroy_model_parallel()
dist.barrier()
dist.destroy_process_group()
