"""A plain DeepSpeed training script that knows nothing about ccoll (used by test_zero_code.py), started
by the ``deepspeed`` launcher. No mpu: DeepSpeed's data parallelism spans every rank, so ccoll's automatic
resolver must place its gradient all-reduce on dp."""
import deepspeed
import torch

torch.set_num_threads(1)
deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256))
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                                       config={"train_micro_batch_size_per_gpu": 8, "steps_per_print": 10 ** 9})
g = torch.Generator().manual_seed(100 + engine.global_rank)
for step in range(3):
    x = torch.randn(8, 256, generator=g)
    loss = engine(x).pow(2).mean()
    engine.backward(loss)
    engine.step()
print(f"rank {engine.global_rank} final loss {loss.item():.6f}", flush=True)
