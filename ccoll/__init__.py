"""ccoll: compression-assisted collectives for LLM training.

Importing ccoll is cheap: torch and the codec registry only. ``ccoll.stats()`` returns the traffic table;
``ccoll.stats`` is also the stats module (``ccoll.stats.dimension("dp")``, ``ccoll.stats.dump(path)``). cupy, mpi4py and deepspeed are imported
when first needed (a CUDA tensor, an MPI communicator, a DeepSpeed resolver).
"""
from __future__ import annotations

import importlib
import types

from . import errors, stats
from . import report as _report  # noqa: F401 - its stats hooks: the first-call line and the exit table for every caller
from .codecs import CODECS, Codec, get_codec
from .stats import reset_stats


class _StatsModule(types.ModuleType):
    """``ccoll.stats`` is the module (``ccoll.stats.dimension``, ``ccoll.stats.dump``, ...) and calling it
    returns the table, as ``ccoll.stats.stats()`` does: both spellings users meet keep working."""

    def __call__(self) -> list[dict]:
        return self.stats()


stats.__class__ = _StatsModule

__version__ = "0.1.0"

# public name -> submodule that defines it; loaded on first attribute access
_LAZY = {
    "all_reduce": "collectives",
    "all_gather_into_tensor": "collectives",
    "reduce_scatter_tensor": "collectives",
    "broadcast": "collectives",
    "all_to_all_single": "collectives",
    "send": "collectives",
    "recv": "collectives",
    "isend": "collectives",
    "irecv": "collectives",
    "ErrorFeedback": "collectives",
    "Policy": "policy",
    "patch": None,
    "ddp": None,
    "fsdp": None,
    "resolvers": None,
    "transports": None,
    "collectives": None,
    "policy": None,
    "summary": "report",
    "hf": None,
}


def __getattr__(name: str):
    """Loads a public name on first use and keeps it as a module attribute, so later uses
    (``ccoll.all_reduce`` on every training step) are a plain lookup, not an import per call."""
    if name not in _LAZY:
        raise AttributeError(f"module 'ccoll' has no attribute {name!r}")
    module = importlib.import_module(f".{_LAZY[name] or name}", __name__)
    value = module if _LAZY[name] is None else getattr(module, name)
    globals()[name] = value
    return value


__all__ = ["errors", "CODECS", "Codec", "get_codec", "stats", "reset_stats", *_LAZY]
