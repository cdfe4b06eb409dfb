"""``python -m ccoll <command>``: ``info`` (what ccoll finds on this machine: ccoll.info). The other tools keep
their own modules (``python -m ccoll.run``, ``ccoll.bench``, ``ccoll.model``, ``ccoll.gpucheck``, ...)."""
from __future__ import annotations

import sys

COMMANDS = {"info": "what ccoll finds here: kernels, policies, build cache, torch/CUDA/NCCL, CuPy, MPI, "
                    "compilers, which kernel backends can run (--json: the same as JSON)"}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m ccoll <command> [args]\n" + "\n".join(f"  {c:<6} {h}" for c, h in COMMANDS.items()),
              file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    if args[0] == "info":
        from .info import main as info

        return info(args[1:])
    print(f"python -m ccoll: unknown command {args[0]!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
