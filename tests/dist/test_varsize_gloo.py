"""The variable-size collectives (ccoll/collectives/varsize.py) with the "lossless" codec on real gloo ranks (3):
every result is bit-identical to the exact one (the input for send/recv, all_gather and broadcast; codec
"none"'s result for all_reduce / reduce_scatter), on every rank; only the used bytes travel (wire < raw for
compressible data, raw + 16 for incompressible data); crossing isend/irecv pairs and several sends in flight
to one peer do not deadlock or mix up sizes; passthrough rules (integers, tiny tensors) still go native."""
from __future__ import annotations

import torch

import ccoll
from launch import run_gloo

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _values(seed: int, n: int, dtype: torch.dtype, incompressible: bool = False) -> torch.Tensor:
    """Activation-like values with the special patterns a lossless codec must keep: NaN with a payload,
    -0, +-Inf, subnormals; or (incompressible) uniformly random bit patterns."""
    g = torch.Generator().manual_seed(seed)
    if incompressible:
        bits = torch.randint(0, 1 << 16, (n * dtype.itemsize // 2,), generator=g, dtype=torch.int32)
        return bits.to(torch.int16).view(dtype)
    x = (torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g))).to(dtype)
    w = x.view(torch.int16 if dtype.itemsize == 2 else torch.int32)
    w[1] = 0x7FC3 if dtype == torch.bfloat16 else (0x7E05 if dtype == torch.float16 else 0x7FC00123)  # NaN payload
    x[2], x[3], x[4] = -0.0, float("inf"), float("-inf")
    w[5] = 1  # the smallest subnormal
    return x


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _checks(rank: int, world: int) -> dict:
    import torch.distributed as dist

    ll = "lossless"
    report = {"wire": {}, "raw": {}}
    for k, dtype in enumerate(DTYPES):
        n = 3000 + 17 * k  # not a multiple of 32 or of the block
        # all_gather_into_tensor
        mine = _values(10 * rank + k, n, dtype)
        out = torch.empty(world * n, dtype=dtype)
        ccoll.reset_stats()
        ccoll.all_gather_into_tensor(out, mine, codec=ll, min_bytes=0)
        row = [r for r in ccoll.stats() if r["op"] == "all_gather"][0]
        report["wire"][str(dtype)], report["raw"][str(dtype)] = row["wire_bytes"], row["raw_bytes"]
        for r in range(world):
            assert _same_bits(out[r * n:(r + 1) * n], _values(10 * r + k, n, dtype)), ("all_gather", dtype, r)
        # broadcast from the last rank, into a non-contiguous tensor
        h = n // 2
        t = torch.zeros(h, 2, dtype=dtype).t()  # non-contiguous [2, h]
        if rank == world - 1:
            t.copy_(_values(99, 2 * h, dtype).view(2, h))
        ccoll.broadcast(t, world - 1, codec=ll, min_bytes=0)
        assert _same_bits(t.reshape(-1), _values(99, 2 * h, dtype)), ("broadcast", dtype)
        # all_reduce / reduce_scatter: bit-identical to codec "none" (exact reduce of exact chunks)
        for op in ("sum", "avg") if dtype == torch.bfloat16 else ("sum",):
            a = _values(7 * rank + k, n, dtype)
            a[1:6] = 1.0  # keep the sum finite and NaN-free so "identical" is a strong statement
            b = a.clone()
            ccoll.all_reduce(a, op=op, codec=ll, min_bytes=0)
            ccoll.all_reduce(b, op=op, codec="none", min_bytes=0)
            assert _same_bits(a, b), ("all_reduce", dtype, op)
            m = -(-n // world)
            inp = _values(5 * rank + k, world * m, dtype)
            o1, o2 = torch.empty(m, dtype=dtype), torch.empty(m, dtype=dtype)
            h = ccoll.reduce_scatter_tensor(o1, inp, op=op, codec=ll, min_bytes=0, async_op=True)
            h.wait()
            ccoll.reduce_scatter_tensor(o2, inp, op=op, codec="none", min_bytes=0)
            assert _same_bits(o1, o2) or torch.equal(torch.isnan(o1), torch.isnan(o2)), ("reduce_scatter", dtype, op)
        # incompressible data travels raw (capacity bytes) and still exactly
        z = _values(1000 + rank, n, dtype, incompressible=True)
        zo = torch.empty(world * n, dtype=dtype)
        ccoll.all_gather_into_tensor(zo, z, codec=ll, min_bytes=0)
        for r in range(world):
            assert _same_bits(zo[r * n:(r + 1) * n], _values(1000 + r, n, dtype, incompressible=True))

    # point to point in a ring: isend before irecv on every rank (crossing pairs), two messages in
    # flight per peer and tag, waited in reverse order; a tiny tensor (native) between them
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    sends = [_values(100 * rank + i, 2000 + 64 * i, torch.bfloat16) for i in range(2)]
    handles = [ccoll.isend(s, nxt, codec=ll, min_bytes=0, tag=3) for s in sends]
    tiny = torch.full((4,), float(rank))
    handles.append(ccoll.isend(tiny, nxt, codec=ll, tag=3))  # under the default min_bytes: native
    got = [torch.empty(2000 + 64 * i, dtype=torch.bfloat16) for i in range(2)]
    recvs = [ccoll.irecv(g, prv, codec=ll, min_bytes=0, tag=3) for g in got]
    tiny_in = torch.empty(4)
    recvs.append(ccoll.irecv(tiny_in, prv, codec=ll, tag=3))
    for h in reversed(recvs):
        h.wait()
    for h in handles:
        h.wait()
    for i in range(2):
        assert _same_bits(got[i], _values(100 * prv + i, 2000 + 64 * i, torch.bfloat16)), ("p2p", i)
    assert torch.equal(tiny_in, torch.full((4,), float(prv)))
    # blocking send/recv, fp32, even ranks send first
    x = _values(500 + rank, 4096, torch.float32)
    y = torch.empty(4096)
    if rank % 2 == 0:
        ccoll.send(x, nxt, codec=ll, min_bytes=0)
        ccoll.recv(y, prv, codec=ll, min_bytes=0)
    else:
        ccoll.recv(y, prv, codec=ll, min_bytes=0)
        ccoll.send(x, nxt, codec=ll, min_bytes=0)
    assert _same_bits(y, _values(500 + prv, 4096, torch.float32))
    # bad arguments: the fixed path's typed errors, raised before anything is sent
    from ccoll.errors import TransportError

    for bad in (lambda: ccoll.all_gather_into_tensor(torch.empty(5, dtype=torch.bfloat16), got[0], codec=ll, min_bytes=0),
                lambda: ccoll.recv(got[0], None, codec=ll, min_bytes=0)):
        try:
            bad()
        except TransportError:
            pass
        else:
            raise AssertionError("bad arguments accepted")
    # integers stay native
    iv = torch.arange(10) + rank
    ccoll.all_reduce(iv, codec=ll, min_bytes=0)
    assert torch.equal(iv, torch.arange(10) * world + sum(range(world)))
    dist.barrier()
    return report


def test_varsize_given_lossless_codec_when_every_collective_on_gloo_expect_exact_results_and_fewer_wire_bytes():
    """3 ranks: an odd world size (uneven chunks, a ring with distinct next/previous peers)."""
    reports = run_gloo(3, _checks, timeout_s=180)
    for rep in reports:
        for dtype in DTYPES:
            # activation-like values compress: fewer bytes than raw on the wire (padded to the largest rank)
            assert rep["wire"][str(dtype)] < rep["raw"][str(dtype)], (dtype, rep)
