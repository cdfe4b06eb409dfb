"""The process group a benchmark runs in: barriers, small reductions of Python numbers and the native
(uncompressed) collectives, over torch.distributed (:class:`TorchWorld`) or mpi4py (:class:`MPIWorld`)."""
from __future__ import annotations

import datetime
import os
from typing import Any, Callable

import torch

from ..errors import BenchError


class World:
    """Rank bookkeeping the harness needs besides the collectives themselves: barriers, small
    reductions of Python numbers, and the native (uncompressed) collectives."""

    backend: str
    rank: int
    size: int
    group: Any  # what ccoll's collectives take as group=
    device = torch.device("cpu")  # where the benchmarked tensors live

    def sync(self) -> None:
        """Wait for queued device work (CUDA kernels, NCCL) so that timers measure it."""

    def barrier(self) -> None: ...
    def reduce_max(self, values: list[float]) -> list[float]: ...
    def reduce_sum(self, values: list[float]) -> list[float]: ...
    def all_gather_bytes(self, data: bytes) -> list[bytes]: ...
    def broadcast_bytes_(self, buf: torch.Tensor) -> None: ...
    def native(self, op: str) -> Callable: ...
    def versions(self) -> str: ...
    def close(self) -> None: ...


class TorchWorld(World):
    """torch.distributed, env:// rendezvous. gloo: CPU tensors; nccl: one CUDA device per rank
    (LOCAL_RANK), tensors on it, device synchronised around every timed call."""

    def __init__(self, timeout_s: float, backend: str = "gloo"):
        import torch.distributed as dist

        self.dist, self.backend = dist, backend
        if backend == "nccl":
            if not torch.cuda.is_available():
                raise BenchError("--backend nccl needs CUDA devices")
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        # an existing default group (a launcher that initialised it, a test) is used as is and left open
        self.owned = not dist.is_initialized()
        if self.owned:
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        self.rank, self.size, self.group = dist.get_rank(), dist.get_world_size(), None

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        self.sync()
        if self.device.type == "cuda":
            self.dist.barrier(device_ids=[self.device.index])
        else:
            self.dist.barrier()

    def _reduce(self, values: list[float], op) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        self.dist.all_reduce(t, op=op)
        return t.cpu().tolist()

    def reduce_max(self, values):
        return self._reduce(values, self.dist.ReduceOp.MAX)

    def reduce_sum(self, values):
        return self._reduce(values, self.dist.ReduceOp.SUM)

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        out: list[Any] = [None] * self.size
        self.dist.all_gather_object(out, data)
        return out

    def broadcast_bytes_(self, buf: torch.Tensor) -> None:
        self.dist.broadcast(buf.view(-1).view(torch.uint8), 0)

    def native(self, op: str) -> Callable:
        d = self.dist
        # torch >= 2.13 renamed the *_tensor forms to *_single (the old names warn)
        gather = getattr(d, "all_gather_single", None) or d.all_gather_into_tensor
        scatter = getattr(d, "reduce_scatter_single", None) or d.reduce_scatter_tensor
        return {
            "all_reduce": lambda t: d.all_reduce(t),
            "all_gather": lambda out, inp: gather(out, inp),
            "reduce_scatter": lambda out, inp: scatter(out, inp),
            "broadcast": lambda t: d.broadcast(t, 0),
            "all_to_all": lambda out, inp: d.all_to_all_single(out, inp),
            "send": lambda t, peer: d.send(t, peer),
            "recv": lambda t, peer: d.recv(t, peer),
            "isend": lambda t, peer: d.isend(t, peer),
            "irecv": lambda t, peer: d.irecv(t, peer),
        }[op]

    def versions(self) -> str:
        if self.backend == "nccl":
            v = ".".join(map(str, torch.cuda.nccl.version()))
            return f"nccl {v} (torch.distributed), {torch.cuda.get_device_name(self.device)}"
        return "gloo (torch.distributed)"

    def close(self) -> None:
        if self.owned:
            self.dist.destroy_process_group()


class MPIWorld(World):
    backend = "mpi"

    def __init__(self):
        from mpi4py import MPI

        from ..transports import for_group

        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.size, self.group = self.comm.Get_rank(), self.comm.Get_size(), self.comm
        self.transport = for_group(self.comm)

    def barrier(self) -> None:
        self.comm.Barrier()

    def _reduce(self, values: list[float], op) -> list[float]:
        import numpy as np

        buf = np.array(values, dtype=np.float64)
        self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=op)
        return buf.tolist()

    def reduce_max(self, values):
        return self._reduce(values, self.MPI.MAX)

    def reduce_sum(self, values):
        return self._reduce(values, self.MPI.SUM)

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        return self.comm.allgather(data)

    def broadcast_bytes_(self, buf: torch.Tensor) -> None:
        self.transport.native_broadcast(buf.view(-1), 0)

    def native(self, op: str) -> Callable:
        # the uncompressed path of ccoll's collectives is the MPI transport's native call (mpi4py)
        from .. import collectives as cc

        g = self.comm
        return {
            "all_reduce": lambda t: cc.all_reduce(t, group=g),
            "all_gather": lambda out, inp: cc.all_gather_into_tensor(out, inp, group=g),
            "reduce_scatter": lambda out, inp: cc.reduce_scatter_tensor(out, inp, group=g),
            "broadcast": lambda t: cc.broadcast(t, 0, group=g),
            "all_to_all": lambda out, inp: cc.all_to_all_single(out, inp, group=g),
            "send": lambda t, peer: cc.send(t, peer, group=g),
            "recv": lambda t, peer: cc.recv(t, peer, group=g),
            "isend": lambda t, peer: cc.isend(t, peer, group=g),
            "irecv": lambda t, peer: cc.irecv(t, peer, group=g),
        }[op]

    def versions(self) -> str:
        import mpi4py

        lib = self.MPI.Get_library_version().strip().splitlines()[0]
        return f"mpi4py {mpi4py.__version__}, {lib}"

    def close(self) -> None:
        pass
