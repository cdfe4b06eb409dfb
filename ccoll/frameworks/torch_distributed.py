"""torch.distributed itself: the functions ``ccoll.patch`` wraps (made by ``ccoll.patch``; this adapter says
which, where, and puts them in place). Present wherever torch is; places no group (the resolver's other
adapters do); attaches nothing."""
from __future__ import annotations

from .patches import INSTALL, Patch, Wrapping, replace

NAME = "torch.distributed"
SOURCE = None
DESCS: dict = {}
signature = None

#: every torch.distributed function ccoll.patch wraps: the rows of ccoll/patch/wrap.py's table,
#: batch_isend_irecv (ccoll/patch/batch.py) and init_process_group (ccoll/patch/fingerprint.py);
#: tests/unit/test_frameworks.py checks this list against ccoll.patch.WRAPPED
FUNCTIONS = (
    "_all_gather_base", "_reduce_scatter_base", "all_gather", "all_gather_coalesced", "all_gather_into_tensor",
    "all_gather_object", "all_gather_single", "all_reduce", "all_reduce_coalesced", "all_to_all",
    "all_to_all_single", "barrier", "batch_isend_irecv", "broadcast", "broadcast_object_list", "gather",
    "gather_object", "irecv", "isend", "monitored_barrier", "recv", "recv_object_list", "reduce",
    "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor", "scatter", "scatter_object_list",
    "send", "send_object_list", "init_process_group",
)

#: also replaced in ``torch.distributed.distributed_c10d``: ``P2POp`` checks its op against
#: ``distributed_c10d.isend/irecv`` by identity and ``batch_isend_irecv`` picks the peer keyword by
#: identity, so ``P2POp(dist.isend, ...)`` needs the same object in both modules
C10D_TOO = ("isend", "irecv", "batch_isend_irecv")

PATCHES = (
    Patch(NAME, "torch.distributed", FUNCTIONS, INSTALL, "ccoll.patch (wrap.py, batch.py, fingerprint.py)",
          "every call passes through ccoll's policy; init_process_group checks every rank's policy fingerprint"),
    Patch(NAME, "torch.distributed.distributed_c10d", C10D_TOO, INSTALL, "ccoll.patch (wrap.py, batch.py)",
          "P2POp and batch_isend_irecv compare these by identity"),
)


def present() -> bool:
    return True


def place(placer, default_pg) -> int:
    return 1


def install(w: Wrapping) -> None:
    import torch.distributed as dist

    for name in FUNCTIONS:
        orig = getattr(dist, name, None)
        if orig is None:
            continue
        wrapper = w.make(name, orig)
        # what ccoll's own transports call, so moving ccoll's payloads never re-enters the patch
        wrapper.__ccoll_original__ = orig
        w.originals[name], w.wrappers[name] = orig, wrapper
        replace(dist, name, wrapper)
        if name in C10D_TOO:
            replace(dist.distributed_c10d, name, wrapper)


def uninstall(w: Wrapping) -> None:
    pass
