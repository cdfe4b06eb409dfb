"""Run under mpiexec with CCOLL_NODE_MAP set: hierarchical collectives over MPI.COMM_WORLD (subgroups by
``comm.Split``). Prints ``CCOLL_HIER_OK <json>`` on rank 0; a failure aborts every rank (non-zero exit).

    CCOLL_NODE_MAP=0,1,0,1 mpiexec --allow-run-as-root --oversubscribe -n 4 python tests/dist/hierarchy_mpi_checks.py
"""
from __future__ import annotations

import json
import sys
import traceback


def main() -> None:
    import torch
    from mpi4py import MPI

    from ccoll import collectives as cc
    from ccoll.collectives import nodes as hierarchy

    comm = MPI.COMM_WORLD
    r, p = comm.Get_rank(), comm.Get_size()

    def x(seed: int, rank: int, n: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 7919 + rank)
        return torch.randn(n, generator=g, dtype=torch.float64).float() * (1 + rank)

    lay = hierarchy.layout(comm)
    assert lay is not None and lay.nodes * lay.local_size == p and lay.nodes == 2, lay
    n, spec = 4099, "int8:block=256"
    exact = sum(x(1, k, n).double() for k in range(p))
    t = x(1, r, n)
    cc.all_reduce(t, group=comm, codec=spec, min_bytes=0, hierarchy="node")
    f = x(1, r, n)
    cc.all_reduce(f, group=comm, codec=spec, min_bytes=0)
    assert len(set(comm.allgather(t.numpy().tobytes()))) == 1, "replicas differ"
    node_of = [lay.ranks.index(next(rs for rs in lay.ranks if k in rs)) for k in range(p)]
    partials = [sum(x(1, k, n).double() for k in range(p) if node_of[k] == a) for a in range(lay.nodes)]
    bound = sum(float(s.abs().max()) / 254 for s in partials) * 1.001 + float(exact.abs().max()) * p * 2**-23
    err = float((t.double() - exact).abs().max())
    assert err <= bound, (err, bound)
    rms = [float((v.double() - exact).pow(2).mean().sqrt()) for v in (t, f)]
    assert rms[0] < rms[1], rms
    m = 513
    hg, fg = torch.empty(p * m), torch.empty(p * m)
    cc.all_gather_into_tensor(hg, x(2, r, m), group=comm, codec=spec, min_bytes=0, hierarchy="node", async_op=True).wait()
    cc.all_gather_into_tensor(fg, x(2, r, m), group=comm, codec=spec, min_bytes=0)
    assert torch.equal(hg, fg)
    out = torch.empty(m)
    ins = [x(3, k, p * m) for k in range(p)]
    cc.reduce_scatter_tensor(out, ins[r], group=comm, codec=spec, min_bytes=0, hierarchy="node")
    ref = sum(v.double() for v in ins).view(p, m)[r]
    rs_bound = sum(float(sum(ins[k].double() for k in range(p) if node_of[k] == a).abs().max()) / 254
                   for a in range(lay.nodes)) * 1.001 + 1e-4
    assert float((out.double() - ref).abs().max()) <= rs_bound
    if r == 0:
        print("CCOLL_HIER_OK " + json.dumps({"rms_hier": rms[0], "rms_flat": rms[1], "ranks": lay.ranks}), flush=True)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(1)
    from ccoll.launch import exit_process

    exit_process(0)
