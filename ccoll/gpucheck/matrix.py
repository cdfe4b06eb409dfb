"""The GPU check's matrix: which codec specs it compares (the registry's examples plus kernel-geometry cases)
and the inputs it feeds them, made on the CPU with the same bits on every machine. Shared by the check on the
GPU machine (ccoll.gpucheck.check) and the digests computed here (ccoll.gpucheck.expected), so both see
exactly the same cases."""
from __future__ import annotations


def _registry_specs() -> list[str]:
    """Every registered codec's example specs (Codec.example_specs): a new codec enters every check here."""
    from ccoll.codecs import example_specs

    return example_specs()


#: the registry's examples, plus the kernel-geometry cases this check adds: block sizes that make GPU teams
#: of 1 to 32 lanes holding 1 to 8 words each (rotate=hadamard: every _rot_w<W> kernel of every format, W =
#: 1, 2, 4, 8, int4 up to 4), partial blocks, rates near the minimum, non-default seeds
GEOMETRY_SPECS = [
    *(f"zfp:rate={r}" for r in (2.875, 4, 8, 12.5, 16, 32)),
    *(f"zfp:rate={r},dims=2" for r in (0.71875, 1, 4, 8, 16, 32)),
    *(f"int8:block={b}" for b in (8, 24, 64, 256, 4096)),
    *(f"int4:block={b}" for b in (8, 24, 64, 256, 4096)),
    "int8:block=64,round=stochastic,seed=3",
    "int4:block=256,round=stochastic,seed=4",
    *(f"fp8:format=e4m3,block={b}" for b in (8, 24, 32, 4096)),
    *(f"fp8:format=e5m2,block={b}" for b in (32, 4096)),
    *(f"int8:block={b},rotate=hadamard,rotate_seed=3" for b in (8, 256, 512, 1024)),
    *(f"int4:block={b},rotate=hadamard,rotate_seed=3" for b in (8, 32, 512, 1024)),
    *(f"fp8:block={b},rotate=hadamard,rotate_seed=3" for b in (32, 256, 512, 1024)),
    "int4:block=64,round=stochastic,seed=4,rotate=hadamard",
    "lossless:block=32",
]


def check_specs() -> list[str]:
    """The byte-comparison matrix's specs: the registry's examples, then the geometry cases."""
    return list(dict.fromkeys([*_registry_specs(), *GEOMETRY_SPECS]))


#: the spec lists read the codec registry: computed on first use, so a codec registered later is in them
_LAZY_SPECS = {"CHECK_SPECS": check_specs, "TP_SPECS": _registry_specs}


def __getattr__(name: str):
    if name in _LAZY_SPECS:
        return _LAZY_SPECS[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
INPUTS = ("normal", "subnormal", "nonfinite", "misaligned")
QUICK_SIZES = (1, 5, 255, 4099)  # "normal" inputs (large sizes are the throughput phase's)
#: the special inputs use two sizes: a partial block and many blocks with a partial tail
SPECIAL_SIZES = (5, 4099)
ROWS = 3  # rows of the batched checks (the last one partly padding)
FEEDBACK_SALT = 0x5EED_0001_2345


def _dtypes(torch):
    return (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


# --------------------------------------------------------------------------------------------------
# inputs


def portable_randn(torch, n: int, g):
    """``n`` pseudo-normal float64 values with the same bits on every machine, for inputs whose digests
    another machine must reproduce. torch.randn and torch.exp go through libm, and glibc picks its log /
    cos / exp variant by the CPU it runs on (FMA, AVX2 paths): the same seed gave different last bits on
    two x86 hosts (this test machine's digests went stale between sessions; a GPU host's CPU would differ
    again). Here only exact operations: uniform doubles (53 random bits x 2^-53), four summed in a fixed
    order with correctly rounded adds (Irwin-Hall, variance 1/3), one correctly rounded scaling."""
    s = torch.rand(n, generator=g, dtype=torch.float64)
    for _ in range(3):
        s = s + torch.rand(n, generator=g, dtype=torch.float64)
    return (s - 2.0) * 1.7320508075688772  # sqrt(3): unit variance


def pow2(torch, k):
    """Exactly 2^k for an integer tensor ``k`` in float64's normal range, built from its bits (no libm)."""
    return ((k.to(torch.int64) + 1023) << 52).view(torch.float64)


def make_input(torch, kind: str, n: int, dtype, seed: int):
    """A CPU tensor of ``n`` values of ``dtype``. ``subnormal`` spans the dtype's smallest normals and its
    subnormals (zfp's tiny-block threshold 2^-98 and int8's absmax/127 underflow included for fp32/bf16);
    ``nonfinite`` holds NaN and +-Inf; ``misaligned`` is a view one element past an aligned start."""
    g = torch.Generator().manual_seed(seed)
    # magnitudes over ~2^-9..2^9 (heavy-tailed blocks, as gradients are), every value machine-independent
    x = portable_randn(torch, n, g) * pow2(torch, torch.randint(-9, 10, (n,), generator=g))
    x[torch.rand(n, generator=g) < 0.05] = 0.0
    if n > 40:
        x[17:33] = 0.0  # whole zero blocks
    info = torch.finfo(dtype)
    if kind == "subnormal":
        # per 16-value run, an exponent from ~30 binades above the smallest normal down past the smallest
        # subnormal (fp32: 2^-96 .. 2^-150, covering zfp's tiny-block threshold and int8's scale underflow)
        runs = -(-n // 16)
        min_exp = int(torch.log2(torch.tensor(info.tiny, dtype=torch.float64)))  # -126, -1022, -14
        digits = {torch.float32: 24, torch.bfloat16: 8, torch.float16: 11, torch.float64: 53}[dtype]
        span = 10 if dtype == torch.float16 else 30
        shift = torch.randint(min_exp - digits, min_exp + span, (runs,), generator=g).repeat_interleave(16)[:n]
        # two exact factors: 2^shift itself may lie below float64's normal range (the product rounds once)
        x = portable_randn(torch, n, g) * pow2(torch, shift + 64) * 2.0**-64
    if dtype == torch.float16:
        x = x.clamp(-6e4, 6e4)
    x = x.to(dtype)
    if kind == "nonfinite":
        # set in the target dtype: a NaN's bits after a float64 -> bf16/f16 cast depend on the CPU's vector
        # path (AVX-512 conversions keep another payload than the scalar one)
        for i, v in zip(range(3, n, 37), (float("nan"), float("inf"), float("-inf")) * n):
            x[i] = v
    if kind == "misaligned":
        base = torch.zeros(n + 1, dtype=dtype)
        base[1:] = x
        x = base[1:]
    return x
