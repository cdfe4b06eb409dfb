"""A plain torch.distributed script that knows nothing about ccoll and never steps an optimizer (used by
test_zero_code_report.py): an all_reduce loop of float tensors on WORLD.

    torchrun --nproc_per_node 2 zero_code_plain.py [--calls N] [--destroy]

``--destroy``: destroy the process group before exiting (the script's last act), as careful scripts do.
"""
import argparse

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--calls", type=int, default=5)
parser.add_argument("--destroy", action="store_true")
args = parser.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.randn(262144, generator=torch.Generator().manual_seed(rank))  # 1.05 MB of float32
for _ in range(args.calls):
    y = x.clone()
    dist.all_reduce(y)
print(f"rank {rank} done", flush=True)
if args.destroy:
    dist.destroy_process_group()
