"""``ccoll-run``: run any launcher or training command with ccoll installed in every rank, no code change.

    ccoll-run --policy hybrid torchrun --nproc_per_node 8 train.py ...
    ccoll-run --policy configs/my.yaml --stats logs/ccoll.json deepspeed train.py --deepspeed_config ds.json
    ccoll-run deepspeed train.py --deepspeed_config ds.json          # ds.json has "ccoll": {"policy": ...}
    CCOLL_POLICY=hybrid ccoll-run mpirun -x CCOLL_POLICY -x PYTHONPATH -n 8 python train.py
    python -m ccoll.run --policy hybrid -- <command ...>

Where the policy comes from, first found: ``--policy``, ``CCOLL_POLICY``, the ``"ccoll"`` block of a
DeepSpeed JSON named on the command line (``--deepspeed_config ds.json`` / ``--deepspeed ds.json``), or
``--policy deepspeed``: the block of whatever config the script hands ``deepspeed.initialize`` (a dict
built in code). A policy is a shipped name (``hybrid``, ``naive``, ... : ``python -m ccoll info`` lists
them) or a YAML path. It is loaded and validated here first, so a typo fails now, once, not in N ranks
later. Then the command is executed (exec: same process id, signals and exit code) with
``ccoll/_activate`` first on PYTHONPATH: its ``sitecustomize.py`` runs in every Python process the
launcher starts and installs ``ccoll.patch`` with the automatic resolver as soon as the process imports
torch, before user code can call torch.distributed (with a DeepSpeed block: when ``deepspeed.initialize``
is called). torchrun and the deepspeed launcher hand the environment to their local ranks; mpirun needs
``-x CCOLL_POLICY -x PYTHONPATH``; DeepSpeed's multi-node (pdsh) launcher forwards PYTHONPATH but not
CCOLL_POLICY: add ``CCOLL_POLICY=...`` to ``.deepspeed_env``. A rank that gets the activation but not the
policy stops at once with a PolicyError saying so, instead of leaving the others to wait for it.
``--stats PATH`` (or ``CCOLL_STATS``) writes each rank's traffic table at exit (``PATH.rank<R>.json``).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

from .errors import PolicyError

PROG = "ccoll-run"
#: CCOLL_POLICY's value for "the policy is the ccoll block of the config deepspeed.initialize receives"
FROM_DEEPSPEED = "deepspeed"
#: command-line options through which DeepSpeed (and Hugging Face's --deepspeed) name their JSON config
DS_CONFIG_FLAGS = ("--deepspeed_config", "--deepspeed")
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
ACTIVATE_DIR = os.path.join(_PACKAGE_DIR, "_activate")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage=f"{PROG} [--policy NAME|PATH|deepspeed] [--stats PATH] [--] <command> [args...]",
        description="Run a training command with ccoll's compressed collectives in every rank, no code change.",
        epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--policy", metavar="NAME|PATH|deepspeed",
                   help="a shipped policy name (e.g. hybrid), a YAML path, or 'deepspeed' (the \"ccoll\" block "
                        "of the config given to deepspeed.initialize); default: CCOLL_POLICY, else the ccoll block "
                        "of a DeepSpeed JSON named on the command line")
    p.add_argument("--stats", metavar="PATH", help="write each rank's traffic table at exit to PATH.rank<R>.json "
                                                    "(default: CCOLL_STATS)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the launcher or script to run, with its arguments")
    return p


def deepspeed_config_in(command: "list[str]") -> "str | None":
    """The JSON file a DeepSpeed (or Hugging Face) command line names with ``--deepspeed_config`` /
    ``--deepspeed``, if any."""
    for i, arg in enumerate(command):
        for flag in DS_CONFIG_FLAGS:
            if arg == flag and i + 1 < len(command):
                value = command[i + 1]
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
            else:
                continue
            if value.endswith(".json") and os.path.isfile(value):
                return value
    return None


def resolve_policy(policy: "str | None", command: "list[str]") -> tuple[str, str]:
    """(CCOLL_POLICY for the ranks, what to tell the user). Validates the policy now: PolicyError with
    what was wrong and what is allowed."""
    from .policy import find_policy, load
    from .resources import shipped_policies

    if policy == FROM_DEEPSPEED:
        return FROM_DEEPSPEED, "the \"ccoll\" block of the config deepspeed.initialize receives"
    if policy:
        path = find_policy(policy)
        load(path)
        return path, path
    ds_json = deepspeed_config_in(command)
    if ds_json is not None:
        from .patch.dsconfig import load_policy

        if load_policy(ds_json) is not None:
            return FROM_DEEPSPEED, f"the \"ccoll\" block of {ds_json}"
    raise PolicyError(
        f"no policy: pass --policy NAME|PATH (shipped: {', '.join(shipped_policies())}), set CCOLL_POLICY, or put "
        f"\"ccoll\": {{\"policy\": ...}} in the DeepSpeed config named on the command line "
        f"({' / '.join(DS_CONFIG_FLAGS)} ds.json; --policy deepspeed for a config built in code)")


def activation_env(environ: "dict[str, str] | None" = None, policy: "str | None" = None,
                   stats: "str | None" = None, command: "list[str] | None" = None) -> dict[str, str]:
    """The environment for the launched command: CCOLL_POLICY resolved to an absolute path (ranks may
    start in another directory) or ``deepspeed``; CCOLL_STATS absolute; ``ccoll/_activate`` first on
    PYTHONPATH, then ccoll's own parent directory when it is not installed in site-packages (a source
    checkout), then what was there."""
    env = dict(os.environ if environ is None else environ)
    env["CCOLL_POLICY"], _ = resolve_policy(policy or env.get("CCOLL_POLICY") or None, command or [])
    stats = stats or env.get("CCOLL_STATS")
    if stats:
        env["CCOLL_STATS"] = os.path.abspath(stats)
    parts = [ACTIVATE_DIR]
    root = os.path.dirname(_PACKAGE_DIR)
    if os.path.basename(root) not in ("site-packages", "dist-packages"):
        parts.append(root)
    old = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in parts]
    env["PYTHONPATH"] = os.pathsep.join(parts + old)
    return env


def main(argv: "list[str] | None" = None) -> int:
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.print_usage(sys.stderr)
        print(f"{PROG}: error: no command to run (e.g. {PROG} --policy hybrid torchrun --nproc_per_node 8 train.py)",
              file=sys.stderr)
        return 2
    try:
        env = activation_env(policy=args.policy, stats=args.stats, command=command)
    except PolicyError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    exe = shutil.which(command[0], path=env.get("PATH")) or command[0]
    try:
        os.execvpe(exe, command, env)
    except OSError as e:
        print(f"{PROG}: cannot run {command[0]!r}: {e.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
