"""Defaults shared by the policy layer and the collectives, defined once (no heavy imports here).

``DEFAULT_MIN_BYTES``: tensors with fewer bytes than this stay native unless a policy (``min_bytes:``) or
the caller (``min_bytes=``) says otherwise. Below ~1024 fp32 values a collective is latency-bound: the
codec's fixed per-call cost (kernel launches, Python) cannot be paid back by the bytes it saves. Policies
raise it per dimension where a link is fast enough that mid-sized tensors do not pay either.
"""
from __future__ import annotations

DEFAULT_MIN_BYTES = 4096
