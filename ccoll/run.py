"""Zero-code activation: run any launcher or training command with ccoll installed in every rank.

    CCOLL_POLICY=configs/hybrid.yaml ccoll-run torchrun --nproc_per_node 8 train.py ...
    CCOLL_POLICY=configs/hybrid.yaml ccoll-run deepspeed train.py --deepspeed_config ds.json
    CCOLL_POLICY=configs/hybrid.yaml ccoll-run mpirun -x CCOLL_POLICY -x PYTHONPATH -n 8 python train.py
    CCOLL_POLICY=configs/hybrid.yaml python -m ccoll.run -- <command ...>

The policy is loaded and validated here first (a typo fails now, not in N ranks later). Then the command
is executed (exec: same process id, signals and exit code) with ``ccoll/_activate`` first on PYTHONPATH:
its ``sitecustomize.py`` runs in every Python process the launcher starts and installs
``ccoll.patch.install(CCOLL_POLICY)`` with the automatic resolver as soon as the process imports torch,
before user code can call torch.distributed. torchrun and the deepspeed launcher hand the environment to
their local ranks; mpirun needs ``-x CCOLL_POLICY -x PYTHONPATH``; DeepSpeed's multi-node (pdsh) launcher
forwards PYTHONPATH but not CCOLL_POLICY: add ``CCOLL_POLICY=...`` to ``.deepspeed_env``.
``CCOLL_STATS=path.json`` writes each rank's traffic table at exit (``path.rank<R>.json``).
"""
from __future__ import annotations

import os
import shutil
import sys

from .errors import PolicyError

USAGE = "usage: CCOLL_POLICY=<policy.yaml> ccoll-run <command> [args...]   (or python -m ccoll.run -- <command> ...)"
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
ACTIVATE_DIR = os.path.join(_PACKAGE_DIR, "_activate")


def activation_env(environ: "dict[str, str] | None" = None) -> dict[str, str]:
    """The environment for the launched command: ``ccoll/_activate`` first on PYTHONPATH, then ccoll's
    own parent directory when it is not installed in site-packages (a source checkout), then what was
    there. ``CCOLL_POLICY`` is made absolute, since ranks may start in another directory."""
    env = dict(os.environ if environ is None else environ)
    policy = env.get("CCOLL_POLICY")
    if not policy:
        raise PolicyError(f"ccoll-run: CCOLL_POLICY is not set. {USAGE}")
    env["CCOLL_POLICY"] = os.path.abspath(policy)
    parts = [ACTIVATE_DIR]
    root = os.path.dirname(_PACKAGE_DIR)
    if os.path.basename(root) not in ("site-packages", "dist-packages"):
        parts.append(root)
    old = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in parts]
    env["PYTHONPATH"] = os.pathsep.join(parts + old)
    return env


def main(argv: "list[str] | None" = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__ if args else USAGE, file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    try:
        env = activation_env()
        from .policy import Policy

        Policy.from_yaml(env["CCOLL_POLICY"])  # fail here, once, on a bad policy
    except PolicyError as e:
        print(f"ccoll-run: {e}", file=sys.stderr)
        return 2
    exe = shutil.which(args[0], path=env.get("PATH")) or args[0]
    try:
        os.execvpe(exe, args, env)
    except OSError as e:
        print(f"ccoll-run: cannot run {args[0]!r}: {e.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
