"""Weight-delta all-gather: ZeRO-1/2 parameter all-gathers that send quantised weight *changes*.

Why: under ZeRO-1/2 every rank owns a partition of the updated weights and all-gathers it after each
optimizer step. The weights change little per step, so their difference from what every rank already
holds quantises far better than the weights themselves (SDP4Bit's idea). An exact all-gather is about
a third of the DP bytes under ZeRO-1; sending int8/int4 deltas instead lifts the DP dimension as a whole
from ~2.3x to >= 4x.

Algorithm (one call site = one logical tensor, named by ``key``):

- Every rank keeps ``recon``: its reconstruction of the whole gathered tensor (p partitions), in the
  codec's feedback dtype (fp32; fp64 for fp64). All ranks hold the same bits.
- Owner: ``delta = input - recon[own slot]``, encoded with the codec (no separate residual: what the
  encode drops stays in ``input - recon`` and is sent with the next delta, so the delta against the
  reconstruction *is* the error feedback). All ranks all-gather the p payloads.
- Every rank, the owner included: ``recon += decode(payloads)``; ``output = recon`` (cast to the
  output dtype). Same bytes, same starting bits, same float ops -> bit-identical replicas.
- Error: after a call, ``input - recon[own]`` is the quantisation error of one delta (per block at most
  ``absmax(step update + previous error) / (2 qmax)`` for the block quantisers), so it does not
  accumulate over steps: it contracts by ``1 / (2 qmax)`` per call on top of each step's update.

The framework's output buffer is never trusted to hold last step's values (DeepSpeed writes the
owner's new partition into its own slot before gathering; other frameworks pass fresh buffers), so
the state lives here. An **exact** all-gather replaces the delta, and re-seeds ``recon`` from its
result, when: the key has no state (first call, or state dropped); the call's signature (partition
numel, dtype, device, codec, group ranks) differs from the state's; or ``refresh_steps`` optimizer steps
have passed since the last seeding (so nothing but a quantisation error of one delta can ever separate
the replicas' weights from the owners', whatever happens to the floats in between). Every rank decides
from (key, signature, step) alone, so they always take the same path.

Memory: per call site, one ``recon`` of the *gathered* tensor in fp32 (4 bytes per gathered element:
under ZeRO-1 with fp32 weights that is one extra copy of the model's parameters; with bf16/fp16
weights, two), plus transient buffers of the partition size (the fp32 delta, p payloads and their
fp32 decode) during a call.

Checkpointing: :meth:`WeightDelta.state_dict` carries every ``recon`` (on CPU, so a checkpoint grows by
the memory above) with its signature and seeding step; ``ccoll.patch.state_dict()`` includes it, so a
resumed run continues bit-identically. Loading a state without it (``load_state_dict`` of a dict from
which ``"weight_delta"`` was dropped, or an older one) clears the state: the next call of every key is
an exact refresh, so the replicas agree again from that call on (at the cost of one exact gather).

Stats: delta calls record codec ``wdelta/<spec>``; refreshes record ``native`` (exact bytes).
"""
from __future__ import annotations

import threading
from typing import Any, Hashable

import torch

from .collectives import all_gather_into_tensor as _exact_all_gather
from .collectives.call import Run, decide, rows
from .collectives.salts import OWN, salts
from .errors import PolicyError
from .transports import Handle, for_group

__all__ = ["WeightDelta"]


class _Entry:
    """One call site's reconstruction: what it was made for, the gathered weights, when it was seeded."""

    __slots__ = ("signature", "recon", "seeded_step")

    def __init__(self, signature: tuple, recon: torch.Tensor, seeded_step: int):
        self.signature = signature
        self.recon = recon  # [p * m], codec feedback dtype, contiguous; identical bits on every rank
        self.seeded_step = seeded_step


class WeightDelta:
    """Reconstruction state of weight-delta all-gathers, one entry per call site (``key``).

    ``all_gather_into_tensor(output, input, group, codec, key=..., step=..., refresh_steps=...)`` has the
    semantics of :func:`ccoll.all_gather_into_tensor` (output = every rank's input in rank order,
    bit-identical on every rank), but what travels is the encoded change since the last call of
    ``key``. See the module docstring for the algorithm, its refresh rules and its memory cost.
    """

    def __init__(self) -> None:
        self._entries: dict[Hashable, _Entry] = {}
        self._lock = threading.Lock()

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor, group: Any = None,
                               codec: Any = None, async_op: bool = False, *, key: Hashable, step: int,
                               refresh_steps: int, min_bytes: int | None = None,
                               salt: int | None = None) -> Handle | None:
        """Weight-delta all-gather of ``input`` (this rank's partition) into ``output``. ``key`` names
        the call site (the same logical tensor every step); ``step`` is the optimizer step count, equal
        on every rank; ``refresh_steps`` (>= 1) the most steps between exact re-seedings. Passthrough
        rules (codec None, tiny or integer tensors, world size 1, ...) are :func:`ccoll.collectives.call.decide`'s:
        those calls are plain exact all-gathers and leave the state alone."""
        if key is None:
            raise PolicyError("weight-delta all_gather needs key= naming the call site")
        if isinstance(refresh_steps, bool) or not isinstance(refresh_steps, int) or refresh_steps < 1:
            raise PolicyError(f"weight-delta refresh_steps must be an integer >= 1, got {refresh_steps!r}")
        tr = for_group(group)
        if tr.rank < 0:
            return None
        p = tr.world_size
        shaped = isinstance(output, torch.Tensor) and isinstance(input, torch.Tensor) \
            and output.numel() == p * input.numel() and output.dtype == input.dtype
        c = decide(codec, input, min_bytes=min_bytes, transport=tr) if shaped else None
        if c is None:  # the exact gather, which also raises ccoll's TransportError for bad arguments
            return _exact_all_gather(output, input, group=group, codec=None, async_op=async_op)
        out, inp = output.detach(), input.detach()
        m = inp.numel()
        rdtype = c.feedback_dtype(inp.dtype)
        signature = (m, p, str(inp.dtype), str(inp.device), c.spec, tuple(tr.global_rank(i) for i in range(p)))
        with self._lock:
            entry = self._entries.get(key)
        if entry is None or entry.signature != signature or step - entry.seeded_step >= refresh_steps \
                or step < entry.seeded_step:
            return self._refresh(key, signature, output, input, group, rdtype, step, async_op)

        run = Run("all_gather", inp.device)
        side = run.stream
        recon = entry.recon
        with side.on_side():
            side.keep(inp, out, recon)  # recon: made on the caller's stream, updated on the side stream
            flat = inp.reshape(-1)
            # the delta is a new tensor: ``input`` may alias ``output`` (DeepSpeed's own slot), which is
            # written only after every payload has arrived
            delta = flat.to(rdtype) - recon.view(p, m)[tr.rank]
            payload = rows(1, c.encoded_nbytes(m, rdtype), inp.device)
            c.encode_rows(delta, payload, m, salt=salts(salt, tr, c)(OWN, 0))
            gathered = rows(p, payload.shape[1], inp.device)
            work = side.wrap(tr.all_gather(gathered, payload, async_op))

        def body() -> None:
            decoded = torch.empty(p * m, dtype=rdtype, device=inp.device)
            c.decode_rows(gathered, decoded, m)
            recon.add_(decoded)
            out.copy_(recon.view(out.shape))

        return run.compressed(async_op, [work], body, c, m * inp.element_size(), payload.numel(), [output],
                              name=f"wdelta/{c.spec}")

    def _refresh(self, key: Hashable, signature: tuple, output: torch.Tensor, input: torch.Tensor, group: Any,
                 rdtype: torch.dtype, step: int, async_op: bool) -> Handle | None:
        """Exact all-gather; its result (identical on every rank) seeds ``key``'s reconstruction."""
        with self._lock:
            self._entries.pop(key, None)  # a stale entry must not be used if this call fails midway
        inner = _exact_all_gather(output, input, group=group, codec=None, async_op=async_op)

        def seed() -> None:
            recon = output.detach().reshape(-1).to(rdtype, copy=True)
            with self._lock:
                self._entries[key] = _Entry(signature, recon, int(step))

        if async_op:
            # every wait() orders its thread's stream after the gather (the inner handle's own wait() does)
            return Handle([inner], seed, [output], join=inner.wait if inner is not None else None)
        seed()
        return None

    # --- state --------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every reconstruction: the next call of each key is an exact refresh."""
        with self._lock:
            self._entries.clear()

    def state_dict(self) -> dict:
        """``{"entries": [(key, signature, seeded_step, recon on CPU), ...]}`` (torch.save-able)."""
        with self._lock:
            return {"entries": [(k, e.signature, e.seeded_step, e.recon.detach().cpu().clone())
                                for k, e in self._entries.items()]}

    def load_state_dict(self, state: dict) -> None:
        """Replace every reconstruction by ``state``'s (made by :meth:`state_dict`), each on the device
        its signature names."""
        from .feedback import tuplify

        entries = {}
        for k, sig, seeded_step, recon in state["entries"]:
            sig = tuplify(sig)
            entries[tuplify(k)] = _Entry(sig, recon.to(torch.device(sig[3])).contiguous().clone(), int(seeded_step))
        with self._lock:
            self._entries = entries

    def keys(self) -> list:
        with self._lock:
            return list(self._entries)

    def reconstruction(self, key: Hashable) -> torch.Tensor | None:
        """``key``'s current reconstruction of the gathered tensor (1-D, feedback dtype), or None."""
        with self._lock:
            entry = self._entries.get(key)
        return None if entry is None else entry.recon

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __repr__(self) -> str:
        return f"<WeightDelta {len(self)} call sites>"
