"""The device-only code of kernels/*.cu run on the CPU: every ``#ifdef __CUDA_ARCH__`` branch (inline PTX, CUDA
intrinsics) against its host twin (the ``#else`` branch, what the host build and simt run), over the twin's whole
input domain where it is enumerable (every half, every selector, every team) and over edge cases plus random
patterns where it is not (fp32 pairs and triples: every rounding case the operation has -- ties, subnormals,
overflow, signed zeros, NaN, Inf -- is among the edges).

Why: the simt and host builds compile only the host twins, and ``make kernels-check`` only compiles the device
ones, so a device branch that differs from its twin -- a PTX rounding mode changed (``add.rn`` -> ``add.rz``,
``cvt.rni`` -> ``cvt.rzi``), ``.ftz`` added, an intrinsic misused -- passed every CPU test and changed the GPU's
bytes. How: each device branch is cut out of the source and compiled (g++, the simt shim) as a function of its
own beside the real one, its ``asm`` statements rewritten into ``ccoll_ptx::exec("<the PTX text>", operands)``
(tests/unit/ptx_model.h: the PTX ISA's semantics of the instruction, with the rounding mode and .ftz the
mnemonic names, run on the CPU's IEEE arithmetic) and its intrinsics given by their CUDA definitions. The test
first checks that the twins it finds in the sources are exactly those it has a domain for: a new device-only
branch fails here until it is covered (``TWINS``), so none goes unchecked."""
from __future__ import annotations

import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from ccoll import kernels, simt

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simt backend needs g++")

MODEL = Path(__file__).with_name("ptx_model.h")
SOURCES = ("common.cuh", "quant.cu", "zfp.cu", "lossless.cu")


@dataclass(frozen=True)
class Twin:
    """One ``#ifdef __CUDA_ARCH__`` of a source: its line, the function (or macro) around it, both branches."""

    source: str
    line: int
    where: str  # the enclosing function's name, or "#define NAME" for a branch of macro definitions
    header: str  # the enclosing function's text up to its body's "{" ("" for macros)
    device: str
    host: str
    before: str  # the function body's text before the #ifdef
    after: str  # ... and after the #endif, to the function's closing brace

    @property
    def key(self) -> str:
        return f"{self.source}:{self.where}"


def _function_at(lines: list[str], i: int) -> tuple[int, str]:
    """(line index, name) of the function definition enclosing line ``i``: the last line at column 0 before it
    that opens a definition (a name followed by "(")."""
    for j in range(i - 1, -1, -1):
        line = lines[j]
        if line[:1].strip() and not line.startswith(("#", "//", "}", "template", "struct", "namespace")):
            m = re.search(r"(\w+)\s*\(", line)
            if m:
                return j, m.group(1)
    raise AssertionError(f"no function before line {i + 1}")


def find_twins(name: str, text: str | None = None) -> list[Twin]:
    """Every ``#ifdef __CUDA_ARCH__`` ... ``#else`` ... ``#endif`` of kernels/<name> (or of ``text``, a copy's;
    nesting followed; an ``#if defined(__CUDA_ARCH__) || defined(CCOLL_SIMT)`` section is not a twin: simt
    runs it)."""
    text = (kernels.KERNEL_DIR / name).read_text() if text is None else text
    lines = text.splitlines(keepends=True)
    twins, stack = [], []
    for i, line in enumerate(lines):
        d = line.strip()
        if re.match(r"#\s*if", d):
            stack.append({"twin": d == "#ifdef __CUDA_ARCH__", "start": i, "else": None})
        elif re.match(r"#\s*else", d):
            stack[-1]["else"] = i
        elif re.match(r"#\s*endif", d):
            top = stack.pop()
            if not top["twin"]:
                continue
            s, e = top["start"], top["else"]
            assert e is not None, f"{name}:{s + 1}: a device-only branch without a host twin"
            device, host = "".join(lines[s + 1:e]), "".join(lines[e + 1:i])
            if device.lstrip().startswith("#define"):
                macro = re.match(r"\s*#define\s+(\w+)", device).group(1)
                twins.append(Twin(name, s + 1, f"#define {macro}", "", device, host, "", ""))
                continue
            f, fname = _function_at(lines, s)
            body = "".join(lines[f:s])
            brace = body.index("{")
            header, before = body[:brace + 1], body[brace + 1:]
            depth, k = before.count("{") - before.count("}") + 1, i + 1  # find the function's closing brace
            after = []
            while depth > 0:
                seg = lines[k]
                for c in seg:
                    depth += (c == "{") - (c == "}")
                after.append(seg)
                k += 1
            after_text = "".join(after)
            after_text = after_text[:after_text.rindex("}")]
            twins.append(Twin(name, s + 1, fname, header, device, host, before, after_text))
    return twins


def _split_top(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside parentheses and string literals."""
    out, depth, cur, quoted = [], 0, "", False
    for c in text:
        if c == '"':
            quoted = not quoted
        if not quoted:
            depth += (c == "(") - (c == ")")
        if c == sep and depth == 0 and not quoted:
            out.append(cur)
            cur = ""
        else:
            cur += c
    return out + [cur]


def translate_asm(code: str) -> str:
    """Every ``asm("template" : "=c"(out) : "c"(in), ...)`` of ``code`` -> ``ccoll_ptx::exec("template",
    ccoll_ptx::out(out), ccoll_ptx::in(in), ...)``: the instruction's text goes to the model unchanged (a
    macro parameter spliced into the template included)."""
    out, pos = [], 0
    for m in re.finditer(r"\basm\s*(?:volatile\s*)?\(", code):
        if m.start() < pos:
            continue
        depth, k = 1, m.end()
        while depth:
            depth += (code[k] == "(") - (code[k] == ")")
            k += 1
        inner = code[m.end():k - 1]
        parts = _split_top(inner, ":")
        tmpl, outs, ins = parts[0].strip(), parts[1] if len(parts) > 1 else "", parts[2] if len(parts) > 2 else ""
        ops = []
        for kind, group in (("out", outs), ("in", ins)):
            for operand in filter(str.strip, _split_top(group, ",")):
                c = re.match(r'\s*"[^"]*"\s*\((.*)\)\s*$', operand, re.S)
                assert c, f"operand {operand!r} of asm({inner!r})"
                ops.append(f"ccoll_ptx::{kind}({c.group(1)})")
        out.append(code[pos:m.start()] + f"ccoll_ptx::exec({tmpl}, {', '.join(ops)})")
        pos = k
    return "".join(out) + code[pos:]


def device_function(t: Twin, name: str) -> str:
    """The twin's function with its device branch (asm translated) as a function named ``name``."""
    header = re.sub(rf"\b{t.where}\s*\(", f"{name}(", t.header, count=1)
    return f"{header}{t.before}{translate_asm(t.device)}{t.after}}}\n"


# ---- domains: (argument arrays as uint64 bit patterns) per kind of input --------------------------------------

_G = torch.Generator().manual_seed(40)


def _u(bits: int, n: int) -> np.ndarray:
    return torch.randint(0, 1 << 62, (n,), generator=_G).numpy().astype(np.uint64) & np.uint64((1 << bits) - 1) \
        if bits < 64 else (torch.randint(0, 1 << 62, (n,), generator=_G).numpy().astype(np.uint64) << np.uint64(2)) ^ \
        torch.randint(0, 4, (n,), generator=_G).numpy().astype(np.uint64)


def _f32_edges() -> np.ndarray:
    """fp32 bit patterns at every kind of rounding case: zeros, subnormals (smallest, largest), the smallest
    normal, ties of rounding to an integer (k + 0.5, even and odd k), 1 and its neighbours, the quant scales'
    q maxima, 65537 (the bf16 split), 2^23 / 2^24 (where integers stop being fractional), the largest finite,
    Inf, NaN (quiet, signalling, payloads); each with both signs and its neighbours one ulp away."""
    vals = [0.0, 1e-45, 1.1754942e-38, 1.1754944e-38, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 3.5, 4.5, 7.0, 127.0, 448.0,
            57344.0, 65504.0, 65520.0, 65537.0, 2.0 ** 23, 2.0 ** 23 + 1, 2.0 ** 24, 3.0e38, 2.0 ** -126, 2.0 ** -149,
            1 / 3, 0.1, 2.0 ** 31, 2.0 ** 111]
    bits = np.array(vals, dtype=np.float32).view(np.uint32).astype(np.int64)
    bits = np.concatenate([bits - 1, bits, bits + 1])
    bits = bits[(bits >= 0) & (bits < 0x7F800000)]
    bits = np.concatenate([bits, [0x7F7FFFFF, 0x7F800000, 0x7FC00000, 0x7F800001, 0x7FFFFFFF]])
    bits = np.unique(np.concatenate([bits, bits | 0x80000000]))
    return bits.astype(np.uint64)


def _f32_random(n: int) -> np.ndarray:
    """Random fp32 patterns: half uniform bits, half values of random magnitude near each other's binades."""
    raw = _u(32, n // 2)
    g = torch.randn(n - n // 2, generator=_G) * torch.exp(4 * torch.randn(n - n // 2, generator=_G))
    return np.concatenate([raw, g.numpy().astype(np.float32).view(np.uint32).astype(np.uint64)])


def _f32_low_bits(start: float) -> np.ndarray:
    """fp32 of the binade [start, 2 start) with every pattern of the 16 low significand bits (every case of
    rounding those bits away: to bf16, and to an integer in the binades where they are the fraction), under
    the top 7 bits 0, all ones (the carry into the exponent) and one random pattern; both signs."""
    lo = int(np.array([start], dtype=np.float32).view(np.uint32)[0])
    top = [0, 0x7F, int(torch.randint(1, 0x7F, (1,), generator=_G))]
    b = np.concatenate([np.arange(1 << 16, dtype=np.uint64) + np.uint64(lo + (t << 16)) for t in top])
    return np.concatenate([b, b | np.uint64(0x80000000)])


def _pairs(n_random: int) -> tuple[np.ndarray, np.ndarray]:
    e = _f32_edges()
    a, b = np.meshgrid(e, e, indexing="ij")
    return np.concatenate([a.ravel(), _f32_random(n_random)]), np.concatenate([b.ravel(), _f32_random(n_random)])


def _dom_binary():
    return _pairs(1 << 16)


def _dom_fma():
    e = _f32_edges()
    a, b = _pairs(1 << 15)
    c = np.concatenate([np.resize(e, a.size - (1 << 15)), _f32_random(1 << 15)])
    return a, b, c


def _dom_unary():
    """Edges; every low-bit pattern of the binades 2^7 and 2^15 (the 16 low bits are the fraction there, or 8
    of them: every rounding-to-integer case, ties included); every binade's edges from 2^-2 to 2^24; k + 0.5
    for random k < 2^23 (the ties); random patterns."""
    ties = (torch.randint(0, 1 << 23, (1 << 14,), generator=_G).numpy() + 0.5).astype(np.float32)
    binades = (2.0 ** np.arange(-2, 25)).astype(np.float32).view(np.uint32).astype(np.int64)
    near = np.concatenate([binades + k for k in range(-3, 4)]).astype(np.uint64)
    return (np.concatenate([_f32_edges(), _f32_low_bits(2.0 ** 7), _f32_low_bits(2.0 ** 15), near, near | np.uint64(0x80000000),
                            ties.view(np.uint32).astype(np.uint64), _f32_random(1 << 16)]),)


def _dom_trunc():
    """cq_trunc's domain: non-NaN |a| < 2^31 (the host's (int) cast is defined there; the kernels convert
    clamped q values)."""
    (a,) = _dom_unary()
    f = a.astype(np.uint32).view(np.float32)
    return (a[np.isfinite(f) & (np.abs(f.astype(np.float64)) < 2.0 ** 31)],)


def _dom_clamp():
    """cq_clamp(a, m): non-NaN a (its contract), m every q maximum the formats use and random positive m."""
    (a,) = _dom_unary()
    a = a[~np.isnan(a.astype(np.uint32).view(np.float32))]
    ms = np.array([1.0, 7.0, 127.0, 448.0, 57344.0], dtype=np.float32).view(np.uint32).astype(np.uint64)
    m = np.resize(ms, a.size)
    return a, m


def _dom_u32_nonzero():
    single = (np.uint64(1) << np.arange(32, dtype=np.uint64))
    return (np.unique(np.concatenate([single, single - np.uint64(1), np.arange(1, 1 << 16, dtype=np.uint64),
                                      _u(32, 1 << 16)]))[1:] & np.uint64(0xFFFFFFFF),)


def _dom_u32():
    (x,) = _dom_u32_nonzero()
    return (np.concatenate([[0, 0xFFFFFFFF], x]).astype(np.uint64),)


def _dom_u31_nonzero():
    (x,) = _dom_u32_nonzero()
    x = x & np.uint64(0x7FFFFFFF)
    return (x[x != 0],)


def _dom_u64_nonzero():
    single = (np.uint64(1) << np.arange(64, dtype=np.uint64))
    x = np.concatenate([single, single - np.uint64(1), np.arange(1, 1 << 12, dtype=np.uint64), _u(64, 1 << 16)])
    return (x[x != 0],)


def _dom_u64():
    (x,) = _dom_u64_nonzero()
    return (np.concatenate([np.array([0, 0xFFFFFFFFFFFFFFFF], dtype=np.uint64), x]),)


def _dom_u32_pairs():
    edges = np.array([0, 1, 2, 3, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE, 1 << 16, (1 << 16) - 1],
                     dtype=np.uint64)
    a, b = np.meshgrid(edges, edges, indexing="ij")
    return np.concatenate([a.ravel(), _u(32, 1 << 16)]), np.concatenate([b.ravel(), _u(32, 1 << 16)])


def _dom_u64_pairs():
    (x,) = _dom_u64()
    return x, np.roll(x, 7)


def _dom_byte_perm():
    """Every selector of four byte indices 0..7 (8^4: all the sources' selectors among them), random x, y."""
    n = np.arange(8 ** 4, dtype=np.uint64)
    sel = (n & np.uint64(7)) | (n >> np.uint64(3) & np.uint64(7)) << np.uint64(4) | \
          (n >> np.uint64(6) & np.uint64(7)) << np.uint64(8) | (n >> np.uint64(9) & np.uint64(7)) << np.uint64(12)
    return _u(32, sel.size), _u(32, sel.size), sel


def _dom_halves():
    """Every fp16 bit pattern."""
    return (np.arange(1 << 16, dtype=np.uint64),)


def _dom_f32_to_f16():
    """The images of every half, every midpoint between neighbouring halves (the ties; 65520: to Inf), each
    with its fp32 neighbours, and random patterns."""
    images = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    finite = images[torch.isfinite(images) & (images >= 0)].unique()
    mids = torch.cat([(finite[:-1] + finite[1:]) / 2, torch.tensor([65520.0])])
    base = torch.cat([images, mids, -mids]).view(torch.int32).numpy().astype(np.int64) & 0xFFFFFFFF
    x = np.concatenate([base - 1, base, base + 1]) & 0xFFFFFFFF
    return (np.concatenate([x.astype(np.uint64), _f32_random(1 << 18)]),)


def _dom_bf16_split():
    """f32_round_bf16_normal's domain: +-0 and normal |x| < 2^111: every float of [1, 2) with both signs (every
    rounding case of the 16 dropped bits, ``_f32_low_bits``; the other binades are power-of-two scalings), the smallest and the
    largest binade's edges, random normal patterns below 2^111."""
    r = _f32_random(1 << 17)
    f = np.abs(np.nan_to_num(r.astype(np.uint32).view(np.float32).astype(np.float64), nan=np.inf))
    r = r[(f >= 2.0 ** -126) & (f < 2.0 ** 111)]
    e = _f32_edges()
    fe = np.abs(np.nan_to_num(e.astype(np.uint32).view(np.float32).astype(np.float64), nan=np.inf))
    e = e[(fe == 0) | ((fe >= 2.0 ** -126) & (fe < 2.0 ** 111))]
    return (np.concatenate([_f32_low_bits(1.0), e, r]),)


def _dom_teams():
    """quant's team sizes: the powers of two 1..32 (the kernels' contract: call.py's geometry)."""
    return (np.array([1, 2, 4, 8, 16, 32], dtype=np.uint64),)


@dataclass(frozen=True)
class Probe:
    """How to compare one twin: the domain, and the host function to compare with (default: the real function
    of the same name, i.e. the host twin); ``call``: a C++ expression of F (the function) and a0.. (arguments)
    where the function is not simply called (a pointer argument, a statement inside a kernel); ``nan_free``:
    compare only where the host result is not a NaN (a NaN's bits are the hardware's there: the caller only
    tests for NaN, or the PTX ISA leaves an arithmetic NaN's bits to the hardware -- sm_80 / sm_90 give the
    canonical 0x7fffffff where x86 quiets an input's payload), and require NaN where it is."""

    domain: object
    host: str | None = None
    call: str | None = None
    nan_free: str | None = None  # "f32" / "f16": the result's format
    unary: object = None  # the domain of the one-argument functions of a macro twin


#: every twin of the sources -> how it is compared (a new twin fails test_every_twin_has_a_probe until added)
TWINS: dict[str, Probe] = {
    "common.cuh:bitlen32": Probe(_dom_u31_nonzero),
    "common.cuh:byte_perm": Probe(_dom_byte_perm),
    "common.cuh:f32_round_bf16_normal": Probe(_dom_bf16_split),
    # the conversion instructions against the integer code (the host build's conversions) on every non-NaN
    # input; the select around them (f16_to_f32 / f32_to_f16, which simt runs) gives NaN its bits
    "common.cuh:f16_to_f32_ieee": Probe(_dom_halves, host="ccoll_conv::f16_to_f32_int", nan_free="f32"),
    "common.cuh:f32_to_f16_ieee": Probe(_dom_f32_to_f16, host="ccoll_conv::f32_to_f16_int", nan_free="f16"),
    "quant.cu:cq_u2f": Probe(lambda: (np.concatenate([_f32_edges(), _f32_random(1 << 14)]),)),
    "quant.cu:cq_f2u": Probe(lambda: (np.concatenate([_f32_edges(), _f32_random(1 << 14)]),)),
    # the fp32 operations' macros (CQ_FP32_BINARY and CQ_FP32_UNARY, one #ifdef): every function they define
    "quant.cu:#define CQ_FP32_BINARY": Probe(_dom_binary, unary=_dom_unary, nan_free="f32"),
    "quant.cu:cq_fma": Probe(_dom_fma, nan_free="f32"),
    "quant.cu:cq_f2i": Probe(_dom_trunc),  # integer-valued in the kernels; any |a| < 2^31 here
    "quant.cu:cq_clamp": Probe(_dom_clamp),
    "quant.cu:cq_teams_kernel": Probe(_dom_teams, call="[&] { const int team = a0; {BRANCH} return log2_team; }()"),
    "zfp.cu:ctz64": Probe(_dom_u64_nonzero),
    "zfp.cu:ctz32": Probe(_dom_u32_nonzero),
    "zfp.cu:clz32": Probe(_dom_u32),
    "zfp.cu:clz64": Probe(_dom_u64),
    "zfp.cu:popc32": Probe(_dom_u32),
    "zfp.cu:brev_of": Probe(_dom_u32),  # both overloads: u32 and u64 (the domain is widened for the second)
    "zfp.cu:atomic_or_word": Probe(_dom_u64_pairs, call="[&] { ccoll_u64 w = a0; F(&w, a1); return w; }()"),
    "zfp.cu:bitlen64": Probe(_dom_u64),
    "zfp.cu:add_rn": Probe(_dom_binary, nan_free="f32"),
    "zfp.cu:mulhi32": Probe(_dom_u32_pairs),
}


def test_every_twin_has_a_probe():
    """The twins the sources hold are exactly those TWINS covers: a device-only branch added (or renamed)
    without a domain here fails, so none is left to the GPU unchecked."""
    found = {t.key for name in SOURCES for t in find_twins(name)}
    assert found == set(TWINS), f"not covered: {sorted(found - set(TWINS))}; gone: {sorted(set(TWINS) - found)}"


def _params(header: str) -> list[tuple[str, str]]:
    """(type, name) of each parameter of a function header."""
    inside = header[header.index("(") + 1:header.rindex(")")]
    out = []
    for p in filter(str.strip, _split_top(inside, ",")):
        m = re.match(r"\s*(.*?)\s*(\w+)\s*$", p, re.S)
        out.append((m.group(1), m.group(2)))
    return out


def _namespace_at(text: str, line: int) -> str | None:
    """The namespace open at ``line`` (1-based) of a source, if any."""
    open_ns = None
    for i, l in enumerate(text.splitlines(), 1):
        if i >= line:
            break
        m = re.match(r"namespace (\w+) \{", l)
        if m:
            open_ns = m.group(1)
        elif re.match(r"\}\s*// namespace", l):
            open_ns = None
    return open_ns


@dataclass
class _Case:
    key: str
    label: str
    kernel: str
    domain: tuple
    nan_free: str | None


def _probe_source(name: str, twins: list[Twin], src_dir: Path) -> tuple[str, list[_Case]]:
    """The source (in ``src_dir``), then each twin's device function beside it, then one probe kernel per
    comparison: out_dev[i] and out_host[i] are the two twins' result bits on argument row i."""
    text = (src_dir / name).read_text()
    # the source's text itself (no path in the probe: its simt build is cached by content across runs)
    include = ("#define CCOLL_QUANT_KERNELS 0\n" if name == "quant.cu" else "") + text + "\n"
    parts = [f'#include "{MODEL}"\n', include]
    probes, cases = [], []
    for n, t in enumerate(twins):
        probe = TWINS[t.key]
        ns = _namespace_at(text, t.line)
        q = f"{ns}::" if ns else ""
        if t.where.startswith("#define"):  # macro definitions: the device ones renamed, applied to every use
            dev, uses = translate_asm(t.device), []
            for macro in re.findall(r"#define\s+(\w+)\(NAME", t.device):
                dev = dev.replace(f"#define {macro}(NAME", f"#define DEV_{macro}(NAME")
                for line in re.findall(rf"^{macro}\(.*$", text, flags=re.MULTILINE):
                    fn = re.match(rf"{macro}\((\w+),", line).group(1)
                    uses.append(line.replace(f"{macro}(", f"DEV_{macro}(", 1) + "\n")
                    arity = 2 if "BINARY" in macro else 1
                    args = ", ".join(f"ccoll_probe::arg<float>(a{k}[i])" for k in range(arity))
                    kname = f"probe_{n}_{fn}"
                    probes.append(_kernel(kname, f"dev_{fn}({args})", f"{fn}({args})"))
                    cases.append(_Case(t.key, fn, kname, (probe.domain if arity == 2 else probe.unary)(),
                                       probe.nan_free))
            dev = re.sub(r"\bNAME\(", "dev_##NAME(", dev)
            parts += [dev + "\n", *uses]
            continue
        if probe.call and "{BRANCH}" in probe.call:  # a statement inside a kernel: each branch in a lambda
            for side, branch in (("dev", translate_asm(t.device)), ("host", t.host)):
                parts.append(f"namespace ccoll_probe {{ inline long long {side}_{n}(unsigned long long a0) {{ "
                             f"return {probe.call.replace('{BRANCH}', branch)}; }} }}\n")
            kname = f"probe_{n}_{t.where}"
            probes.append(_kernel(kname, f"ccoll_probe::dev_{n}(a0[i])", f"ccoll_probe::host_{n}(a0[i])"))
            cases.append(_Case(t.key, t.where, kname, probe.domain(), probe.nan_free))
            continue
        dev_name = f"ccoll_dev_{n}_{t.where}"
        fn_text = device_function(t, dev_name)
        parts.append((f"namespace {ns} {{\n" if ns else "") + fn_text + ("}\n" if ns else ""))
        params = _params(t.header)
        args = ", ".join(f"ccoll_probe::arg<{typ}>(a{k}[i])" for k, (typ, _) in enumerate(params))
        host_fn = probe.host or f"{q}{t.where}"
        if probe.call:  # F(...) with a0, a1: the function called through a statement (a pointer argument)
            def expr(fn):
                return probe.call.replace("F(", f"{fn}(").replace("a0", "a0[i]").replace("a1", "a1[i]")
            dev_expr, host_expr = expr(f"{q}{dev_name}"), expr(host_fn)
        else:
            # the host function of the twin's own signature (overloads: brev_of of u32 and of u64)
            host_expr = f"static_cast<decltype(&{q}{dev_name})>(&{host_fn})({args})"
            dev_expr = f"{q}{dev_name}({args})"
        kname = f"probe_{n}_{t.where}"
        probes.append(_kernel(kname, dev_expr, host_expr, ns))
        domain = probe.domain()
        if "64" in _params(t.header)[0][0] and probe.domain is _dom_u32:  # the u64 overload of a u32 probe
            domain = _dom_u64()
        cases.append(_Case(t.key, f"{t.where}({', '.join(p for p, _ in params)})", kname, domain, probe.nan_free))
    return "".join(parts) + _PROBE_HELPERS + "".join(probes), cases


_PROBE_HELPERS = r"""
namespace ccoll_probe {
// an argument of type T from its bit pattern (floats by their bits, integers by value)
template <class T> inline T arg(unsigned long long b) {
  T v;
  if constexpr (sizeof(T) == 8) __builtin_memcpy(&v, &b, 8);
  else if constexpr (sizeof(T) == 4) { unsigned u = (unsigned)b; __builtin_memcpy(&v, &u, 4); }
  else if constexpr (sizeof(T) == 2) { unsigned short u = (unsigned short)b; __builtin_memcpy(&v, &u, 2); }
  else v = (T)b;
  return v;
}
inline unsigned long long a(unsigned long long b) { return b; }
template <class T> inline unsigned long long bits(T v) {
  if constexpr (sizeof(T) == 8) { unsigned long long b; __builtin_memcpy(&b, &v, 8); return b; }
  else if constexpr (sizeof(T) == 4) { unsigned u; __builtin_memcpy(&u, &v, 4); return u; }
  else if constexpr (sizeof(T) == 2) { unsigned short u; __builtin_memcpy(&u, &v, 2); return u; }
  else return (unsigned long long)v;
}
}  // namespace ccoll_probe
"""


def _kernel(name: str, dev: str, host: str, ns: str | None = None) -> str:
    return (f'extern "C" __global__ void {name}(const unsigned long long* a0, const unsigned long long* a1, '
            f"const unsigned long long* a2, unsigned long long* dev, unsigned long long* host, long long n) {{\n"
            f"  (void)a1; (void)a2;\n" + (f"  using namespace {ns};\n" if ns else "") +
            f"  for (long long i = threadIdx.x; i < n; i += blockDim.x) {{\n"
            f"    dev[i] = ccoll_probe::bits({dev});\n    host[i] = ccoll_probe::bits({host});\n  }}\n}}\n")


def _is_nan(bits: np.ndarray, fmt: str) -> np.ndarray:
    if fmt == "f32":
        return ((bits & 0x7FFFFFFF) > 0x7F800000)
    return ((bits & 0x7FFF) > 0x7C00)


def run_twins(name: str, tmp_path: Path, source_text: str | None = None) -> dict[str, tuple[int, int]]:
    """Each twin of kernels/<name> (``source_text``: a modified copy's text instead): key/label ->
    (inputs, mismatches)."""
    src_dir = kernels.KERNEL_DIR
    if source_text is not None:
        src_dir = tmp_path / "src"
        src_dir.mkdir(exist_ok=True)
        for f in kernels.KERNEL_DIR.glob("*.cuh"):
            (src_dir / f.name).write_text(f.read_text())
        (src_dir / name).write_text(source_text)
    twins = find_twins(name, (src_dir / name).read_text())
    probe_text, cases = _probe_source(name, twins, src_dir)
    path = tmp_path / f"twins_{name.replace('.', '_')}.cu"
    path.write_text(probe_text)
    results = {}
    for c in cases:
        arrays = [torch.from_numpy(np.ascontiguousarray(a.astype(np.uint64)).view(np.int64)) for a in c.domain]
        n = arrays[0].numel()
        arrays += [arrays[0]] * (3 - len(arrays))
        dev, host = torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64)
        simt.launch(path, c.kernel, 1, 32, (*arrays, dev, host, np.int64(n)))
        d, h = dev.numpy().view(np.uint64), host.numpy().view(np.uint64)
        if c.nan_free:
            nan = _is_nan(h, c.nan_free)
            bad = int(np.count_nonzero(d[~nan] != h[~nan])) + int(np.count_nonzero(~_is_nan(d[nan], c.nan_free)))
        else:
            bad = int(np.count_nonzero(d != h))
        results[f"{c.key} {c.label}"] = (n, bad)
    return results


@pytest.mark.parametrize("name", SOURCES)
def test_device_twins_equal_their_host_twins(name, tmp_path):
    """Every device branch of kernels/<name>, run by the PTX / intrinsic model, gives its host twin's bits on
    every input of its domain (see TWINS)."""
    twins = find_twins(name)
    if not twins:
        assert name == "lossless.cu"  # lossless converts nothing: no device-only code
        return
    results = run_twins(name, tmp_path)
    assert results and all(n > 0 for n, _ in results.values())
    bad = {k: v for k, v in results.items() if v[1]}
    assert not bad, f"device twins differing from their host twins (inputs, mismatches): {bad}"


@pytest.mark.parametrize("name, old, new", [
    ("quant.cu", 'CQ_FP32_BINARY(cq_add, "add.rn.f32", +)', 'CQ_FP32_BINARY(cq_add, "add.rz.f32", +)'),
    ("quant.cu", 'CQ_FP32_UNARY(cq_rint, "cvt.rni.f32.f32", rintf)', 'CQ_FP32_UNARY(cq_rint, "cvt.rzi.f32.f32", rintf)'),
    ("quant.cu", 'asm("fma.rn.f32 %0', 'asm("fma.rn.ftz.f32 %0'),
    ("common.cuh", 'asm("cvt.rn.f16.f32 %0', 'asm("cvt.rm.f16.f32 %0'),
    ("common.cuh", 'asm("mul.rn.f32 %0, %1, 0f47800080;"', 'asm("mul.rz.f32 %0, %1, 0f47800080;"'),
    # the split's constant as it was until this test: 65538 (0x47800100) instead of 65537 (0x47800080)
    ("common.cuh", 'asm("mul.rn.f32 %0, %1, 0f47800080;"', 'asm("mul.rn.f32 %0, %1, 0f47800100;"'),
    ("zfp.cu", 'return __ffs((int)x) - 1;', 'return __ffs((int)x);'),
])
def test_negative_control_a_changed_device_branch_is_caught(name, old, new, tmp_path):
    """Each mutation of a device branch alone (a rounding mode, .ftz, an intrinsic's offset) -- invisible to
    simt and the host build -- makes its twin differ here."""
    text = (kernels.KERNEL_DIR / name).read_text()
    assert text.count(old) == 1, old
    results = run_twins(name, tmp_path, text.replace(old, new))
    assert any(bad for _, bad in results.values()), results
