"""Transport over an mpi4py communicator: buffer-based calls (Alltoall, Allgather, Bcast, Isend/Irecv,
Allreduce, Reduce_scatter_block, Alltoallv) on the tensors' memory, no pickling.

CUDA tensors: when the MPI library is CUDA-aware (Open MPI's ``MPIX_Query_cuda_support()``, looked up in
the loaded libmpi because mpi4py does not wrap it; ``CCOLL_MPI_CUDA_AWARE=0|1`` overrides) device
buffers are handed to MPI directly after synchronising the caller's stream (MPI is not stream-ordered);
otherwise they are staged through host memory. Detected once per process and logged once.

Progress: Open MPI moves a nonblocking request's data only inside MPI calls (it has no progress thread
by default). A rank that waits on torch.distributed work while its own MPI requests are outstanding
would then stall its peers' MPI waits, and in a job that mixes both transports (a policy's
``transport:`` per op) with ranks waiting their handles in different orders that is a deadlock neither
transport has alone (``python -m ccoll.bench.two_transports --wait-order rank`` reproduced it). So while
any request ccoll started is outstanding, one daemon thread enters MPI every :data:`PROGRESS_INTERVAL_S`
(an ``Iprobe``, which consumes nothing); it also lets async MPI calls really overlap the caller's work.
It needs ``MPI_THREAD_MULTIPLE`` (mpi4py asks for it by default); without it no thread is started.

Reductions MPI has no datatype for (bfloat16, bool, complex) are done as an all-gather of the bytes
followed by the same local reduction on every rank (rows added in rank order; floats accumulated in
fp32), so results stay identical on every rank.
"""
from __future__ import annotations

import ctypes
import os
import atexit
import threading
import time
from typing import Any

import torch

from ..errors import TransportError
from ..log import logger
from ..once import once
from .base import Transport, check_all_gather, check_all_to_all, check_bytes
from .handle import Handle

# dtypes whose numpy view MPI reduces natively (mpi4py maps numpy float16 to MPI's 16-bit float)
_MPI_REDUCIBLE = {
    torch.float16, torch.float32, torch.float64,
    torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
}


def _find_libmpi() -> str | None:
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                if os.path.basename(path).startswith("libmpi.so"):
                    return path
    except OSError:
        return None
    return None


@once
def cuda_aware() -> bool:
    """Whether the MPI library accepts CUDA device buffers: detected once per process (the library does
    not change under a running job) and logged once."""
    env = os.environ.get("CCOLL_MPI_CUDA_AWARE")
    if env in ("0", "1"):
        aware, how = env == "1", "CCOLL_MPI_CUDA_AWARE"
    else:
        aware, how = False, "MPIX_Query_cuda_support not found"
        path = _find_libmpi()
        if path:
            try:
                fn = ctypes.CDLL(path).MPIX_Query_cuda_support
                fn.restype = ctypes.c_int
                aware, how = bool(fn()), f"MPIX_Query_cuda_support() in {path}"
            except (OSError, AttributeError):
                pass
    logger.info("ccoll: MPI CUDA-aware: %s (%s); %s", aware, how,
                "device buffers go to MPI directly" if aware else "CUDA tensors are staged through host memory")
    return aware


#: how often the progress thread enters MPI while requests are outstanding
PROGRESS_INTERVAL_S = 2e-4


class _Progress:
    """Counts ccoll's outstanding MPI requests; a daemon thread drives MPI's progress while any is."""

    def __init__(self) -> None:
        self._outstanding = 0
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def started(self) -> None:
        with self._cv:
            self._outstanding += 1
            if self._thread is None and not self._stopped:
                from mpi4py import MPI

                if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
                    self._stopped = True  # calling MPI from a second thread would be erroneous
                    return
                # registered after mpi4py's own exit hook, so it runs first: the thread is gone before
                # MPI_Finalize (an MPI call after it aborts the process)
                atexit.register(self.stop)
                self._thread = threading.Thread(target=self._loop, args=(MPI,), name="ccoll-mpi-progress",
                                                daemon=True)
                self._thread.start()
            self._cv.notify()

    def finished(self) -> None:
        with self._cv:
            self._outstanding -= 1

    def outstanding(self) -> int:
        return self._outstanding

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()

    def _loop(self, MPI: Any) -> None:
        probe = MPI.COMM_WORLD.Iprobe
        while True:
            with self._cv:
                while self._outstanding <= 0 and not self._stopped:
                    self._cv.wait()
                if self._stopped or MPI.Is_finalized():
                    return
            probe(MPI.ANY_SOURCE, MPI.ANY_TAG)
            time.sleep(PROGRESS_INTERVAL_S)


_progress = _Progress()


def _handle(req: Any, then: Any) -> Handle:
    """A handle for one started request; the progress thread runs until the handle's ``then`` has."""
    _progress.started()

    def finish() -> Any:
        _progress.finished()
        return then()

    return Handle([req], finish)


class MPITransport(Transport):
    kind = "mpi"
    short_receives = True  # a receive's count is an upper bound

    def subgroups(self, node: int, local: int, intra: "list[int]", inter: "list[int]") -> "tuple[Any, Any]":
        """Two ``Split`` calls of the communicator (collective over it): by node, ordered by local index, and
        by local index, ordered by node."""
        return self.comm.Split(node, local), self.comm.Split(local, node)

    def __init__(self, comm: Any):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm
        if comm == MPI.COMM_NULL:
            # what Split/Create give ranks outside the new group: like torch's non-member, nothing to do
            self.rank, self.world_size = -1, 0
        elif not isinstance(comm, MPI.Intracomm):
            raise TransportError(f"MPI transport needs an intra-communicator, got {type(comm).__name__}")
        else:
            self.rank = comm.Get_rank()
            self.world_size = comm.Get_size()
        self.cuda_aware = cuda_aware()
        self._ops = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "product": MPI.PROD}
        self._to_world: list[int] | None = None

    # ranks -------------------------------------------------------------------------------------
    def _world_ranks(self) -> list[int]:
        if self._to_world is None:
            MPI = self.MPI
            mine, world = self.comm.Get_group(), MPI.COMM_WORLD.Get_group()
            self._to_world = list(mine.Translate_ranks(list(range(self.world_size)), world))
            mine.Free()
            world.Free()
        return self._to_world

    def group_rank(self, global_rank: int) -> int:
        try:
            return self._world_ranks().index(int(global_rank))
        except ValueError:
            raise TransportError(f"global rank {global_rank} is not in this communicator") from None

    def global_rank(self, group_rank: int) -> int:
        return self._world_ranks()[int(group_rank)]

    # buffers -----------------------------------------------------------------------------------
    def _src(self, t: torch.Tensor) -> Any:
        """A buffer MPI reads from (and a reference keeping any staging copy alive)."""
        if t.device.type == "cpu":
            return t.detach().numpy()
        if self.cuda_aware:
            torch.cuda.current_stream(t.device).synchronize()
            return t
        return t.detach().cpu().numpy()

    def _dst(self, t: torch.Tensor) -> tuple[Any, Any]:
        """(buffer MPI writes into, finish step copying a staged result back or None)."""
        if t.device.type == "cpu":
            return t.detach().numpy(), None
        if self.cuda_aware:
            torch.cuda.current_stream(t.device).synchronize()
            return t, None
        host = torch.empty(t.shape, dtype=t.dtype, device="cpu")
        return host.numpy(), lambda: t.copy_(host)

    def _run(self, blocking, nonblocking, async_op: bool, finish, keep=()) -> Handle | None:
        if async_op:
            return _handle(nonblocking(), lambda: (keep, finish and finish())[1])
        blocking()
        if finish is not None:
            finish()
        return None

    # byte movement -----------------------------------------------------------------------------
    def all_to_all(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False) -> Handle | None:
        check_all_to_all(output, input, self.world_size)
        s = self._src(input)
        d, finish = self._dst(output)
        return self._run(lambda: self.comm.Alltoall(s, d), lambda: self.comm.Ialltoall(s, d), async_op, finish, (s, d))

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False) -> Handle | None:
        check_all_gather(output, input, self.world_size)
        s = self._src(input)
        d, finish = self._dst(output)
        return self._run(lambda: self.comm.Allgather(s, d), lambda: self.comm.Iallgather(s, d), async_op, finish, (s, d))

    def broadcast(self, buf: torch.Tensor, src: int, async_op: bool = False) -> Handle | None:
        check_bytes(buf)
        if self.rank == src:
            b, finish = self._src(buf), None
        else:
            b, finish = self._dst(buf)
        return self._run(lambda: self.comm.Bcast(b, root=src), lambda: self.comm.Ibcast(b, root=src), async_op, finish, (b,))

    def isend(self, buf: torch.Tensor, dst: int, tag: int = 0) -> Handle:
        check_bytes(buf)
        s = self._src(buf)
        return _handle(self.comm.Isend(s, dest=dst, tag=tag), lambda: (s, None)[1])

    def irecv(self, buf: torch.Tensor, src: int, tag: int = 0) -> Handle:
        check_bytes(buf)
        d, finish = self._dst(buf)
        return _handle(self.comm.Irecv(d, source=src, tag=tag), lambda: (d, finish and finish())[1])


    # native calls ------------------------------------------------------------------------------
    def native_all_reduce(self, tensor: torch.Tensor, op: str, async_op: bool = False) -> Handle | None:
        mpi_op, post = self._reduce_op(op, tensor)
        if tensor.dtype not in _MPI_REDUCIBLE:
            self._reduce_by_gather(tensor.reshape(-1), tensor.reshape(-1), op, full=True)
            return self._done(async_op)
        d, finish = self._dst(tensor)
        if d is not tensor and tensor.device.type != "cpu":  # staged: the host copy holds the input
            d[...] = tensor.detach().cpu().numpy()

        def fin():
            if finish is not None:
                finish()
            if post is not None:
                post()

        IN_PLACE = self.MPI.IN_PLACE
        return self._run(
            lambda: self.comm.Allreduce(IN_PLACE, d, mpi_op),
            lambda: self.comm.Iallreduce(IN_PLACE, d, mpi_op),
            async_op, fin, (d,),
        )

    def native_reduce_scatter(
        self, output: torch.Tensor, input: torch.Tensor, op: str, async_op: bool = False
    ) -> Handle | None:
        if input.numel() != output.numel() * self.world_size:
            raise TransportError(
                f"reduce_scatter input must hold {self.world_size} x {output.numel()} elements, got {input.numel()}"
            )
        mpi_op, post = self._reduce_op(op, output)
        if input.dtype not in _MPI_REDUCIBLE:
            self._reduce_by_gather(output.reshape(-1), input.reshape(-1), op, full=False)
            return self._done(async_op)
        s = self._src(input)
        d, finish = self._dst(output)

        def fin():
            if finish is not None:
                finish()
            if post is not None:
                post()

        return self._run(
            lambda: self.comm.Reduce_scatter_block(s, d, mpi_op),
            lambda: self.comm.Ireduce_scatter_block(s, d, mpi_op),
            async_op, fin, (s, d),
        )

    def native_all_to_all(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int] | None = None,
                          input_split_sizes: list[int] | None = None, async_op: bool = False) -> Handle | None:
        p = self.world_size
        if not output_split_sizes and not input_split_sizes:
            return self.all_to_all(output.reshape(-1).view(torch.uint8), input.reshape(-1).view(torch.uint8), async_op)
        out_row = output[0].numel() * output.element_size() if output.dim() else output.element_size()
        in_row = input[0].numel() * input.element_size() if input.dim() else input.element_size()
        out_split = list(output_split_sizes) if output_split_sizes else [output.shape[0] // p] * p
        in_split = list(input_split_sizes) if input_split_sizes else [input.shape[0] // p] * p
        if len(out_split) != p or len(in_split) != p or sum(out_split) != output.shape[0] or sum(in_split) != input.shape[0]:
            raise TransportError(
                f"all_to_all split sizes {in_split} / {out_split} do not match shapes "
                f"{tuple(input.shape)} / {tuple(output.shape)} over {p} ranks"
            )
        s = self._src(input.reshape(-1).view(torch.uint8))
        d, finish = self._dst(output.reshape(-1).view(torch.uint8))
        s_counts = [n * in_row for n in in_split]
        d_counts = [n * out_row for n in out_split]
        s_spec = [s, (s_counts, _displs(s_counts)), self.MPI.BYTE]
        d_spec = [d, (d_counts, _displs(d_counts)), self.MPI.BYTE]
        return self._run(
            lambda: self.comm.Alltoallv(s_spec, d_spec),
            lambda: self.comm.Ialltoallv(s_spec, d_spec),
            async_op, finish, (s, d),
        )

    # helpers -----------------------------------------------------------------------------------
    def _reduce_op(self, op: str, result: torch.Tensor):
        if op == "avg":
            if not (result.is_floating_point() or result.is_complex()):
                raise TransportError(f"op avg needs a floating tensor, got {result.dtype}")
            p = self.world_size
            return self.MPI.SUM, lambda: result.div_(p)
        return self._ops[op], None

    @staticmethod
    def _done(async_op: bool) -> Handle | None:
        return Handle(()) if async_op else None

    def _reduce_by_gather(self, out_flat: torch.Tensor, in_flat: torch.Tensor, op: str, full: bool) -> None:
        """Reduce what MPI has no datatype for: gather every rank's bytes, reduce locally in rank order."""
        p, n = self.world_size, in_flat.numel()
        gathered = torch.empty(p * n, dtype=in_flat.dtype, device=in_flat.device)
        self.all_gather(gathered.view(torch.uint8), in_flat.contiguous().view(torch.uint8))
        rows = gathered.view(p, n)
        if in_flat.dtype == torch.bool:
            red = rows.any(0) if op in ("sum", "max") else rows.all(0)
        else:
            acc = rows.to(torch.float32) if in_flat.dtype in (torch.bfloat16, torch.float16) else rows
            if op in ("sum", "avg"):
                red = acc[0].clone()
                for r in range(1, p):
                    red += acc[r]
                if op == "avg":
                    red /= p
            elif op == "max":
                red = acc.amax(0)
            elif op == "min":
                red = acc.amin(0)
            else:
                red = acc[0].clone()
                for r in range(1, p):
                    red *= acc[r]
        red = red.to(in_flat.dtype)
        if full:
            out_flat.copy_(red)
        else:
            m = out_flat.numel()
            out_flat.copy_(red[self.rank * m:(self.rank + 1) * m])


def _displs(counts: list[int]) -> list[int]:
    out, acc = [], 0
    for c in counts:
        out.append(acc)
        acc += c
    return out
