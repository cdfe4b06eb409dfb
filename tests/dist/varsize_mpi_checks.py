"""Run under mpiexec (tests/dist/test_varsize_mpi.py): the variable-size collectives with the "lossless"
codec over an mpi4py communicator -- results bit-identical to the exact ones, and point-to-point moving
only the used bytes into a capacity-sized receive (MPI receives may be larger than their message)."""
from __future__ import annotations

import torch
from mpi4py import MPI

import ccoll


def _values(seed: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g))).to(torch.bfloat16)


def main() -> None:
    comm = MPI.COMM_WORLD
    rank, p, n = comm.Get_rank(), comm.Get_size(), 3001
    ll = ccoll.get_codec("lossless", backend="emulated")
    x = _values(rank, n)
    out = torch.empty(p * n, dtype=torch.bfloat16)
    ccoll.all_gather_into_tensor(out, x, group=comm, codec=ll, min_bytes=0)
    assert torch.equal(out.view(torch.int16), torch.cat([_values(r, n) for r in range(p)]).view(torch.int16))
    a, b = x.clone(), x.clone()
    ccoll.all_reduce(a, group=comm, codec=ll, min_bytes=0)
    ccoll.all_reduce(b, group=comm, codec="none", min_bytes=0)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    t = x.clone()
    ccoll.broadcast(t, 0, group=comm, codec=ll, min_bytes=0)
    assert torch.equal(t.view(torch.int16), _values(0, n).view(torch.int16))
    ccoll.reset_stats()
    y = torch.empty(n, dtype=torch.bfloat16)
    hs = ccoll.isend(x, (rank + 1) % p, group=comm, codec=ll, min_bytes=0)
    hr = ccoll.irecv(y, (rank - 1) % p, group=comm, codec=ll, min_bytes=0)
    hr.wait()
    hs.wait()
    assert torch.equal(y.view(torch.int16), _values((rank - 1) % p, n).view(torch.int16))
    sent = [r for r in ccoll.stats() if r["op"] == "send"][0]
    assert sent["wire_bytes"] < sent["raw_bytes"], sent
    comm.Barrier()
    if rank == 0:
        print("VARSIZE_MPI_OK")


if __name__ == "__main__":
    from ccoll.launch import exit_process

    main()
    exit_process(0)
