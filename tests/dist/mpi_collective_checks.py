"""Run under mpiexec: every collective check on MPI.COMM_WORLD through ccoll's mpi4py transport.

    mpiexec --allow-run-as-root --oversubscribe -n 4 python tests/dist/mpi_collective_checks.py

Rank 0 prints one ``CCOLL_REPORT <json>`` line; any failure prints the traceback and aborts every rank
(non-zero exit), so the launching test sees it instead of hanging.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _mpi_transport_checks(env) -> None:
    """MPI-only paths: reductions MPI has no datatype for (bf16) and typed native reductions."""
    import torch

    import ccoll
    from ccoll.transports import for_group
    from collective_checks import dyadic, expect_equal

    p, r, G = env.world, env.rank, env.group
    tr = for_group(G)
    assert tr.kind == "mpi" and tr.world_size == p and tr.rank == r and tr.cuda_aware is False
    assert [tr.global_rank(k) for k in range(p)] == list(range(p))
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        t = dyadic(90, r, 3000, dtype)
        ccoll.all_reduce(t, "sum", G, None)
        expect_equal(env, f"mpi native all_reduce {dtype}", t, sum(dyadic(90, k, 3000, dtype).double() for k in range(p)).to(dtype))
        out = torch.empty(1000, dtype=dtype)
        ccoll.reduce_scatter_tensor(out, dyadic(91, r, 1000 * p, dtype), "max", G, None)
        ref = torch.stack([dyadic(91, k, 1000 * p, dtype) for k in range(p)]).amax(0)[r * 1000:(r + 1) * 1000]
        expect_equal(env, f"mpi native reduce_scatter max {dtype}", out, ref)
    t = torch.arange(100, dtype=torch.int32) + r
    h = ccoll.all_reduce(t, "min", G, "bf16", async_op=True, min_bytes=0)
    h.wait()
    expect_equal(env, "mpi native async int min", t, torch.arange(100, dtype=torch.int32))


# The codecs never touch the transport, and the gloo tests run every codec at 3 world sizes; under MPI
# a representative set (exact, cast, quantized with both roundings, zfp) keeps 4 ranks on 2 cores short.
MPI_SPECS = ["none", "bf16", "int8:block=256", "int4:block=64,round=stochastic", "zfp:rate=8,dims=2"]


def main() -> int:
    from mpi4py import MPI

    from collective_checks import MPIEnv, run_all

    try:
        report = run_all(MPIEnv(), extra=_mpi_transport_checks, specs=MPI_SPECS)
    except BaseException:
        sys.stdout.write(f"rank {MPI.COMM_WORLD.Get_rank()} failed:\n{traceback.format_exc()}\n")
        sys.stdout.flush()
        MPI.COMM_WORLD.Abort(1)
        return 1
    MPI.COMM_WORLD.Barrier()
    if MPI.COMM_WORLD.Get_rank() == 0:
        print("CCOLL_REPORT " + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    from ccoll.launch import exit_process

    exit_process(main())
