"""``batch_isend_irecv(ops)``: compressed ops travel as their payloads inside ONE call of torch's own
``batch_isend_irecv`` (so a backend that coalesces, NCCL, still gets one group and its deadlock
freedom); each returned handle waits for the whole batch, then decodes its receive.

Its own shape rather than a :mod:`ccoll.patch.wrap` row: one call carries many tensors, each decided
alone, and the codec runs here (encode before, decode after the batch) instead of in a collective.

On CUDA it is ordered by the collectives' machinery (:mod:`ccoll.streams`), not by its own: encoding,
the batch's issue, its waits and decoding run on the side stream after the caller's inputs, so every
``wait()`` (of any op's handle, on any stream, or through ``get_future()``) orders the waiting stream
after the last decode, and the payloads live on the side stream that last uses them
(tests/dist/test_streams_hb.py checks it under the happens-before model, on gloo ranks).
"""
from __future__ import annotations

import functools
import time
from typing import Callable

import torch
import torch.distributed as dist

from .. import capture as _capture, streams
from ..callctx import Call as _CallCtx, local as _local, set_current, stable_salt
from ..stats import record
from . import native
from .handles import DimHandle
from .state import SLOT
from .wrap import decide, enter


def make(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def batch_isend_irecv(p2p_op_list):
        st = SLOT.current
        if st is None or _local.busy or not isinstance(p2p_op_list, list) or not p2p_op_list:
            return orig(p2p_op_list)
        r = st.resolver
        send_fn, recv_fn = SLOT.wrappers.get("isend"), SLOT.wrappers.get("irecv")
        plans, stale = [], False
        for op in p2p_op_list:
            sending = op.op is send_fn or op.op is SLOT.originals.get("isend")
            stale = stale or (op.op is not send_fn and op.op is not recv_fn)  # a P2POp built before install
            dim = "default" if r is None else r(op.group, "send_recv")
            if dim is not None and _capture.state.active:  # capture samples only what this rank sends
                set_current(_CallCtx(dim, "send_recv", st.steps, sending))
            codec = None if dim is None else decide(st, dim, "send_recv", op.tensor)
            plans.append((op, sending, dim, codec))
        if not stale and all(codec is None for *_, codec in plans):
            return orig(p2p_op_list)  # each op runs through the isend/irecv wrappers: native, counted there
        enter(st)
        t0 = time.perf_counter()
        # CUDA: ordered like every compressed call (ccoll.streams): encode, the batch's issue and its
        # waits, and decode on the side stream after the caller's inputs; the stream of each wait()
        # joins the done event after the last decode. CPU: no-ops.
        side = streams.begin(p2p_op_list[0].tensor.device)  # torch: one device per batch
        try:
            rank = dist.get_rank()
            batch, finish = [], []
            with side.on_side():
                for op, sending, dim, codec in plans:
                    # the op torch sends: our isend/irecv (torch picks the peer keyword by identity with them;
                    # busy, they go straight to torch) on the payload, or on the tensor itself when native
                    carrier = object.__new__(type(op))  # P2POp.__new__ re-checks: copy the checked op as is
                    carrier.__dict__.update(op.__dict__)
                    carrier.op = send_fn if sending else recv_fn
                    batch.append(carrier)
                    if codec is None:
                        if dim is not None:
                            finish.append((None, op, sending, dim, None, None))
                        continue
                    t = op.tensor
                    side.keep(t)  # read (encode) or written (decode) on the side stream
                    nbytes = codec.encoded_nbytes(t.numel(), t.dtype)
                    # allocated on the side stream, which is the last to use it (decode): reusing it there
                    # is ordered, so dropping it after decoding needs no record_stream
                    payload = torch.empty(1, nbytes, dtype=torch.uint8, device=t.device)
                    if sending:
                        key = st.call_key(dim, "send", op.group)
                        flat = t.detach().reshape(-1)
                        codec.encode_rows(flat if flat.is_contiguous() else flat.contiguous(), payload, t.numel(),
                                          salt=stable_salt(st.steps, key + (rank,)))
                    carrier.tensor = payload.view(-1)
                    finish.append((codec, op, sending, dim, payload, nbytes))
                # issued with the side stream current: the communication waits for the encodes
                works = [side.wrap(w) for w in orig(batch)]  # waited for on the side stream
        finally:
            _local.busy = False
        outputs = [op.tensor for op in p2p_op_list]

        def then() -> None:
            with side.on_side():
                for codec, op, sending, dim, payload, nbytes in finish:
                    if codec is not None and not sending:
                        t = op.tensor
                        codec.decode(payload.view(-1), t.numel(), t.dtype, out=t.detach())  # buffers may require grad
                side.finish()
            side.join()
            seconds = side.seconds(t0)
            for codec, op, sending, dim, payload, nbytes in finish:
                t = op.tensor
                raw = t.numel() * t.element_size()
                if codec is None:
                    native.count(dim, "send" if sending else "recv", raw, time.perf_counter() - t0)
                else:
                    record("send" if sending else "recv", codec.spec, raw, nbytes, seconds, dim=dim)

        from ..transports import Handle

        # decodes once, whichever op's handle is waited for first; every later wait(), of any op's handle,
        # orders its own stream after the decoding (join)
        done = Handle(works, then, outputs, join=side.join)
        return [DimHandle(Handle([done], None, [t], join=side.join), dim or "default")
                for t, (_, _, dim, _) in zip(outputs, plans)]

    return batch_isend_irecv
