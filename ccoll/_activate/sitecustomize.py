"""ccoll's zero-code activation, run by Python at start-up in every process that has this directory on
PYTHONPATH (``ccoll-run`` / ``python -m ccoll.run`` put it there; torchrun, the deepspeed launcher and
mpirun -x pass PYTHONPATH on to every rank).

With ``CCOLL_POLICY`` set, the process gets ``ccoll.patch.install(CCOLL_POLICY)`` (automatic resolver)
as soon as ``torch`` has been imported -- before any user code can reach torch.distributed, and without
importing torch (or deepspeed) in processes that never use it. Without ``CCOLL_POLICY`` it does nothing.
Any other ``sitecustomize`` on the path (a distribution's, a site's) still runs, first. A policy that
cannot be installed is an error in the process that imports torch (a traceback, non-zero exit), never a
silent uncompressed run.
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


def _install() -> None:
    import ccoll.patch

    _show_ccoll_lines()
    ccoll.patch.install(os.environ["CCOLL_POLICY"])


def _activate() -> None:
    if not os.environ.get("CCOLL_POLICY"):
        return
    if "torch" in sys.modules:
        _install()
    else:
        from ccoll_after_import import AfterImport  # this directory is on sys.path: no ccoll import yet

        # right after torch's own __init__ (torch.distributed and torch.optim are then complete)
        sys.meta_path.insert(0, AfterImport("torch", _install))


_chain()
_activate()
