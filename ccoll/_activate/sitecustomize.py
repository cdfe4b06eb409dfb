"""ccoll's zero-code activation, run by Python at start-up in every process that has this directory on
PYTHONPATH (``ccoll-run`` / ``python -m ccoll.run`` put it there; torchrun, the deepspeed launcher and
mpirun -x pass PYTHONPATH on to every rank).

With ``CCOLL_POLICY`` set to a policy file, the process gets ``ccoll.patch.install(CCOLL_POLICY)``
(automatic resolver) as soon as ``torch`` has been imported -- before any user code can reach
torch.distributed, and without importing torch (or deepspeed) in processes that never use it. With
``CCOLL_POLICY=deepspeed`` the policy is the ``"ccoll"`` block of the config ``deepspeed.initialize``
receives (ccoll/patch/dsconfig.py), installed when it is called; with a policy file, a block there must
agree with it. Any other ``sitecustomize`` on the path (a distribution's, a site's) still runs, first. A
policy that cannot be installed is an error in the process that imports torch (a traceback, non-zero
exit), never a silent uncompressed run; so is a rank (RANK / OMPI_COMM_WORLD_RANK / PMI_RANK set) that
got this directory on its path but not CCOLL_POLICY (``mpirun -x PYTHONPATH`` without ``-x CCOLL_POLICY``):
it stops at once instead of leaving the other ranks waiting for its policy fingerprint.
"""
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain() -> None:
    """Run the sitecustomize this one shadows (the next one on sys.path), under its own name."""
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["_ccoll_chained_sitecustomize"] = module


def _show_ccoll_lines() -> None:
    """The user launched ccoll-run, so show them what ccoll did: ccoll's lines for the user (what it
    compresses, whose hook it left alone) and its warnings, on stderr. Only the "ccoll" logger is touched,
    and only while the root logger has no handler (an application that configures logging gets the
    records through propagation instead, not twice). ``CCOLL_LOG=off`` silences it, ``CCOLL_LOG=debug``
    shows everything."""
    import logging

    level = os.environ.get("CCOLL_LOG", "info").lower()
    if level == "off":
        return
    log = logging.getLogger("ccoll")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    everything = level == "debug"
    handler.addFilter(lambda r: not logging.getLogger().handlers and (
        everything or r.levelno >= logging.WARNING or getattr(r, "ccoll_user", False)))
    log.addHandler(handler)
    if log.level == logging.NOTSET:
        log.setLevel(logging.DEBUG if everything else logging.INFO)


#: environment variables by which launchers tell a process it is a rank of a job
_RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
#: CCOLL_POLICY's value for "the ccoll block of the DeepSpeed config" (ccoll.run.FROM_DEEPSPEED)
_FROM_DEEPSPEED = "deepspeed"


def _install() -> None:
    import ccoll.patch

    _show_ccoll_lines()
    if os.environ["CCOLL_POLICY"] != _FROM_DEEPSPEED:
        ccoll.patch.install(os.environ["CCOLL_POLICY"])


def _wrap_deepspeed() -> None:
    import deepspeed

    from ccoll.patch.dsconfig import wrap_initialize

    wrap_initialize(deepspeed)


def _no_policy() -> None:
    from ccoll.errors import PolicyError

    rank = next(os.environ[v] for v in _RANK_VARS if v in os.environ)
    raise PolicyError(f"ccoll-run's activation reached rank {rank} but CCOLL_POLICY did not: pass it to every rank "
                      f"(mpirun: -x CCOLL_POLICY; DeepSpeed's multi-node launcher: CCOLL_POLICY=... in .deepspeed_env)")


def _after_import_class():
    """ccoll/frameworks/after_import.py's AfterImport, loaded by its path: importing the ``ccoll`` package
    would import torch. Its ``sys.meta_path`` entries below are ``ccoll-run`` rows of ccoll/frameworks'
    table."""
    path = os.path.join(os.path.dirname(_HERE), "frameworks", "after_import.py")
    spec = importlib.util.spec_from_file_location("_ccoll_run_after_import", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.AfterImport


def _activate() -> None:
    AfterImport = _after_import_class()  # noqa: N806

    if not os.environ.get("CCOLL_POLICY"):
        if any(v in os.environ for v in _RANK_VARS):
            sys.meta_path.insert(0, AfterImport("torch", _no_policy))
        return
    if "torch" in sys.modules:
        _install()
    else:
        # right after torch's own __init__ (torch.distributed and torch.optim are then complete)
        sys.meta_path.insert(0, AfterImport("torch", _install))
    sys.meta_path.insert(0, AfterImport("deepspeed", _wrap_deepspeed))


_chain()
_activate()
