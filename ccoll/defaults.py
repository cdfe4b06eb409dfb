"""Defaults shared by the policy layer and the collectives, defined once (no heavy imports here).

``DEFAULT_MIN_BYTES``: tensors with fewer bytes than this stay native unless a policy (``min_bytes:``) or
the caller (``min_bytes=``) says otherwise. It is the size below which compression cannot pay on any link
considered, from ``python -m ccoll.bench.overhead`` (per-call overhead of a compressed call over the
native one): compressing saves ``nbytes * (1 - 1/ratio) / link_rate`` of wire time and costs a fixed
host overhead per call, so it pays only above ``overhead * link_rate / (1 - 1/ratio)``. Every factor is
taken at its most favourable to compression:

- overhead: 50 us, ccoll's target for its host path per call. Measured in process (64 KiB, quiet 2-core
  host, ``python -m ccoll.bench.overhead --ranks 0 --sim ''``): the call with the codec's arithmetic
  removed costs 26 us over native for all_reduce, 21 for all_gather, whatever the codec (``path_over``);
  a GPU adds its kernel launches to that (2-3 per call; unmeasured, no GPU here). On this CPU the codec is
  30-290 us of torch ops and leaves the rest of the call slower (``host_over_wall``: bf16 34, int8 51,
  int4 57 us). 26 us alone would give 3.8 KB below, 50 us 7.3 KB. A tensor just under 8 KiB saves at
  most 56 us of wire on that link, so at 26 us plus launches compressing 4-8 KiB could win only a few
  tens of microseconds per call, traded for precision: the default stays 8 KiB until a GPU measures
  the launches. On two gloo ranks exchange scheduling adds hundreds of microseconds;
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
