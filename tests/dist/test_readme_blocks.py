"""Every ```python block of README.md runs as written: the text is extracted from the README (never
retyped) and executed, in 2 real gloo ranks where it needs a process group.

Blocks that are fragments of a training script use names they do not define (``model``, ``train``,
``path``, groups). Such a block gets a prelude that defines them, run before the block's own text in the
same namespace, and an epilogue that checks the block did what it says (stats, a file written). Preludes
are matched by a phrase of the block; a block no phrase matches runs alone, in a fresh namespace."""
from __future__ import annotations

import os
import pathlib
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch import run_gloo  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
BLOCKS = re.findall(r"^```python\n(.*?)^```", (REPO / "README.md").read_text(), flags=re.S | re.M)

_MODEL = """
import os, torch, torch.distributed as dist
import ccoll
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 8))
path = os.path.join(TMP, f"ckpt{rank}.pt")

def steps_of(m, n):
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    for step in range(n):
        x = torch.randn(16, 64, generator=torch.Generator().manual_seed(10 * step + rank))
        m(x).pow(2).mean().backward()
        yield
        opt.step()
        opt.zero_grad()
"""

# phrase of the block -> (prelude, epilogue); both run in the block's namespace, in a gloo rank
PRELUDES = {
    # "Usage: the API": `train(model, ...)` is the user's loop; here a hand-written DP loop on a DeviceMesh
    # "dp" group (which the automatic resolver places), averaging gradients with dist.all_reduce
    'ccoll.patch.install("configs/hybrid.yaml")': (_MODEL + """
def train(m, steps):
    global mesh  # the automatic resolver finds meshes that are alive
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    dp = mesh.get_group("dp")
    for _ in steps_of(m, steps):
        for p in m.parameters():
            dist.all_reduce(p.grad, group=dp)
            p.grad /= world
""", """
try:
    rows = {(r["dim"], r["op"], r["codec"].split(":")[0]) for r in ccoll.stats()}
    assert ("dp", "all_reduce", "int4") in rows, rows
    assert "ccoll" in torch.load(path, weights_only=False)
finally:
    ccoll.patch.uninstall()
"""),
    # DDP by hand: `model` and its DDP wrapper `ddp_model`; afterwards train past the block's warm-up
    "ddp_model.register_comm_hook(state, ccoll.ddp.compress_hook)": (_MODEL + """
ddp_model = torch.nn.parallel.DistributedDataParallel(model)
""", """
for _ in steps_of(ddp_model, 12):
    pass
rows = {(r["dim"], r["op"], r["codec"].split(":")[0]): r["calls"] for r in ccoll.stats()}
assert rows[("dp", "all_reduce", "int8")] == 2, rows  # steps 10 and 11: after warmup_steps=10
assert os.path.exists(path)
"""),
    # FSDP2 by hand: a model with `.blocks`, `fully_shard` imported
    "ccoll.fsdp.compress(model": ("""
import torch, ccoll
from torch.distributed.fsdp import fully_shard

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(2))

    def forward(self, x):
        for b in self.blocks:
            x = torch.tanh(b(x))
        return x

torch.manual_seed(0)
model = Net()
""", """
model(torch.randn(8, 64)).sum().backward()
rows = {(r["dim"], r["op"], r["codec"].split(":")[0]) for r in ccoll.stats()}
assert ("dp", "reduce_scatter", "int8") in rows, rows
assert len(comp.modules) == 3
"""),
    # collectives: the tensors and groups the block names; rank 0 is the first pipeline stage, rank 1 the last
    "ccoll.all_gather_into_tensor(out, inp": ("""
import torch, torch.distributed as dist
import ccoll
rank, world = dist.get_rank(), dist.get_world_size()
dp_group = tp_group = dist.new_group(list(range(world)))
grad, inp, act = torch.randn(8192), torch.randn(8192), torch.randn(4096)
out = torch.empty(world * inp.numel())
ef = ccoll.ErrorFeedback()
next_stage, prev_stage = (1, None) if rank == 0 else (None, 0)
""", """
assert len(ef) > 0 and torch.isfinite(out).all() and torch.isfinite(act).all()
"""),
}


def _prelude_of(block: str):
    found = [v for k, v in PRELUDES.items() if k in block]
    assert len(found) <= 1, block
    return found[0] if found else None


def _run_block(rank: int, world: int, index: int, tmp: str):
    import ccoll

    os.chdir(REPO)  # the README's paths (configs/...) are relative to the checkout
    ccoll.reset_stats()
    prelude, epilogue = _prelude_of(BLOCKS[index])
    ns: dict = {"TMP": tmp, "__name__": "__readme__"}
    exec(compile(prelude, "<prelude>", "exec"), ns)
    exec(compile(BLOCKS[index], f"README.md python block {index}", "exec"), ns)
    exec(compile(epilogue, "<epilogue>", "exec"), ns)
    return True


def test_given_readme_when_reading_python_blocks_expect_every_fragment_has_a_prelude_and_each_prelude_a_block():
    assert len(BLOCKS) >= 6
    matched = [k for k in PRELUDES if any(k in b for b in BLOCKS)]
    assert matched == list(PRELUDES), "a README block a prelude was written for has changed"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_given_readme_python_block_when_executed_as_written_expect_it_runs(index, tmp_path, monkeypatch):
    if _prelude_of(BLOCKS[index]) is None:  # self-contained: run here, in a fresh namespace
        monkeypatch.chdir(REPO)
        exec(compile(BLOCKS[index], f"README.md python block {index}", "exec"), {"__name__": "__readme__"})
        return
    assert run_gloo(2, _run_block, index, str(tmp_path), timeout_s=180) == [True, True]
