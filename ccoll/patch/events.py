"""torch's profiler events for a compressed call: the backend's event of the call it stands for.

Unpatched, a torch.distributed call shows in a profile as two events: the dispatcher's (``c10d::allreduce_``,
recorded by ``wrap._profiled`` for a compressed call too) and the backend's, recorded by the c10d ``Work``
it creates: ``gloo:all_reduce`` with the caller's tensor shapes (``input_shapes``), an async event (it ends
on the backend's thread when the work completes). torch's own tests look for the backend's event by name
and check its shapes (``distributed_test.call_dist_op``, the send/recv profiler tests), and so may people's
profile analyses. A compressed call moves payloads (uint8 buffers) through other collectives (an
all_reduce travels as an all_gather or all_to_all of bytes): their backend events would name the wrong op
with the payload's shape. So while a profiler runs, a compressed call

- records the backend's event torch would record: :data:`TITLES` (the op's name per backend) with the
  shape of the caller's tensor, begun at the call and ended when the call is complete (a sync call: when
  it returns; an async one: at its handle's first ``wait()``), on ccoll's profiler thread, so the event
  is async as torch's are (the profiler marks an event whose end is on another thread async);
- issues its payload traffic with torch's events off on the issuing thread (:func:`torch_events_off`,
  used inside ``ccoll.exchange.<op>`` ranges, which show the exchange with ccoll's name instead).

When no profiler runs: one ``torch.autograd._profiler_enabled()`` check per compressed call, nothing else.
"""
from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import torch
import torch.distributed as dist

from ..collectives.phases import torch_events_off  # noqa: F401 - the patch's payload traffic outside collectives
from ..once import once

#: the backend's event name of each wrapped call, by the dispatcher event its row records (``Row.event``)
#: and backend. gloo: as torch 2.13's ProcessGroupGloo records them (measured; it runs reduce_scatter_tensor
#: as an all_reduce of the input, and names a receive without a source ``recvAnySource``). nccl: as its
#: ProcessGroupNCCL names them. Any other backend: ``<backend>:`` + the gloo name.
TITLES: dict[str, dict[str, str]] = {
    "c10d::allreduce_": {"gloo": "all_reduce", "nccl": "all_reduce"},
    "c10d::_allgather_base_": {"gloo": "all_gather", "nccl": "_all_gather_base"},
    "c10d::_reduce_scatter_base_": {"gloo": "all_reduce", "nccl": "_reduce_scatter_base"},
    "c10d::broadcast_": {"gloo": "broadcast", "nccl": "broadcast"},
    "c10d::alltoall_base_": {"gloo": "all_to_all", "nccl": "all_to_all"},
    "c10d::send": {"gloo": "send", "nccl": "send"},
    "c10d::recv_": {"gloo": "recv", "nccl": "recv"},
    "c10d::recv_any_source_": {"gloo": "recvAnySource", "nccl": "recvAnySource"},
}

_enter = torch.autograd._record_function_with_args_enter
_exit = torch.autograd._record_function_with_args_exit


def title(dispatcher_event: str, group: Any) -> str:
    """The backend's event name for a call whose dispatcher event is ``dispatcher_event`` on ``group``."""
    try:
        backend = str(dist.get_backend(group))
    except Exception:  # noqa: BLE001 - a group torch cannot name the backend of (an MPI communicator)
        backend = "gloo"
    names = TITLES[dispatcher_event]
    return f"{backend}:{names.get(backend, names['gloo'])}"


class Event:
    """One backend event in flight; :meth:`end` closes it (once) on ccoll's profiler thread."""

    __slots__ = ("_handle", "_lock")

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self._lock = threading.Lock()

    def end(self) -> None:
        with self._lock:
            h, self._handle = self._handle, None
        if h is not None:
            _ender_thread().submit(_exit, h).result()


def begin(dispatcher_event: str, tensor: Any, group: Any) -> "Event | None":
    """The backend's event of this call, begun now with ``tensor``'s shape, or None when no profiler runs
    (the caller checks ``torch.autograd._profiler_enabled()`` first on its hot path)."""
    if not torch.autograd._profiler_enabled():
        return None
    inputs = (tensor,) if isinstance(tensor, torch.Tensor) else ()
    return Event(_enter(title(dispatcher_event, group), *inputs))


#: ccoll's profiler thread, made on first use
_ender_thread = once(lambda: concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ccoll-profiler"),
                     remake_after_fork=True)

