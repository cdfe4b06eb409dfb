"""Each candidate codec's error per (dimension, op) on captured or synthetic data, and the error budgets."""
from __future__ import annotations

import math

import torch

from ..bench import harness
from ..bench.harness import BenchError
from .options import DIM_OPS, HYBRID, SYNTH_NUMEL


def synthetic(kind: str, numel: int = SYNTH_NUMEL, seed: int = 0) -> torch.Tensor:
    """'heavy': Student-t with 3 degrees of freedom (DP gradients are heavy-tailed); 'gaussian'."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g)
    if kind == "heavy":
        chi2 = torch.randn(3, numel, generator=g).square().sum(0)
        x = x / (chi2 / 3).sqrt()
    return x


def samples_by_key(directory: str | None, max_per_key: int = 8) -> dict[tuple[str, str], list[torch.Tensor]]:
    """Captured tensors grouped by (dim, op), an even spread of at most ``max_per_key`` each."""
    if not directory:
        return {}
    from ..capture import load

    found: dict[tuple[str, str], list[torch.Tensor]] = {}
    for s in load(directory):
        found.setdefault((s["meta"]["dim"], s["meta"]["op"]), []).append(s["tensor"].float().reshape(-1).contiguous())
    if not found:
        raise BenchError(f"--data {directory}: no captured tensors (*.pt from CCOLL_CAPTURE) found")
    for k, xs in found.items():
        if len(xs) > max_per_key:
            found[k] = [xs[round(i * (len(xs) - 1) / (max_per_key - 1))] for i in range(max_per_key)]
    return found


def error_table(dims: list[str], ops: list[str], specs: list[str], data: str | None, seed: int) -> dict:
    """{(dim, op): {"source": ..., "errors": {spec: pooled rel_l2}}} for every spec plus the hybrid's."""
    from ..bench.rd import measure as rd_measure
    from ..codecs import get_codec

    captured = samples_by_key(data)
    out: dict = {}
    for dim in dims:
        for op in ops:
            if op not in DIM_OPS.get(dim, ()):
                continue
            xs = captured.get((dim, op))
            source = f"captured ({len(xs)} tensors)" if xs else None
            if not xs:
                kind = "heavy" if dim == "dp" else "gaussian"
                xs, source = [synthetic(kind, seed=seed)], f"synthetic {kind}"
            errs = {}
            for spec in specs:
                if spec == harness.NATIVE:
                    errs[spec] = 0.0
                    continue
                codec = get_codec(spec, backend="torch")
                ms = [rd_measure(x, codec) for x in xs]
                x2 = sum(m["x2"] for m in ms)
                errs[codec.spec] = math.sqrt(sum(m["err2"] for m in ms) / x2) if x2 > 0 else 0.0
            out[(dim, op)] = {"source": source, "errors": errs}
    return out


def default_budgets(errors: dict, slack: float) -> dict:
    """Per (dim, op): the error of configs/hybrid.yaml's codec on the same data, x slack (0 if exact)."""
    from ..bench.rd import measure as rd_measure
    from ..policy import Policy

    hybrid = Policy.from_yaml(HYBRID)
    budgets = {}
    for (dim, op), row in errors.items():
        codec = hybrid.rule(dim, op).codec_obj
        if codec is None or not codec.lossy:
            budgets[(dim, op)] = 0.0
            continue
        if codec.spec not in row["errors"]:
            kind = "heavy" if dim == "dp" else "gaussian"
            row["errors"][codec.spec] = rd_measure(synthetic(kind), codec)["rel_l2"]
        budgets[(dim, op)] = row["errors"][codec.spec] * slack
    return budgets
