"""`make mutants`: a fixed list of realistic bugs, each applied to a temporary copy of the tree (never the working
tree), with only the tests that should catch it run against that copy; prints a table: mutation, caught (yes / no /
error), by which test. Exit 0 when every mutation is caught, 1 otherwise.

Why: a new check is only worth its time if it fails on the bug it targets. The suite's own negative controls prove
that for the checkers themselves (simt's fault traps, the PTX model); this proves it for bugs in the code under test,
end to end through the real test files: kernels (an indexing bound, a device-only rounding mode, a NaN rule, a
missing warp barrier, a write past a row), the stream hand-offs of the collectives, and their rank / bound logic.
Not in CI (each mutation rebuilds what it changes: minutes).

How: the copy holds every file git tracks or would track (``git ls-files -co --exclude-standard``: the working tree as
it is, edits included) and runs with the checkout's .venv, ``PYTHONPATH`` at the copy (so ``import ccoll`` is the
copy's, asserted per mutation) and ``CCOLL_BUILD_DIR`` at the checkout's build/: every build there is keyed by its
sources' bytes (host libraries, simt, NVRTC), so a mutant's builds never replace the checkout's, and the unmutated
ones are shared. ``--baseline`` also runs each mapping on the unmutated copy (each must pass there: a test that
fails anyway proves nothing). ``--only SUBSTRING`` runs the mutations whose name contains it.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to the tree
    old: str  # must occur exactly once
    new: str
    tests: tuple[str, ...]  # pytest node ids or files, relative to the tree


MUTATIONS = (
    Mutation("zfp tile encoder: whole-tile bound off by one (reads one value past the tensor)", "kernels/zfp.cu",
             "encode_tile_lane<St, D>(src, numel, row_numel, pos, row_end, next <= lim, maxbits",
             "encode_tile_lane<St, D>(src, numel, row_numel, pos, row_end, next <= lim + 1, maxbits",
             ("tests/unit/test_simt.py::test_kernels_at_their_indexing_bounds",)),
    Mutation("quant: device-only rounding mode of cq_add, add.rn.f32 -> add.rz.f32", "kernels/quant.cu",
             'CQ_FP32_BINARY(cq_add, "add.rn.f32", +)', 'CQ_FP32_BINARY(cq_add, "add.rz.f32", +)',
             ("tests/unit/test_device_twins.py::test_device_twins_equal_their_host_twins",)),
    Mutation("quant: device-only cq_rint, cvt.rni -> cvt.rzi (truncation)", "kernels/quant.cu",
             'CQ_FP32_UNARY(cq_rint, "cvt.rni.f32.f32", rintf)', 'CQ_FP32_UNARY(cq_rint, "cvt.rzi.f32.f32", rintf)',
             ("tests/unit/test_device_twins.py::test_device_twins_equal_their_host_twins",)),
    Mutation("common.cuh: device-only bf16 split by 65538 (0f47800100) instead of 65537", "kernels/common.cuh",
             'asm("mul.rn.f32 %0, %1, 0f47800080;"', 'asm("mul.rn.f32 %0, %1, 0f47800100;"',
             ("tests/unit/test_device_twins.py::test_device_twins_equal_their_host_twins",)),
    Mutation("quant decode_sum: NaN canonicalisation removed", "kernels/quant.cu",
             "for (int k = 0; k < G; ++k) acc[j * G + k] = cq_canonical_nan(acc[j * G + k]);",
             "for (int k = 0; k < G; ++k) acc[j * G + k] = acc[j * G + k];",
             ("tests/unit/test_quant_kernel_nan.py",)),
    Mutation("zfp tile encoder: __syncwarp between coding and assembling removed", "kernels/zfp.cu",
             "    __syncwarp();\n    assemble_tile_lane(", "    assemble_tile_lane(",
             ("tests/unit/test_simt.py::test_zfp_tile_encoder_equals_per_block_encoder_and_host",
              "tests/unit/test_simt.py::test_kernels_at_their_indexing_bounds")),
    Mutation("zfp tile encoder: a row's last tile writes one word into the next row (a write-write race)",
             "kernels/zfp.cu", "return t + 1 == ntile ? (int)(2 * row_words - t * (ccoll_u64)maxbits) : maxbits;",
             "return t + 1 == ntile ? (int)(2 * row_words - t * (ccoll_u64)maxbits) + 1 : maxbits;",
             ("tests/unit/test_simt.py::test_kernels_at_their_indexing_bounds",)),
    Mutation("flat all_reduce: side.keep(t) removed (the caller's tensor not kept for the side stream)",
             "ccoll/collectives/flat.py", "        side.keep(t)\n        flat = contig(flat_view(t))\n",
             "        flat = contig(flat_view(t))\n",
             ("tests/dist/test_streams_hb.py",)),
    Mutation("segments: a one-segment all_reduce's chunk floor(n / p) instead of ceil (off by one)",
             "ccoll/collectives/segments.py", "return [(0, n, -(-n // p))]", "return [(0, n, n // p)]",
             ("tests/dist/test_collectives_simulated.py",)),
    Mutation("segments: reduce_scatter / all_gather spans one element short", "ccoll/collectives/segments.py",
             "return [(a, min(span, m - a)) for a in range(0, m, span)]",
             "return [(a, min(span, m - a - 1)) for a in range(0, m, span)]",
             ("tests/dist/test_collectives_simulated.py",)),
)


def copy_tree(dest: Path) -> None:
    """Every file git tracks or would track, as it is in the working tree, copied under ``dest``."""
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True).stdout.split(b"\0")
    for f in filter(None, files):
        src = ROOT / f.decode()
        if src.is_file() and not src.is_symlink():
            (dest / f.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f.decode())


def env_for(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCOLL_") and k != "PYTHONPATH"}
    return {**env, "PYTHONPATH": str(tree), "CCOLL_BUILD_DIR": str(ROOT / "build"), "PYTHONDONTWRITEBYTECODE": "1"}


def run_tests(tree: Path, tests: tuple[str, ...], python: str) -> tuple[int, list[str], str]:
    """(pytest's exit status, failed test ids, output tail) of ``tests`` in ``tree``."""
    proc = subprocess.run([python, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *tests], cwd=tree,
                          env=env_for(tree), capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", out, flags=re.MULTILINE)))
    return proc.returncode, failed, out[-3000:]


def check_import(tree: Path, python: str) -> None:
    out = subprocess.run([python, "-c", "import ccoll; print(ccoll.__file__)"], cwd=tree, env=env_for(tree),
                         capture_output=True, text=True).stdout.strip()
    if not Path(out).is_relative_to(tree):
        raise SystemExit(f"the copy's tests would import ccoll from {out!r}, not from {tree}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="run only mutations whose name contains this")
    ap.add_argument("--baseline", action="store_true", help="also run each mapping unmutated (must pass)")
    ap.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    args = ap.parse_args(argv)
    chosen = [m for m in MUTATIONS if args.only in m.name]
    rows = []
    for m in chosen:
        with tempfile.TemporaryDirectory(prefix="ccoll-mutant-") as tmp:
            tree = Path(tmp) / "tree"
            copy_tree(tree)
            check_import(tree, args.python)
            if args.baseline:
                rc, failed, tail = run_tests(tree, m.tests, args.python)
                if rc != 0:
                    print(f"baseline of {m.name!r} does not pass (exit {rc}): {failed}\n{tail}", file=sys.stderr)
                    rows.append((m.name, "error", "baseline fails: " + ", ".join(failed)))
                    continue
            target = tree / m.path
            text = target.read_text()
            if text.count(m.old) != 1:
                rows.append((m.name, "error", f"{m.path}: the text to mutate occurs {text.count(m.old)} times"))
                continue
            target.write_text(text.replace(m.old, m.new))
            start = time.perf_counter()
            rc, failed, tail = run_tests(tree, m.tests, args.python)
            seconds = time.perf_counter() - start
        if rc == 1 and failed:
            rows.append((m.name, "yes", ", ".join(failed) + f" ({seconds:.0f} s)"))
        elif rc == 0:
            rows.append((m.name, "no", f"{', '.join(m.tests)} passed ({seconds:.0f} s)"))
        else:
            rows.append((m.name, "error", f"pytest exit {rc}: {tail[-600:]}"))
        print(f"{rows[-1][1]:>5}  {m.name}", flush=True)
    width = max(len(r[0]) for r in rows) if rows else 10
    print(f"\n{'mutation':<{width}}  caught  by")
    for name, caught, by in rows:
        print(f"{name:<{width}}  {caught:<6}  {by}")
    return 0 if rows and all(r[1] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
