"""Checks of ccoll's collectives, run inside every rank of a real group (gloo via launch.run_gloo, or
MPI under mpiexec via mpi_collective_checks.py). One spawned group runs all of them, so process
start-up is paid once per world size.

Every rank can generate every other rank's input (seeded by rank), so the exact reference is computed
locally in float64; results are compared with it under a tolerance derived from the codec's own error
bound, and hashed and compared across ranks (bit-identical replicas).
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable

import torch

import ccoll
from ccoll.codecs import example_specs
from ccoll.collectives.small import one_exchange
from ccoll.errors import PolicyError

def available_specs() -> list[str]:
    """Every registered codec's example specs (``ccoll.codecs.example_specs()``): a new codec, or a new
    parameter a codec declares an example of, enters every check here without editing this file."""
    return example_specs()


def lossiest_spec() -> str:
    """The deterministic, fixed-size lossy spec with the fewest bytes per value (passthrough and error
    feedback checks use it)."""
    specs = [s for s in available_specs() if _lossy_fixed_deterministic(ccoll.get_codec(s))]
    if not specs:
        raise AssertionError("no lossy codec registered")
    return min(specs, key=lambda s: ccoll.get_codec(s).encoded_nbytes(1 << 12, torch.float32))


def _lossy_fixed_deterministic(c: ccoll.Codec) -> bool:
    return c.lossy and c.fixed_size and c.deterministic


class Env:
    """What the checks need from the launcher: the group to pass to ccoll, a way to compare objects
    across ranks, the native all-reduce, and sub-groups."""

    kind = ""
    group: Any = None
    rank = 0
    world = 1

    def allgather_obj(self, obj: Any) -> list:
        raise NotImplementedError

    def native_all_reduce_sum(self, t: torch.Tensor) -> None:
        raise NotImplementedError

    def subgroup(self, global_ranks: list[int]) -> Any:
        """A group of ``global_ranks`` (every rank must call it). Ranks outside get what the library
        gives them (torch: the non-member sentinel; MPI: COMM_NULL)."""
        raise NotImplementedError


class GlooEnv(Env):
    kind = "gloo"

    def __init__(self) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.group = None
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()

    def allgather_obj(self, obj: Any) -> list:
        out: list = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out

    def native_all_reduce_sum(self, t: torch.Tensor) -> None:
        self.dist.all_reduce(t)

    def subgroup(self, global_ranks: list[int]) -> Any:
        return self.dist.new_group(ranks=global_ranks)


class MPIEnv(Env):
    kind = "mpi"

    def __init__(self) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.group = MPI.COMM_WORLD
        self.rank = self.group.Get_rank()
        self.world = self.group.Get_size()

    def allgather_obj(self, obj: Any) -> list:
        return self.group.allgather(obj)

    def native_all_reduce_sum(self, t: torch.Tensor) -> None:
        self.group.Allreduce(self.MPI.IN_PLACE, t.numpy(), self.MPI.SUM)

    def subgroup(self, global_ranks: list[int]) -> Any:
        member = self.rank in global_ranks
        return self.group.Split(0 if member else self.MPI.UNDEFINED, global_ranks.index(self.rank) if member else 0)


class SimEnv(Env):
    """A rank of :func:`ccoll.testing.simulated_world` (threads of this process, in-memory transport).
    Objects are exchanged through the world's shared state; sub-groups are not simulated."""

    kind = "simulated"

    def __init__(self, rank: int, group: Any) -> None:
        self.group, self.rank, self.world = group, rank, group.size()
        self._round = 0

    def allgather_obj(self, obj: Any) -> list:
        w, k = self.group.world, self._round
        self._round += 1
        with w.cond:
            table = w.objects.setdefault(k, {})
            table[self.rank] = obj
            w.cond.notify_all()
        w.wait_for(lambda: len(table) == self.world, f"allgather_obj #{k}", self.rank)
        return [table[i] for i in range(self.world)]

    def native_all_reduce_sum(self, t: torch.Tensor) -> None:
        from ccoll.transports import for_group

        for_group(self.group).native_all_reduce(t, "sum")

    def subgroup(self, global_ranks: list[int]) -> Any:
        raise NotImplementedError("the simulated world has no sub-groups")


# --- helpers ------------------------------------------------------------------------------------

def data(seed: int, rank: int, shape, dtype=torch.float32) -> torch.Tensor:
    """Rank ``rank``'s input for check ``seed``: normal values scaled differently per rank."""
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * (1.0 + 0.5 * rank)).to(dtype)


def dyadic(seed: int, rank: int, n: int, dtype=torch.float32) -> torch.Tensor:
    """Multiples of 2^-6 below 2^4 in magnitude: sums of a few are exact in fp32 in any order."""
    g = torch.Generator().manual_seed(seed * 104729 + rank)
    return (torch.randint(-1024, 1024, (n,), generator=g).to(torch.float64) / 64).to(dtype)


def deterministic(c: ccoll.Codec) -> bool:
    """A payload equals ``c.encode(x)`` byte for byte (``Codec.deterministic``). Stochastic rounding gets a
    per-call, per-rank seed inside the collectives, so only its error bound is checked."""
    return c.deterministic


def roundtrip_bound(c: ccoll.Codec, x: torch.Tensor) -> float:
    """Max |decode(encode(chunk)) - chunk| over any chunk of ``x``: the codec's documented bound
    (``Codec.error_bound``, derived in each codec's docstrings)."""
    return c.error_bound(x)


def fail(env: Env, name: str, msg: str) -> None:
    raise AssertionError(f"[{env.kind} p={env.world} rank={env.rank}] {name}: {msg}")


def expect_close(env: Env, name: str, got: torch.Tensor, ref: torch.Tensor, bound: float) -> float:
    err = float((got.double().reshape(-1) - ref.double().reshape(-1)).abs().max())
    if not err <= bound:
        fail(env, name, f"max error {err:.3g} > bound {bound:.3g}")
    return err


def expect_equal(env: Env, name: str, got: torch.Tensor, ref: torch.Tensor) -> None:
    if got.dtype != ref.dtype or got.shape != ref.shape or not torch.equal(got, ref):
        diff = (got.double() - ref.double()).abs().max() if got.shape == ref.shape else "shape"
        fail(env, name, f"not bit-identical (max diff {diff}, {got.dtype}{tuple(got.shape)} vs {ref.dtype}{tuple(ref.shape)})")


def expect_same_across_ranks(env: Env, name: str, t: torch.Tensor, ranks: list[int] | None = None) -> None:
    digest = hashlib.sha256(t.detach().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
    digests = env.allgather_obj(digest)
    if ranks is not None:
        digests = [digests[r] for r in ranks]
    if len(set(digests)) != 1:
        fail(env, name, f"ranks disagree: {len(set(digests))} distinct results")


def sum_bound(c: ccoll.Codec, inputs: list[torch.Tensor], ref: torch.Tensor, avg: bool = False) -> float:
    """Error bound of the two-stage all-reduce: every rank's chunk encoded once, the reduced chunk once,
    plus fp32 accumulation."""
    p = len(inputs)
    stage1 = sum(roundtrip_bound(c, x) for x in inputs)
    scale = sum(float(x.abs().max()) for x in inputs)
    stage2 = roundtrip_bound(c, (ref / p if avg else ref).to(inputs[0].dtype)) + stage1 * (2.0**-8 if c.lossy else 0)
    fp32 = scale * p * 2.0**-23
    total = stage1 + fp32
    return (total / p if avg else total) + stage2 * 1.01 + 1e-30


# --- checks ---------------------------------------------------------------------------------------

def check_all_reduce(env: Env, spec: str) -> None:
    c, p, r, G = ccoll.get_codec(spec), env.world, env.rank, env.group
    # numel not divisible by p (4099 is prime), ReduceOp value instead of a string
    n = 4099
    t = data(1, r, n)
    ccoll.all_reduce(t, torch.distributed.ReduceOp.SUM, G, spec, min_bytes=0)
    inputs = [data(1, k, n) for k in range(p)]
    ref = sum(x.double() for x in inputs)
    expect_close(env, f"all_reduce {spec} sum", t, ref, sum_bound(c, inputs, ref))
    expect_same_across_ranks(env, f"all_reduce {spec} sum", t)
    # fewer elements than ranks: whole chunks are padding
    t = data(11, r, max(p - 1, 1))
    ccoll.all_reduce(t, "sum", G, c, min_bytes=0)
    inputs = [data(11, k, max(p - 1, 1)) for k in range(p)]
    ref = sum(x.double() for x in inputs)
    expect_close(env, f"all_reduce {spec} tiny numel", t, ref, sum_bound(c, inputs, ref))
    expect_same_across_ranks(env, f"all_reduce {spec} tiny numel", t)
    # avg on a non-contiguous view: the view gets the result, the elements between stay untouched
    base = data(2, r, (67, 130))
    keep = base[:, 1::2].clone()
    view = base[:, ::2]
    ccoll.all_reduce(view, "avg", G, spec, min_bytes=0)
    inputs = [data(2, k, (67, 130))[:, ::2] for k in range(p)]
    ref = sum(x.double() for x in inputs) / p
    expect_close(env, f"all_reduce {spec} avg non-contiguous", view, ref, sum_bound(c, inputs, ref * p, avg=True))
    expect_equal(env, f"all_reduce {spec} avg non-contiguous: untouched", base[:, 1::2], keep)
    expect_same_across_ranks(env, f"all_reduce {spec} avg non-contiguous", view)
    # a half-precision tensor: the wire and the result keep its dtype
    for dtype in (torch.bfloat16, torch.float16):
        if dtype not in c.dtypes:
            continue
        t = data(3, r, 3001, dtype)
        ccoll.all_reduce(t, "sum", G, spec, min_bytes=0)
        inputs = [data(3, k, 3001, dtype) for k in range(p)]
        ref = sum(x.double() for x in inputs)
        rounding = float(ref.abs().max()) * (2.0**-8 if dtype == torch.bfloat16 else 2.0**-10) * 2
        expect_close(env, f"all_reduce {spec} {dtype}", t, ref, sum_bound(c, inputs, ref) + rounding)
        expect_same_across_ranks(env, f"all_reduce {spec} {dtype}", t)


def check_reduce_scatter(env: Env, spec: str) -> None:
    c, p, r, G = ccoll.get_codec(spec), env.world, env.rank, env.group
    m = 1001
    inputs = [data(4, k, p * m) for k in range(p)]
    out = torch.empty(m)
    ccoll.reduce_scatter_tensor(out, data(4, r, p * m), "sum", G, spec, min_bytes=0)
    mine = [x[r * m:(r + 1) * m] for x in inputs]
    ref = sum(x.double() for x in mine)
    bound = sum(roundtrip_bound(c, x) for x in mine) + sum(float(x.abs().max()) for x in mine) * p * 2.0**-23
    expect_close(env, f"reduce_scatter {spec} sum", out, ref, bound * 1.01 + 1e-30)
    # avg into a non-contiguous output
    out_base = torch.full((m, 2), 7.0)
    ccoll.reduce_scatter_tensor(out_base[:, 0], data(4, r, p * m), "avg", G, spec, min_bytes=0)
    expect_close(env, f"reduce_scatter {spec} avg", out_base[:, 0], ref / p, bound / p * 1.01 + 1e-30)
    expect_equal(env, f"reduce_scatter {spec} avg: untouched", out_base[:, 1], torch.full((m,), 7.0))


def check_all_gather(env: Env, spec: str) -> None:
    c, p, r, G = ccoll.get_codec(spec), env.world, env.rank, env.group
    m = 1001
    out = torch.empty(p, m)
    x = data(5, r, m)
    ccoll.all_gather_into_tensor(out, x, G, spec, min_bytes=0)
    for k in range(p):
        xk = data(5, k, m)
        expect_close(env, f"all_gather {spec} slot {k}", out[k], xk, roundtrip_bound(c, xk))
    if deterministic(c):  # the caller's own slot is decoded from its own payload, like the others
        expect_equal(env, f"all_gather {spec} own slot", out[r], c.decode(c.encode(x), m, x.dtype))
    expect_same_across_ranks(env, f"all_gather {spec}", out)
    # non-contiguous input
    src = data(6, r, (m, 2))
    out2 = torch.empty(p * m)
    ccoll.all_gather_into_tensor(out2, src[:, 1], G, spec, min_bytes=0)
    for k in range(p):
        xk = data(6, k, (m, 2))[:, 1]
        expect_close(env, f"all_gather {spec} non-contiguous slot {k}", out2[k * m:(k + 1) * m], xk, roundtrip_bound(c, xk))
    expect_same_across_ranks(env, f"all_gather {spec} non-contiguous", out2)


def check_broadcast(env: Env, spec: str) -> None:
    c, p, r, G = ccoll.get_codec(spec), env.world, env.rank, env.group
    src = p - 1
    x = data(7, src, (33, 61))
    t = x.clone() if r == src else torch.zeros(33, 61)
    ccoll.broadcast(t, src, G, spec, min_bytes=0)
    expect_close(env, f"broadcast {spec}", t, x, roundtrip_bound(c, x))
    if deterministic(c):  # the root adopts the decoded values
        expect_equal(env, f"broadcast {spec} decoded", t.reshape(-1), c.decode(c.encode(x), x.numel(), x.dtype))
    expect_same_across_ranks(env, f"broadcast {spec}", t)


def check_all_to_all(env: Env, spec: str) -> None:
    c, p, r, G = ccoll.get_codec(spec), env.world, env.rank, env.group
    rows, cols = 3, 173  # each rank gets 3 rows of every rank's [3p, 173] input
    out = torch.empty(rows * p, cols)
    ccoll.all_to_all_single(out, data(8, r, (rows * p, cols)), G, spec, min_bytes=0)
    for k in range(p):
        chunk = data(8, k, (rows * p, cols))[r * rows:(r + 1) * rows]
        got = out[k * rows:(k + 1) * rows]
        expect_close(env, f"all_to_all {spec} from {k}", got, chunk, roundtrip_bound(c, chunk))
        if deterministic(c):
            expect_equal(env, f"all_to_all {spec} from {k} decoded", got.reshape(-1), c.decode(c.encode(chunk), chunk.numel(), chunk.dtype))
    # uneven splits go native (exact): rank r sends k+1 rows to rank k
    in_splits = [k + 1 for k in range(p)]
    out_splits = [r + 1] * p
    inp = torch.cat([torch.full((k + 1, 4), float(100 * r + k)) for k in range(p)])
    out = torch.empty(sum(out_splits), 4)
    ccoll.all_to_all_single(out, inp, G, spec, output_split_sizes=out_splits, input_split_sizes=in_splits, min_bytes=0)
    ref = torch.cat([torch.full((r + 1, 4), float(100 * k + r)) for k in range(p)])
    expect_equal(env, f"all_to_all {spec} uneven splits", out, ref)


def check_point_to_point(env: Env, spec: str) -> None:
    c, p, r, G = ccoll.get_codec(spec), env.world, env.rank, env.group
    dst, src = (r + 1) % p, (r - 1) % p
    x = data(9, r, 2001)
    y = torch.empty(2001)
    hs = ccoll.isend(x, dst, G, spec, min_bytes=0)
    hr = ccoll.irecv(y, src, G, spec, min_bytes=0)
    hr.wait()
    hs.wait()
    xs = data(9, src, 2001)
    expect_close(env, f"isend/irecv {spec}", y, xs, roundtrip_bound(c, xs))
    if deterministic(c):
        expect_equal(env, f"isend/irecv {spec} decoded", y, c.decode(c.encode(xs), xs.numel(), xs.dtype))
    # blocking send/recv, 0 -> 1, into a non-contiguous receive buffer
    if r == 0:
        ccoll.send(data(10, 0, (50, 40)), 1, G, spec, min_bytes=0)
    elif r == 1:
        buf = torch.zeros(40, 50).t()
        assert ccoll.recv(buf, 0, G, spec, min_bytes=0) == 0
        x0 = data(10, 0, (50, 40))
        expect_close(env, f"send/recv {spec}", buf, x0, roundtrip_bound(c, x0))


def check_async(env: Env, spec: str) -> None:
    """Async handles give bit-identical results to the sync calls, even waited in reverse order
    (stochastic rounding: a fresh seed per call, so within twice the codec's bound instead)."""
    c, p, r, G = ccoll.get_codec(spec), env.world, env.rank, env.group

    def expect_equal_or_close(env: Env, name: str, got: torch.Tensor, ref: torch.Tensor, seed: int, shape) -> None:
        if deterministic(c):
            expect_equal(env, name, got, ref)
            return
        # two independent stochastic results, each within p input round trips + one of the sum
        amax = max(float(data(seed, k, shape).abs().max()) for k in range(p))
        expect_close(env, name, got, ref, 2 * 2 * p * roundtrip_bound(c, torch.tensor([amax])))
    n = 5003
    sync_a, sync_b = data(12, r, n), data(13, r, n)
    ccoll.all_reduce(sync_a, "sum", G, c, min_bytes=0)
    ccoll.all_reduce(sync_b, "avg", G, c, min_bytes=0)
    a, b = data(12, r, n), data(13, r, n)
    ha = ccoll.all_reduce(a, "sum", G, c, async_op=True, min_bytes=0)
    hb = ccoll.all_reduce(b, "avg", G, c, async_op=True, min_bytes=0)
    hb.wait()
    ha.wait()
    assert ha.is_completed() and hb.is_completed()
    expect_equal_or_close(env, f"async all_reduce {spec}", a, sync_a, 12, n)
    expect_equal_or_close(env, f"async all_reduce avg {spec}", b, sync_b, 13, n)
    # the other collectives
    m = 777
    x = data(14, r, p * m)
    o_sync, o_async = torch.empty(m), torch.empty(m)
    ccoll.reduce_scatter_tensor(o_sync, x, "sum", G, c, min_bytes=0)
    ccoll.reduce_scatter_tensor(o_async, x, "sum", G, c, async_op=True, min_bytes=0).wait()
    expect_equal_or_close(env, f"async reduce_scatter {spec}", o_async, o_sync, 14, p * m)
    g_sync, g_async = torch.empty(p * m), torch.empty(p * m)
    ccoll.all_gather_into_tensor(g_sync, x[:m], G, c, min_bytes=0)
    ccoll.all_gather_into_tensor(g_async, x[:m], G, c, async_op=True, min_bytes=0).wait()
    expect_equal_or_close(env, f"async all_gather {spec}", g_async, g_sync, 14, p * m)
    a_sync, a_async = torch.empty(p * m), torch.empty(p * m)
    ccoll.all_to_all_single(a_sync, x, G, c, min_bytes=0)
    ccoll.all_to_all_single(a_async, x, G, c, async_op=True, min_bytes=0).wait()
    expect_equal_or_close(env, f"async all_to_all {spec}", a_async, a_sync, 14, p * m)
    b_sync, b_async = x.clone(), x.clone()
    ccoll.broadcast(b_sync, 0, G, c, min_bytes=0)
    h = ccoll.broadcast(b_async, 0, G, c, async_op=True, min_bytes=0)
    h.wait()
    expect_equal_or_close(env, f"async broadcast {spec}", b_async, b_sync, 14, p * m)


def check_passthrough(env: Env) -> None:
    """Exact native results wherever compression must not (or cannot) apply."""
    p, r, G = env.world, env.rank, env.group
    lossy = lossiest_spec()
    n = 4099
    # integer tensors
    t = torch.arange(n, dtype=torch.int64) * (r + 1)
    ccoll.all_reduce(t, "sum", G, lossy, min_bytes=0)
    expect_equal(env, "int64 all_reduce passthrough", t, torch.arange(n, dtype=torch.int64) * (p * (p + 1) // 2))
    t = torch.full((n,), r % 2 == 0)
    out = torch.empty(p * n, dtype=torch.bool)
    ccoll.all_gather_into_tensor(out, t, G, lossy, min_bytes=0)
    expect_equal(env, "bool all_gather passthrough", out, torch.cat([torch.full((n,), k % 2 == 0) for k in range(p)]))
    # max / min / product
    for op, fn in (("max", lambda xs: torch.stack(xs).amax(0)), ("min", lambda xs: torch.stack(xs).amin(0))):
        t = data(20, r, n)
        ccoll.all_reduce(t, op, G, lossy, min_bytes=0)
        expect_equal(env, f"{op} passthrough", t, fn([data(20, k, n) for k in range(p)]))
    t = torch.full((n,), 2.0 ** (r - 1))
    ccoll.all_reduce(t, torch.distributed.ReduceOp.PRODUCT, G, lossy, min_bytes=0)
    expect_equal(env, "product passthrough", t, torch.full((n,), 2.0 ** sum(k - 1 for k in range(p))))
    # below the default threshold: native, exact (dyadic values: exact in any summation order)
    t = dyadic(21, r, 100)
    ccoll.all_reduce(t, "sum", G, lossy)
    expect_equal(env, "tiny tensor passthrough", t, sum(dyadic(21, k, 100) for k in range(p)))
    # avg on the native path (gloo has no AVG on every version): sum, then divide
    t = dyadic(22, r, n)
    ccoll.all_reduce(t, "avg", G, None)
    expect_equal(env, "native avg", t, sum(dyadic(22, k, n) for k in range(p)) / p)
    # a dtype the codec does not take goes native: fp64 into a quantizer
    for spec in available_specs():
        c = ccoll.get_codec(spec)
        if torch.float64 not in c.dtypes:
            t = dyadic(23, r, n, torch.float64)
            ccoll.all_reduce(t, "sum", G, c, min_bytes=0)
            expect_equal(env, f"fp64 into {spec} passthrough", t, sum(dyadic(23, k, n, torch.float64) for k in range(p)))
    # native async handle, non-contiguous
    base = dyadic(24, r, 2 * n).view(n, 2)
    h = ccoll.all_reduce(base[:, 0], "sum", G, None, async_op=True)
    h.wait()
    expect_equal(env, "native async non-contiguous", base[:, 0], sum(dyadic(24, k, 2 * n).view(n, 2)[:, 0] for k in range(p)))
    expect_equal(env, "native async non-contiguous: untouched", base[:, 1], dyadic(24, r, 2 * n).view(n, 2)[:, 1])


def check_bad_input(env: Env) -> None:
    """Mismatched sizes and unknown codecs fail with typed errors on every rank, before anything is
    sent (so no rank is left waiting)."""
    from ccoll.errors import CodecSpecError, PolicyError, TransportError

    p, G = env.world, env.group
    cases = [
        (TransportError, lambda: ccoll.reduce_scatter_tensor(torch.empty(10), torch.empty(10 * p + 1), "sum", G, "bf16", min_bytes=0)),
        (TransportError, lambda: ccoll.all_gather_into_tensor(torch.empty(10 * p), torch.empty(10, dtype=torch.float16), G, "bf16")),
        (TransportError, lambda: ccoll.all_reduce(torch.ones(10), "band", G, "bf16")),
        (TransportError, lambda: ccoll.broadcast(torch.ones(10), p + 5, G, "bf16")),
        (CodecSpecError, lambda: ccoll.all_reduce(torch.ones(10), "sum", G, "lz4", min_bytes=0)),
        (PolicyError, lambda: ccoll.all_reduce(torch.ones(10), "sum", G, "bf16", error_feedback=ccoll.ErrorFeedback(), min_bytes=0)),
    ]
    for i, (err, call) in enumerate(cases):
        try:
            call()
        except err:
            continue
        except Exception as e:  # noqa: BLE001 - report what was raised instead
            fail(env, f"bad input case {i}", f"raised {type(e).__name__}: {e}, expected {err.__name__}")
        fail(env, f"bad input case {i}", f"no error, expected {err.__name__}")


def check_none_equals_native(env: Env) -> None:
    """codec="none" runs the compressed algorithm with an exact codec; its result must equal the native
    all_reduce bit for bit. Summation order differs (native: the backend's ring/tree; ours: rank order
    in fp32), so the data are dyadic rationals whose fp32 sums are exact in any order; at p=2 any fp32
    data qualify (a + b == b + a)."""
    p, r, G = env.world, env.rank, env.group
    n = 10007
    samples = [dyadic(30, r, n)] + ([data(31, r, n)] if p == 2 else [])
    for i, x in enumerate(samples):
        ours, native = x.clone(), x.clone()
        ccoll.all_reduce(ours, "sum", G, "none", min_bytes=0)
        env.native_all_reduce_sum(native)
        expect_equal(env, f"codec none == native all_reduce (sample {i})", ours, native)


def check_stats(env: Env) -> None:
    p, r, G = env.world, env.rank, env.group
    ccoll.reset_stats()
    n = 4099
    ccoll.all_reduce(data(40, r, n), "sum", G, "bf16", min_bytes=0)
    h = ccoll.all_reduce(data(40, r, n), "sum", G, "fp16", async_op=True, min_bytes=0)
    if any(row["codec"] == "fp16" for row in ccoll.stats()):
        fail(env, "stats", "async call recorded before wait()")
    h.wait()
    ccoll.all_reduce(data(40, r, 10), "sum", G, "bf16")
    rows = {(row["op"], row["codec"]): row for row in ccoll.stats()}
    # wire: the one payload of a one-exchange call, else the p encoded chunks of the all-to-all
    wire = 2 * n if one_exchange(ccoll.get_codec("bf16"), p, n, torch.float32) else p * 2 * -(-n // p)
    bf = rows.get(("all_reduce", "bf16"))
    if bf is None or bf["calls"] != 1 or bf["raw_bytes"] != 4 * n or bf["wire_bytes"] != wire:
        fail(env, "stats bf16", f"got {bf}, expected raw {4 * n}, wire {wire}")
    fp = rows.get(("all_reduce", "fp16"))
    if fp is None or fp["calls"] != 1 or fp["seconds"] <= 0:
        fail(env, "stats fp16 async", f"got {fp}")
    nat = rows.get(("all_reduce", "native"))
    if nat is None or nat["raw_bytes"] != 40 or nat["wire_bytes"] != 40:
        fail(env, "stats native", f"got {nat}")
    ccoll.reset_stats()


def check_subgroup(env: Env) -> None:
    """Global-rank src/dst on a group that excludes rank 0."""
    p, r = env.world, env.rank
    if p < 3:
        return
    members = list(range(1, p))
    sub = env.subgroup(members)
    spec = lossiest_spec()
    c = ccoll.get_codec(spec)
    if r not in members:
        # a non-member's call (torch: the non-member sentinel; MPI: COMM_NULL) does nothing, returns None
        t = torch.ones(5000)
        assert ccoll.all_reduce(t, group=sub, codec=spec, min_bytes=0) is None
        assert ccoll.broadcast(t, members[0], group=sub, codec=spec, min_bytes=0) is None
        expect_equal(env, "non-member untouched", t, torch.ones(5000))
        return
    root = members[-1]
    x = data(50, root, 3000)
    t = x.clone() if r == root else torch.zeros(3000)
    ccoll.broadcast(t, root, sub, spec, min_bytes=0)
    expect_close(env, "subgroup broadcast global src", t, x, roundtrip_bound(c, x))
    if r == members[0]:
        ccoll.send(data(51, r, 3000), root, sub, spec, min_bytes=0)
    elif r == root:
        y = torch.empty(3000)
        ccoll.recv(y, members[0], sub, spec, min_bytes=0)
        x1 = data(51, members[0], 3000)
        expect_close(env, "subgroup send/recv global ranks", y, x1, roundtrip_bound(c, x1))
    t = data(52, r, 4001)
    ccoll.all_reduce(t, "sum", sub, spec, min_bytes=0)
    inputs = [data(52, k, 4001) for k in members]
    ref = sum(x.double() for x in inputs)
    expect_close(env, "subgroup all_reduce", t, ref, sum_bound(c, inputs, ref))


def relative_error(env: Env, spec: str, n: int = 65536, one_exchange: bool = False) -> float:
    """||all_reduce - exact|| / ||exact|| with the same per-rank data distribution at every p, of flat's
    two-exchange algorithm (forced: on two ranks this size would take the one-exchange path) or, with
    ``one_exchange``, of the path ccoll.collectives.small takes on two ranks."""
    from ccoll.collectives import small

    g = torch.Generator().manual_seed(60 + env.rank)
    t = torch.randn(n, generator=g)
    inputs = [torch.randn(n, generator=torch.Generator().manual_seed(60 + k)) for k in range(env.world)]
    rule = small.one_exchange
    small.one_exchange = lambda c, p, numel, dtype: one_exchange  # the router reads the module attribute
    try:
        ccoll.all_reduce(t, "sum", env.group, spec, min_bytes=0)
    finally:
        small.one_exchange = rule
    ref = sum(x.double() for x in inputs)
    return float((t.double() - ref).norm() / ref.norm())


def error_feedback(env: Env, spec: str, steps: int = 16) -> dict:
    """Repeated all_reduce of the same tensors: the time-averaged error with feedback must shrink."""
    p, r, G = env.world, env.rank, env.group
    n = 8192
    x = data(70, r, n)
    ref = sum(data(70, k, n).double() for k in range(p))
    ef = ccoll.ErrorFeedback()
    acc_ef, acc_plain = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    for _ in range(steps):
        t = x.clone()
        ccoll.all_reduce(t, "sum", G, spec, error_feedback=ef, key="w", min_bytes=0)
        acc_ef += t.double()
        t = x.clone()
        ccoll.all_reduce(t, "sum", G, spec, min_bytes=0)
        acc_plain += t.double()
    expect_same_across_ranks(env, f"error feedback {spec}", acc_ef)
    err_ef = float((acc_ef / steps - ref).norm() / ref.norm())
    err_plain = float((acc_plain / steps - ref).norm() / ref.norm())
    if not err_ef < 0.5 * err_plain:
        fail(env, f"error feedback {spec}", f"time-averaged error {err_ef:.3g} not < half of {err_plain:.3g} without")
    # a different shape under the same key restarts the residual instead of mixing layouts
    t = data(71, r, 1000)
    ccoll.all_reduce(t, "sum", G, spec, error_feedback=ef, key="w", min_bytes=0)
    whole = one_exchange(ccoll.get_codec(spec), p, 1000, torch.float32)
    if ef.residual(("w", "whole" if whole else "ag")).numel() != (1000 if whole else -(-1000 // p)):
        fail(env, "error feedback reset", "residual kept the old layout")
    return {"spec": spec, "err_ef": err_ef, "err_plain": err_plain}


def run_all(env: Env, extra: Callable[[Env], None] | None = None, specs: list[str] | None = None) -> dict:
    """Every check, for every registered codec (or the registered ones among ``specs``); returns
    figures the launching test compares across p."""
    specs = [s for s in available_specs() if specs is None or s in specs]
    for spec in specs:
        check_all_reduce(env, spec)
        check_reduce_scatter(env, spec)
        check_all_gather(env, spec)
        check_broadcast(env, spec)
        check_all_to_all(env, spec)
        check_point_to_point(env, spec)
        check_async(env, spec)
    check_passthrough(env)
    check_bad_input(env)
    check_none_equals_native(env)
    check_stats(env)
    check_subgroup(env)
    if extra is not None:
        extra(env)
    lossy = [s for s in specs if ccoll.get_codec(s).lossy]
    report = {"specs": specs, "rel_err": {s: relative_error(env, s) for s in lossy}}
    if env.world == 2:
        report["rel_err_one_exchange"] = {s: relative_error(env, s, one_exchange=True) for s in lossy}
    report["error_feedback"] = error_feedback(env, lossiest_spec())
    return report


__all__ = ["Env", "GlooEnv", "MPIEnv", "SimEnv", "available_specs", "run_all"]
