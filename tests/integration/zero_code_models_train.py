"""Plain torch data-parallel training that knows nothing about ccoll (used by test_zero_code_models.py).

    torchrun --nproc_per_node 2 zero_code_models_train.py ddp|accelerate|fsdp [--user-hook] [--steps N]

ddp: ``DistributedDataParallel(model)``; accelerate: ``Accelerator(cpu=True).prepare(model, opt)`` (DDP
inside); fsdp: FSDP2 ``fully_shard`` on each layer and the root. ``--user-hook`` registers torch's own
``allreduce_hook`` on the DDP model after construction, as a user or framework would.

Each rank also trains an unwrapped copy of the model on every rank's batches (it can generate them: the
batches are seeded by rank): with equal batch sizes that is what uncompressed data parallelism computes, so
the script prints its own uncompressed reference without a second launch. It prints, on every rank:

    rank R loss L ref_loss L0 param_delta D replicas_identical True

(param_delta: largest difference between the trained parameters and the reference's.)
"""
import argparse
import copy
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("stack", choices=("ddp", "accelerate", "fsdp"))
parser.add_argument("--user-hook", action="store_true")
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()
torch.set_num_threads(1)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Tanh(), torch.nn.Linear(256, 64))
reference = copy.deepcopy(model)
LR = 0.05

if args.stack == "accelerate":
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    rank, world = accelerator.process_index, accelerator.num_processes
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    wrapped, opt = accelerator.prepare(model, opt)
    backward = accelerator.backward
else:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    backward = torch.Tensor.backward
    if args.stack == "ddp":
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
        if args.user_hook:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            wrapped.register_comm_hook(None, default_hooks.allreduce_hook)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        wrapped = fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(wrapped.parameters(), lr=LR)
ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)
target = torch.randn(128, 64, generator=torch.Generator().manual_seed(7)) / 8


def batch(step: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(32, 128, generator=torch.Generator().manual_seed(1000 * step + r))
    return x, torch.tanh(x @ target)


for step in range(args.steps):
    x, y = batch(step, rank)
    loss = torch.nn.functional.mse_loss(wrapped(x), y)
    opt.zero_grad()
    backward(loss)
    opt.step()
    # the uncompressed reference: mean over ranks of each rank's mean loss, on one process
    ref_loss = sum(torch.nn.functional.mse_loss(reference(bx), by) for bx, by in (batch(step, r) for r in range(world)))
    ref_opt.zero_grad()
    (ref_loss / world).backward()
    ref_opt.step()

losses = [torch.zeros(1) for _ in range(world)]
dist.all_gather(losses, loss.detach().reshape(1))
full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in wrapped.parameters()]
flat = torch.cat([p.detach().reshape(-1) for p in full])
replicas = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(replicas, flat)
ref_flat = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
print(f"rank {rank} loss {float(sum(losses)) / world:.6f} ref_loss {float(ref_loss.detach()) / world:.6f} "
      f"param_delta {float((flat - ref_flat).abs().max()):.3e} "
      f"replicas_identical {all(torch.equal(r, flat) for r in replicas)}", flush=True)
dist.destroy_process_group()
