"""Measurements of the "lossless" codec and the variable-size collectives (issue 12's figures).

    python -m ccoll.bench.lossless_bench ratio results/capture [--blocks 64,256,1024] [--json PATH]
    python -m ccoll.bench.lossless_bench speed [--numel 4194304] [--iters 5]
    python -m ccoll.bench.lossless_bench collectives [--np 3] [--sizes 1M,16M] [--iters 5]
    python -m ccoll.bench.lossless_bench hunk

``ratio``: raw / used bytes per captured tensor class (ccoll.bench.rd's classes), for the tensors as
captured (fp32) and rounded to bf16 and fp16 (what mixed-precision training would send: the convergence
runner trains in fp32), pooled over the class, per block size. ``speed``: encode and decode GB/s (raw bytes
per second) per backend on one core. ``collectives``: gloo ranks on loopback; time per call of
all_gather_into_tensor / all_reduce / a send-recv ring with codec "none" (fixed-size path) and "lossless"
(variable-size path) on incompressible data (stored raw: equal bytes on the wire, so the difference is the
path's own cost: size exchange, range pass, copies) and on activation-like data (fewer bytes). ``hunk``: the
cost the variable-size dispatch adds to a fixed-size call (one codec lookup and attribute test).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ..launch import run_gloo
from ..units import nbytes_list_arg


def _load_classes(directory: str) -> dict[str, list]:
    from ccoll.bench.rd import tensor_class
    from ccoll.capture import load

    classes: dict[str, list] = {}
    for s in load(directory):
        classes.setdefault(tensor_class(s["meta"]), []).append(s["tensor"].reshape(-1))
    return classes


def ratio(directory: str, blocks: list[int]) -> list[dict]:
    import torch

    import ccoll

    rows = []
    for cls, tensors in sorted(_load_classes(directory).items()):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for block in blocks:
                c = ccoll.get_codec(f"lossless:block={block}", backend="emulated")
                raw = used = 0
                for t in tensors:
                    x = t.to(dtype)
                    p = c.encode(x)
                    raw += x.numel() * x.element_size()
                    used += c.used_nbytes(p.view(1, -1))[0]
                    assert torch.equal(c.decode(p, x.numel(), dtype).view(torch.uint8), x.view(torch.uint8))
                row = {"class": cls, "dtype": str(dtype).replace("torch.", ""), "block": block,
                       "tensors": len(tensors), "raw_bytes": raw, "used_bytes": used, "ratio": raw / used}
                if dtype != torch.float32:
                    row["order0_bound"] = _order0_bound([t.to(dtype) for t in tensors])
                rows.append(row)
    return rows


def _order0_bound(tensors: list) -> float:
    """16 / H, H the order-0 entropy (bits) of the pooled 16-bit patterns: the ratio an ideal coder of
    independent values would reach (what "bf16 entropy bounds it near 1.5x" refers to)."""
    import torch

    counts = torch.zeros(1 << 16, dtype=torch.float64)
    for t in tensors:
        counts += torch.bincount(t.view(torch.int16).to(torch.int32) & 0xFFFF, minlength=1 << 16).double()
    prob = counts[counts > 0] / counts.sum()
    return 16.0 / float(-(prob * prob.log2()).sum())


def speed(numel: int, iters: int) -> list[dict]:
    import torch

    import ccoll

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = []
    g = torch.Generator().manual_seed(0)
    base = torch.randn(numel, generator=g) * torch.exp(torch.randn(numel, generator=g))
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = base.to(dtype)
        for backend in ("torch", "emulated"):
            c = ccoll.get_codec("lossless", backend=backend)
            p = c.encode(x)
            c.decode(p, numel, dtype)
            t0 = time.perf_counter()
            for _ in range(iters):
                p = c.encode(x)
            t1 = time.perf_counter()
            for _ in range(iters):
                c.decode(p, numel, dtype)
            t2 = time.perf_counter()
            nbytes = numel * x.element_size()
            rows.append({"dtype": str(dtype).replace("torch.", ""), "backend": backend, "numel": numel,
                         "encode_GBps": nbytes * iters / (t1 - t0) / 1e9, "decode_GBps": nbytes * iters / (t2 - t1) / 1e9,
                         "ratio": nbytes / c.used_nbytes(p.view(1, -1))[0]})
    return rows


def _activation_like(n: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * torch.exp(0.5 * torch.randn(n, generator=g))).to(torch.bfloat16)


def _incompressible(n: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(1 << 15), 1 << 15, (n,), generator=g).to(torch.int16).view(torch.bfloat16)


def _rank_main(rank: int, world: int, sizes: list[int], iters: int) -> list[dict]:
    """One gloo rank of :func:`collectives` (started by :func:`ccoll.launch.run_gloo`)."""
    import torch
    import torch.distributed as dist

    import ccoll

    codecs = {"none": ccoll.get_codec("none"), "lossless": ccoll.get_codec("lossless", backend="emulated")}
    results = []
    for nbytes in sizes:
        n = nbytes // 2
        for data_name, make in (("incompressible", _incompressible), ("activation-like", _activation_like)):
            x = make(n, rank)
            for op in ("all_gather", "all_reduce", "sendrecv"):
                for name, c in codecs.items():
                    if op == "all_reduce" and data_name == "incompressible":
                        x_op = x.clone().nan_to_num_(0.0, 0.0, 0.0)  # finite bits, same exponent spread
                    else:
                        x_op = x
                    out = torch.empty(world * n, dtype=torch.bfloat16)
                    y = torch.empty(n, dtype=torch.bfloat16)

                    def call():
                        if op == "all_gather":
                            ccoll.all_gather_into_tensor(out, x_op, codec=c, min_bytes=0)
                        elif op == "all_reduce":
                            ccoll.all_reduce(x_op.clone(), codec=c, min_bytes=0)
                        else:
                            hs = ccoll.isend(x_op, (rank + 1) % world, codec=c, min_bytes=0)
                            hr = ccoll.irecv(y, (rank - 1) % world, codec=c, min_bytes=0)
                            hr.wait()
                            hs.wait()

                    call()
                    ccoll.reset_stats()
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        call()
                    dist.barrier()
                    dt = (time.perf_counter() - t0) / iters
                    wire = sum(r["wire_bytes"] for r in ccoll.stats()) / iters
                    results.append({"bytes": nbytes, "data": data_name, "op": op, "codec": name,
                                    "time_ms": dt * 1e3, "wire_bytes_per_rank": wire})
    return results


def collectives(world: int, sizes: list[int], iters: int) -> list[dict]:
    return run_gloo(world, _rank_main, sizes, iters, timeout_s=3600)[0]


def hunk() -> dict:
    """Seconds per call of the dispatch test on a fixed-size codec spec (what every compressed call pays)."""
    import timeit

    from ccoll.collectives.call import as_codec

    codec = "int8:block=256"
    as_codec(codec)
    n = 200000
    t = timeit.timeit(lambda: codec is not None and as_codec(codec).variable_size, number=n) / n
    return {"dispatch_test_us": t * 1e6}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ccoll.bench.lossless_bench", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("ratio")
    r.add_argument("directory")
    r.add_argument("--blocks", default="64,256,1024,4096")
    s = sub.add_parser("speed")
    s.add_argument("--numel", type=int, default=1 << 22)
    s.add_argument("--iters", type=int, default=3)
    c = sub.add_parser("collectives")
    c.add_argument("--np", type=int, default=3)
    c.add_argument("--sizes", default="1M,16M", type=nbytes_list_arg)
    c.add_argument("--iters", type=int, default=5)
    sub.add_parser("hunk")
    for p in (r, s, c):
        p.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    print(f"# load avg at start: {os.getloadavg()}")
    if args.what == "ratio":
        rows = ratio(args.directory, [int(b) for b in args.blocks.split(",")])
    elif args.what == "speed":
        rows = speed(args.numel, args.iters)
    elif args.what == "collectives":
        rows = collectives(args.np, args.sizes, args.iters)
    else:
        rows = [hunk()]
    for row in rows:
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    print(f"# load avg at end: {os.getloadavg()}")
    if getattr(args, "json", None):
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
