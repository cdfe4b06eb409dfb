"""Defaults shared by the policy layer and the collectives, defined once (no heavy imports here).

``DEFAULT_MIN_BYTES``: tensors with fewer bytes than this stay native unless a policy (``min_bytes:``) or
the caller (``min_bytes=``) says otherwise. It is the size below which compression cannot pay on any link
considered, from ``python -m ccoll.bench.overhead`` (per-call overhead of a compressed call over the
native one): compressing saves ``nbytes * (1 - 1/ratio) / link_rate`` of wire time and costs a fixed
host overhead per call, so it pays only above ``overhead * link_rate / (1 - 1/ratio)``. Every factor is
taken at its most favourable to compression:

- overhead: 50 us, ccoll's target for its host path per call, and about what the tool measures for it
  in process with the codec's time taken out (64 KiB all_reduce, quiet 2-core host: bf16 44 us, int8 52,
  int4 57; the codec itself is one kernel launch on a GPU but 30-220 us of torch ops on this CPU); on two
  gloo ranks exchange scheduling adds hundreds of microseconds (int4's own 57 us would give 8.3 KB below:
  the same default);
- link: 1 Gbit/s, the slowest considered (the saving per byte is largest on the slowest link; at
  400 Gbit/s a 4 KiB message is ~80 ns of wire, nothing to save against tens of microseconds);
- ratio: 7.1, int4:block=64 on fp32 (36 bytes per 64 values), the highest of the fixed-size codecs.

That gives 50e-6 * 125e6 / (1 - 1/7.1) = 7.3 KB, rounded up to 8 KiB (a tensor just under it could
save at most 6 us on that link in the best case). Policies raise it per dimension where a link is fast
enough that mid-sized tensors do not pay either; with the overheads measured today on gloo the break
even on 1 Gbit/s is 30-120 KB.
"""
from __future__ import annotations

DEFAULT_MIN_BYTES = 8192
