"""A plain data-parallel training script that knows nothing about ccoll (used by test_zero_code.py).

Launched by torchrun (env://) or mpirun (OMPI_* variables). Data parallelism over a 1-D DeviceMesh named
"dp" that spans every rank, as torchtitan names it: the mesh reuses the default group, so ccoll's
automatic resolver must place WORLD on dp. Gradients are averaged by hand with dist.all_reduce on the
mesh's group. Prints the final loss; ccoll (if activated) writes its stats at exit via CCOLL_STATS.
"""
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

for ours, mpi in (("RANK", "OMPI_COMM_WORLD_RANK"), ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE")):
    if ours not in os.environ and mpi in os.environ:
        os.environ[ours] = os.environ[mpi]
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
dp_group = mesh.get_group("dp")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 16))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(100 + rank)
for step in range(3):
    x = torch.randn(32, 256, generator=g)
    loss = (model(x) - x[:, :16]).pow(2).mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad, group=dp_group)
        p.grad /= world
    opt.step()
    opt.zero_grad()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
replicas = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(replicas, flat)
print(f"rank {rank} final loss {loss.item():.6f} replicas_identical {all(torch.equal(r, flat) for r in replicas)}", flush=True)
dist.destroy_process_group()
