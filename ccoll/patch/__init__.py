"""Drop-in integration: route torch.distributed collectives and p2p calls through ccoll by policy.

``install(policy, resolver)`` replaces these ``torch.distributed`` attributes (old and new names in
torch 2.13) with wrappers:

    all_reduce                                                    -> op "all_reduce"
    all_gather_into_tensor, all_gather_single, _all_gather_base   -> op "all_gather"
    reduce_scatter_tensor, reduce_scatter_single, _reduce_scatter_base -> op "reduce_scatter"
    broadcast -> "broadcast"; all_to_all_single -> "all_to_all";
    send, recv, isend, irecv, batch_isend_irecv                   -> "send_recv"

and, kept exact but counted (codec "native", stats op = torch's name, ``_list`` added where it is a
policy op's: ``all_gather_list``): the list forms (``all_gather``,
``all_gather_coalesced``, ``reduce_scatter``, ``all_to_all``, ``all_reduce_coalesced``), the rooted
ones (``reduce``, ``gather``, ``scatter``), the object ones (``all_gather_object``, ``gather_object``,
``broadcast_object_list``, ``scatter_object_list``, ``send_object_list``, ``recv_object_list``) and
``barrier`` / ``monitored_barrier``. docs/TORCH_CONTRACTS.md lists every public torch.distributed
function with ccoll's verdict and its test.

GPT-NeoX's mpu and DeepSpeed's ``deepspeed.comm`` look these attributes up at call time, except the two
functions DeepSpeed's TorchBackend caches at construction (``all_gather_function``,
``reduce_scatter_function``) and the ones Megatron(-core) modules bind at import
(``dist_all_gather_func``, ``dist_reduce_scatter_func``): those are rebound at install and uninstall; a
backend built or a module imported while the patch is installed picks the wrappers up by itself.

Per call: resolver(group, op) -> dimension (None: not ours -> the original, untouched; by default the
automatic resolver, :class:`ccoll.resolvers.AutoResolver`, which never answers None); the policy
gives a codec or None from (dim, op, shape, dtype, step); reduce ops other than SUM/AVG and uneven
all_to_all splits stay native; an any-source recv decides like its sender and decodes what arrives.
Native calls on a resolved dimension are recorded in ``ccoll.stats()`` as codec "native" so users see
all traffic; compressed calls go to ``ccoll.collectives`` under ``ccoll.stats.dimension(dim)``, with a
thread-local guard (:mod:`ccoll.callctx`) so any torch.distributed call made while ccoll handles a call
goes straight to the original.

Policy v2 rule keys: ``transport: mpi`` sends the (dim, op)'s calls, compressed or not, through an MPI
communicator over the group's ranks (``ccoll.transports.mpi_comm_for``, built at the group's first such
call; reduce ops MPI does not have stay on torch, as every rank decides alike); ``hierarchy: node`` is
passed to the collectives as ``hierarchy="node"`` (all_reduce, reduce_scatter, all_gather; see
``ccoll.hierarchy``). Why mixing transports cannot deadlock: ``ccoll.policy``'s docstring.

Calls the patch does not compress reach the original with the same arguments and return its result.
After ``uninstall()`` (or if someone captured a wrapper before), wrappers are plain pass-throughs.

Policy fingerprints are compared across ranks at install (or when the process group appears): see
:mod:`ccoll.patch.fingerprint`.

Steps (for ``warmup_steps``): by default ``torch.optim.Optimizer.step()`` calls count training steps (a
global post-step hook): one per pass over the parameters, so DeepSpeed ZeRO's one inner step per parameter
group, or two optimizers over disjoint parameters, count one step (``state._TrainingSteps``); ``install(..., step_counter="manual")`` counts
only ``ccoll.patch.step()`` calls. The step count also delimits call keys: the n-th compressed call of a (dim, op, group) within
a step is the same logical tensor as the n-th one of the previous step (DeepSpeed reduces its gradient
buckets in the same order every step); error-feedback residuals are keyed by it and stochastic-rounding
salts derive from (step, call key, rank), so ``state_dict()`` / ``load_state_dict()`` resume a run
bit-identically. A rule with ``weight_delta:`` sends the all_gather's encoded change against a
reconstruction ccoll keeps per call key (:mod:`ccoll.wdelta`); ``state_dict()`` carries those
reconstructions too (a state without them makes the next gather of each call key an exact refresh).
DDP reorders its buckets after step 0, so for DDP use ``ccoll.ddp.compress_hook`` (keys by parameter)
rather than the patch under torch's own hooks.

Batched point-to-point: ``isend``, ``irecv`` and ``batch_isend_irecv`` are replaced in both
``torch.distributed`` and ``torch.distributed.distributed_c10d`` (torch's ``P2POp`` checks its op
against the latter by identity), so ``P2POp(dist.isend, ...)`` works (Megatron, torch.distributed.
pipelining); a ``dist.isend`` captured before ``install`` is rejected by ``P2POp`` as torch rejects any
other function (P2POps built before ``install`` still batch). Compressed async calls return handles
shaped like torch's ``Work`` (``wait(timeout=)``, ``is_completed()``, ``get_future()`` valued with the
output tensors; ``result()`` returns the output tensors as torch's does), so torch's DDP
``default_hooks`` run unchanged while the patch compresses; under torch's profiler a compressed call
records torch's event for the operation (``c10d::allreduce_``, ...).

Modules, one job each:

    state.py        the installation state: policy, resolver, steps, call keys, salts, state_dict
    wrap.py         the one wrapper shape (prologue, decide, native, compress, epilogue) and its table rows
    batch.py        batch_isend_irecv, which carries many tensors per call
    native.py       running and counting the calls that stay native
    handles.py      async handles of compressed calls
    anysource.py    recv / irecv without src= under a compressing policy
    fingerprint.py  the cross-rank policy check
    install.py      install / uninstall / installed, binding into torch and frameworks' cached copies
    ccoll.callctx   (below the patch) the thread's call context: internal(), stable_salt, reduce names
"""
from __future__ import annotations

from typing import Any

from ..callctx import internal, stable_salt
from . import wrap
from .install import (C10D_TOO, MEGATRON_CACHED, WRAPPED, current_policy, install, installed, is_installed,
                      set_resolver, uninstall)
from .state import SLOT, load_state_dict, state_dict, step, steps

__all__ = ["install", "uninstall", "installed", "is_installed", "current_policy", "set_resolver", "step",
           "steps", "state_dict", "load_state_dict", "WRAPPED", "internal", "stable_salt"]


def __getattr__(name: str) -> Any:
    if name == "_STATE":  # the current installation's State, or None (read by tests and tools)
        return SLOT.current
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
