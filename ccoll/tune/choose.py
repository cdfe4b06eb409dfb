"""Choosing per (dimension, op) and size from measured times within a budget, and writing the v2 policy."""
from __future__ import annotations

import math

from ..bench import harness
from ..units import format_nbytes


def beating_native(times: dict, gate: dict, native_us: float, errors: dict, budget: float, transport: str,
                   size: int, margin: float):
    """(spec, us) of every candidate on ``transport`` at ``size`` within the error ``budget`` whose
    ``gate`` figure beats ``native_us`` by the margin (torch's native itself is the reference, not a
    candidate); ``us`` is its ``times`` figure, which ranks it."""
    for (tr, spec, s), us in times.items():
        if tr != transport or s != size or us is None or (tr == "torch" and spec == harness.NATIVE):
            continue
        if spec != harness.NATIVE and errors.get(spec, math.inf) > budget:
            continue
        if gate.get((tr, spec, s), us) <= native_us * (1 - margin):
            yield spec, us


def choose(times: dict, native_time: dict, errors: dict, budget: float, sizes: list[int], transports: list[str],
           margin: float, gate: dict | None = None) -> dict:
    """The choice for one (dim, op). ``times[(transport, spec, size)]`` in us ranks the candidates;
    ``gate`` (default: ``times``) is the figure that must beat ``native_time[size]`` (torch's native
    time) by the margin -- the confirmation pass makes it the slower of a candidate's two passes, so a
    lucky pass cannot take a size from native, while the ranking among candidates keeps their fastest
    figure (an unlucky pass must not hand a size to a slower codec: 2 ranks at 1 Gbit/s, 8 MiB, int4
    30.9 ms then 40.4 ms against int8 36.5/37.5 ms, and int4 was faster again in the compare pass).
    Returns {"transport", "per_size": [(size, spec)], "score"}."""
    gate = times if gate is None else gate
    best = {"transport": "torch", "per_size": [(s, harness.NATIVE) for s in sizes], "score": float(len(sizes))}
    for tr in transports:
        per_size, score, feasible = [], 0.0, True
        for s in sizes:
            base = native_time[s]
            # native on torch is the reference; anything else must win by the margin
            pick, t_pick = (harness.NATIVE, base) if tr == "torch" else (None, math.inf)
            for spec, t in beating_native(times, gate, base, errors, budget, tr, s, margin):
                if t < t_pick:
                    pick, t_pick = spec, t
            if pick is None:
                feasible = False
                break
            per_size.append((s, pick))
            score += t_pick / base
        if feasible and (tr == "torch" or score < best["score"] * (1 - margin)):
            best = {"transport": tr, "per_size": per_size, "score": score}
    return best


_fmt_bytes = format_nbytes


def _short(spec: str) -> str:
    """A spec without its default parameters, for the comment tables."""
    return ",".join(p for p in spec.split(",") if p not in ("round=nearest", "seed=0"))


def buckets(per_size: list[tuple[int, str]]) -> list[dict]:
    """Measured (policy nbytes, spec) pairs -> v2 ``sizes`` buckets: native below the first size, each
    choice up to the next measured size, adjacent equal choices merged."""
    out: list[dict] = [{"below": per_size[0][0], "codec": harness.NATIVE}]
    for i, (_, spec) in enumerate(per_size):
        nxt = per_size[i + 1][0] if i + 1 < len(per_size) else None
        if out[-1]["codec"] == spec:
            out[-1]["below"] = nxt
        else:
            out.append({"below": nxt, "codec": spec})
    return [b if b["below"] is not None else {"codec": b["codec"]} for b in out]


def policy_yaml(choices: dict, table: dict, meta: dict) -> str:
    """The v2 policy text, measured figures as comments."""
    lines = [
        "# Written by python -m ccoll.tune: per (dimension, op), the fastest codec within the dimension's error",
        "# budget at each measured size (native unless a codec beats it by the margin; native below the",
        f"# smallest size measured). Times: us per call ({meta['stat']} of the iterations); err: relative L2 round trip on",
        "# the data named per op.",
        f"# world_size {meta['world_size']}  backend {meta['backend']}  transports {','.join(meta['transports'])}  "
        f"margin {meta['margin']}  link {meta['netem'] or 'unshaped'}",
        f"# load avg at start {'/'.join(f'{v:.2f}' for v in meta['loadavg_start'])}  host {meta['host']}",
        "version: 2",
        "default:",
        "  codec: native",
    ]
    by_dim: dict[str, list] = {}
    for (dim, op), ch in sorted(choices.items()):
        by_dim.setdefault(dim, []).append((op, ch))
    for dim, ops in by_dim.items():
        lines += ["", f"{dim}:", "  ops:"]
        for op, ch in ops:
            info = table["errors"][f"{dim}/{op}"]
            lines.append(f"    # {op}: budget rel_l2 <= {info['budget']:.4g} ({info['source']}); rel_l2 "
                         + ", ".join(f"{_short(k)} {v:.4g}" for k, v in sorted(info["errors"].items())))
            for row in ch["rows"]:
                lines.append("    #   " + row)
            lines.append(f"    {op}:")
            lines.append("      sizes:")
            for b in ch["buckets"]:
                if "below" in b:
                    lines.append(f"        - {{below: {_fmt_bytes(b['below'])}, codec: \"{b['codec']}\"}}")
                else:
                    lines.append(f"        - {{codec: \"{b['codec']}\"}}")
            if ch["transport"] != "torch":
                lines.append(f"      transport: {ch['transport']}")
            if ch["error_feedback"]:
                lines.append("      error_feedback: true")
    return "\n".join(lines) + "\n"
