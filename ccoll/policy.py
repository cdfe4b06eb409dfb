"""Per-dimension compression policy: YAML -> validated, frozen rules -> ``Codec | None`` per call.

Why a policy layer: the right codec depends on what a collective carries (DP gradients tolerate int4 with
error feedback, TP activations need a light touch, an attention mask must stay exact), and that is known
from the parallel dimension, the op and the tensor's shape/dtype alone. Deciding from those alone is what
lets both sides of a send/recv reach the same decision without talking.

Schema (``version: 1``)::

    version: 1
    default:                # rules for every dimension not listed, and defaults for the listed ones
      codec: native
    dp:                     # one of: dp, tp, pp, ep, default
      codec: int4:block=64  # a codec spec (see ccoll.get_codec), "none" (ccoll's path, uncompressed)
                            # or "native" (torch.distributed's own call, untouched)
      error_feedback: true  # only meaningful for reducing ops (all_reduce, reduce_scatter)
      min_bytes: 64KiB      # tensors smaller than this stay native (int, or "<n>B/KiB/MiB/GiB")
      warmup_steps: 10      # optimizer steps (see below) before compression starts
      exclude:              # tensors that must stay exact: each entry matches when all its keys match
        - {dtype: float16, ndim: 4}
      ops:                  # per-op overrides; keys as above
        all_gather: {codec: bf16}
        # all_gather: {codec: int8:block=256, weight_delta: 100}   # weight changes; exact every 100 steps

``weight_delta: N`` (all_gather only; N >= 1 optimizer steps; 0 or false = off, the default): the codec
is applied to the change of the gathered tensor since its last gather (ZeRO-1/2 parameter all-gathers),
with an exact all-gather on the first call and at least every N steps; see :mod:`ccoll.wdelta`.

Each setting of (dimension, op) is looked up in this order: ``<dim>.ops.<op>``, ``<dim>``,
``default.ops.<op>``, ``default``, built-in default (codec native, min_bytes ``ccoll.defaults.DEFAULT_MIN_BYTES`` = 8 KiB (derived there), no error feedback,
no warm-up, nothing excluded). ``exclude`` lists are replaced, not merged, by a more specific level.

What a "step" is: one optimizer step. ``ccoll.patch`` counts them (by default with a global
``torch.optim`` step hook, or by explicit ``ccoll.patch.step()`` calls) and passes the count to
:meth:`Policy.resolve`. Every rank steps the same number of times, so during warm-up all ranks (both
sides of every send/recv) agree that a call stays native. Calls counted per (dim, op) would not: in a
pipeline, neighbouring stages make different numbers of p2p calls.

Version 2 (``version: 2``; every v1 file is also a valid v2 file and means the same) adds three rule
keys, set per dimension or per op like the others::

    version: 2
    dp:
      sizes:                # size buckets instead of one codec: the first bucket whose `below` (bytes,
        - {below: 1MiB, codec: native}          # exclusive) exceeds the tensor's nbytes applies;
        - {below: 32MiB, codec: int8:block=256} # `below` strictly increasing, the last bucket has none
        - {codec: int4:block=64}
      transport: mpi        # torch (default: the group's own backend) | mpi (an MPI communicator over the
                            # same ranks); collectives only, send_recv always goes through torch
      hierarchy: node       # all_reduce / reduce_scatter / all_gather: exact inside a node, compressed
                            # between nodes (see ccoll.hierarchy); none (default) = flat

``sizes`` and ``codec`` are one setting (the codec choice): a level may set one of them, and the most
specific level that sets either wins. ``min_bytes`` still applies first, and ``error_feedback`` applies
to the lossy buckets. A one-bucket list, or adjacent buckets with the same codec, normalise to the
simpler rule (same fingerprint). ``hierarchy`` set on a dimension applies to the three ops that have a
hierarchical form and is dropped for the others (setting it on another op is an error).

Why two transports in one job cannot deadlock: the transport of a call is a function of its rule,
i.e. of (dimension, op) -- never of the size, dtype or step -- and a process group maps to one
dimension on every member. So all members of a group send each (dim, op)'s calls through the same
transport, in their program order, and each transport sees on every member the same sequence of
calls of that group: every blocking call is matched. The two transports progress independently
(gloo/NCCL on their own threads, MPI inside its calls), so a call blocked on one never waits for
progress on the other. The codec depends on (dim, op, nbytes, dtype, shape, step) only, which both
sides know. The MPI communicator of a torch group is created once per group, at that group's first
``transport: mpi`` call, which every member makes at the same point of its program order
(``MPI_Comm_create_group``: collective over the group's members only).

Top-level ``attach: {ddp: true|false, fsdp: true|false}`` (both true when absent): whether DDP and FSDP2
models built while the patch is installed get ccoll's hooks (``ccoll.auto``); any other value is a
PolicyError. It enters the fingerprint only when something is off.

Never compressed whatever the policy says: non-floating tensors, dtypes the codec does not take,
single-element tensors (losses, norms, overflow flags) and tensors below ``min_bytes``. Reduce ops other
than SUM/AVG are kept native by the patch.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from typing import Any, Mapping

import torch

from .codecs import Codec, get_codec
from .defaults import DEFAULT_MIN_BYTES
from . import units
from .errors import CodecSpecError, PolicyError, UnitsError

VERSION = 1  # what a policy without v2 keys normalises to (so v1 fingerprints do not change)
VERSIONS = (1, 2)
#: the parallel dimensions a rule can name; "default" covers every other group
PARALLEL_DIMS = ("dp", "tp", "pp", "ep")
DIMENSIONS = PARALLEL_DIMS + ("default",)
#: a dense model's dimensions (no expert parallelism): the traffic model's and the convergence runs' tables
DENSE_DIMS = PARALLEL_DIMS[:3]
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")
REDUCING_OPS = ("all_reduce", "reduce_scatter")
NATIVE = "native"

RULE_KEYS = ("codec", "min_bytes", "error_feedback", "warmup_steps", "exclude", "sizes", "transport", "hierarchy",
             "weight_delta")
V2_KEYS = ("sizes", "transport", "hierarchy")
DIM_KEYS = RULE_KEYS + ("ops",)
EXCLUDE_KEYS = ("dtype", "ndim")
BUCKET_KEYS = ("below", "codec")
TRANSPORTS = ("torch", "mpi")
TRANSPORT_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
HIERARCHIES = ("node",)
HIERARCHY_OPS = ("all_reduce", "reduce_scatter", "all_gather")
#: top-level ``attach:`` keys: which models built while ccoll is installed get its hooks (ccoll.auto)
ATTACH_KEYS = ("ddp", "fsdp")

_UNDECIDED = object()  # not in Policy._decided (None is an answer: native)
_DECIDED_MAX = 4096  # distinct (dim, op, shape, dtype) answers kept per policy


DTYPES: dict[str, torch.dtype] = units.DTYPES
_DTYPE_NAMES = units.DTYPE_NAMES


@dataclasses.dataclass(frozen=True)
class Exclude:
    """Tensors matching every given field stay exact (native). ``None`` = any."""

    dtypes: tuple[str, ...] | None = None
    ndims: tuple[int, ...] | None = None

    def matches(self, ndim: int, dtype: torch.dtype) -> bool:
        if self.dtypes is not None and _DTYPE_NAMES.get(dtype) not in self.dtypes:
            return False
        return self.ndims is None or ndim in self.ndims

    def to_dict(self) -> dict:
        return {"dtype": list(self.dtypes) if self.dtypes else None, "ndim": list(self.ndims) if self.ndims else None}


@dataclasses.dataclass(frozen=True)
class Bucket:
    """One size bucket: tensors with ``nbytes < below`` (None: any size) not taken by an earlier bucket."""

    below: int | None
    codec: str  # canonical codec spec, or "native"
    codec_obj: Codec | None = dataclasses.field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict:
        return {"codec": self.codec} if self.below is None else {"below": self.below, "codec": self.codec}


@dataclasses.dataclass(frozen=True)
class Rule:
    """The effective setting of one (dimension, op)."""

    codec: str  # canonical codec spec, or "native"; with ``sizes``: the last (largest tensors') bucket's
    min_bytes: int
    error_feedback: bool
    warmup_steps: int
    exclude: tuple[Exclude, ...]
    #: all_gather only: refresh interval (optimizer steps) of weight-delta gathers, 0 = off (ccoll.wdelta)
    weight_delta: int = 0
    #: the built codec (None for native); built once at load so a bad spec fails at start
    codec_obj: Codec | None = dataclasses.field(default=None, compare=False, repr=False)
    #: size buckets (v2), ascending; empty: ``codec`` for every size
    sizes: tuple[Bucket, ...] = ()
    transport: str = "torch"  # "torch" | "mpi"
    hierarchy: str | None = None  # None (flat) | "node"
    #: some size may be compressed (the patch's cheap first test)
    compresses: bool = dataclasses.field(default=False, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        any_codec = any(b.codec_obj is not None for b in self.sizes) if self.sizes else self.codec_obj is not None
        object.__setattr__(self, "compresses", any_codec)

    def codec_for(self, nbytes: int) -> Codec | None:
        """The codec of this rule's size bucket for an ``nbytes`` tensor (min_bytes not applied)."""
        if not self.sizes:
            return self.codec_obj
        for b in self.sizes:
            if b.below is None or nbytes < b.below:
                return b.codec_obj
        return None  # unreachable: the last bucket has no bound

    def to_dict(self) -> dict:
        out = {
            "codec": self.codec, "min_bytes": self.min_bytes, "error_feedback": self.error_feedback,
            "warmup_steps": self.warmup_steps, "exclude": [e.to_dict() for e in self.exclude],
        }
        # v2 keys only when they change behaviour, so a v1 policy's normalised form (fingerprint) is unchanged
        if self.sizes:
            out["sizes"] = [b.to_dict() for b in self.sizes]
        if self.transport != "torch":
            out["transport"] = self.transport
        if self.hierarchy is not None:
            out["hierarchy"] = self.hierarchy
        if self.weight_delta:  # only when on: fingerprints of policies without it stay what they were
            out["weight_delta"] = self.weight_delta
        return out

    @property
    def v2(self) -> bool:
        return bool(self.sizes) or self.transport != "torch" or self.hierarchy is not None


_BUILTIN: dict[str, Any] = {"codec": NATIVE, "min_bytes": DEFAULT_MIN_BYTES, "error_feedback": False,
                            "warmup_steps": 0, "exclude": (), "sizes": None, "transport": "torch", "hierarchy": None,
                            "weight_delta": 0}


class Policy:
    """Frozen per-(dimension, op) rules. Build with :meth:`from_yaml` or :meth:`from_dict`."""

    def __init__(self, rules: Mapping[tuple[str, str], Rule], source: str, attach: Mapping[str, bool] | None = None):
        self._rules = dict(rules)
        self.source = source
        #: ``attach:`` -- {"ddp": bool, "fsdp": bool}: attach ccoll to DDP / FSDP2 models built while installed
        self.attach = {k: True for k in ATTACH_KEYS} | dict(attach or {})
        self._fingerprint = hashlib.sha256(
            json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
        #: (dim, op, shape, dtype) -> :meth:`resolve`'s answer for a dense (strided, unquantized) tensor past
        #: warm-up: the rules are frozen and the answer depends on nothing else, and a training run has few
        #: distinct shapes, while deciding afresh cost ~2 us of every compressed call
        self._decided: dict[tuple, Codec | None] = {}

    # --- construction -----------------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, path: "str | os.PathLike[str]") -> "Policy":
        """The policy in a YAML file, or a shipped one by bare name (``hybrid``): see :func:`find_policy`."""
        import yaml

        path = find_policy(path)
        try:
            with open(path) as f:
                data = yaml.safe_load(f)
        except OSError as e:
            raise PolicyError(f"policy {path}: cannot read ({e.strerror})") from None
        except yaml.YAMLError as e:
            raise PolicyError(f"policy {path}: not valid YAML: {e}") from None
        return cls.from_dict(data, source=path)

    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>") -> "Policy":
        return cls(_validate(data, source), source, attach=_parse_attach(source, data))

    # --- queries ----------------------------------------------------------------------------------
    @functools.cached_property
    def passthrough(self) -> frozenset[tuple[str, str]]:
        """The (dim, op) pairs whose every call is torch's own function: no codec at any size, torch's
        transport. The patch answers these with one set lookup, before any per-tensor decision."""
        return frozenset(k for k, r in self._rules.items() if not r.compresses and r.transport == "torch")

    def rule(self, dim: str, op: str) -> Rule:
        """Effective rule of (dim, op); unknown dimensions or ops raise PolicyError."""
        try:
            return self._rules[(dim, op)]
        except KeyError:
            if dim not in DIMENSIONS:
                raise PolicyError(f"policy {self.source}: unknown dimension {dim!r}; valid: {', '.join(DIMENSIONS)}") from None
            raise PolicyError(f"policy {self.source}: unknown op {op!r}; valid: {', '.join(OPS)}") from None

    def resolve(self, dim: str, op: str, tensor: "torch.Tensor | tuple", *, step: int | None = None) -> Codec | None:
        """The codec for this call, or None = leave it to torch.distributed.

        ``tensor``: the tensor this rank contributes (all_gather: its input chunk), or a
        ``(numel_or_shape, dtype)`` pair. ``step``: optimizer steps done so far (None: warm-up is over).
        The answer depends on (dim, op, shape, dtype, step) only, so both sides of a send/recv agree.

        The policy only *chooses*: the rule, its size bucket, warm-up, excludes, and single values
        (loss scalars, flags: never worth a codec call). Whether the chosen codec may take this tensor
        (dtype, layout, ``min_bytes``, ...) is :func:`ccoll.collectives.call.decide`'s answer, the
        same function the collectives apply, so the two can never disagree.
        """
        try:
            rule = self._rules[(dim, op)]
        except KeyError:
            rule = self.rule(dim, op)  # raises the PolicyError
        if not rule.compresses or (step is not None and step < rule.warmup_steps):
            return None
        dense = None
        if isinstance(tensor, torch.Tensor):
            if tensor.layout is torch.strided and not tensor.is_quantized:
                dense = (dim, op, tensor.shape, tensor.dtype)
                codec = self._decided.get(dense, _UNDECIDED)
                if codec is not _UNDECIDED:
                    return codec
            numel, dtype, ndim = tensor.numel(), tensor.dtype, tensor.dim()
        else:
            shape, dtype = tensor
            if isinstance(shape, int):
                numel, ndim = shape, 1
            else:
                numel, ndim = 1, len(shape)
                for s in shape:
                    numel *= int(s)
        codec = self._choose(rule, numel, dtype, ndim, tensor)
        if dense is not None and len(self._decided) < _DECIDED_MAX:
            self._decided[dense] = codec
        return codec

    @staticmethod
    def _choose(rule: Rule, numel: int, dtype: torch.dtype, ndim: int, tensor: Any) -> Codec | None:
        """:meth:`resolve` past its rule and warm-up checks (what it caches for dense tensors)."""
        if numel <= 1:
            return None
        codec = rule.codec_obj if not rule.sizes else rule.codec_for(numel * dtype.itemsize)
        if codec is None:
            return None
        for ex in rule.exclude:
            if ex.matches(ndim, dtype):
                return None
        from .collectives.call import decide

        return decide(codec, tensor if isinstance(tensor, torch.Tensor) else (numel, dtype), min_bytes=rule.min_bytes)

    def fingerprint(self) -> str:
        """sha256 (hex) of the normalised rules: equal for policies that behave the same, whatever the
        file's layout, comments or key order."""
        return self._fingerprint

    def to_dict(self) -> dict:
        """Normalised rules, {dim: {op: rule dict}}, every dimension and op spelled out."""
        out: dict = {"version": 2 if any(r.v2 for r in self._rules.values()) else VERSION}
        for (dim, op), rule in sorted(self._rules.items()):
            out.setdefault(dim, {})[op] = rule.to_dict()
        if not all(self.attach.values()):  # only when changed: other policies' fingerprints stay what they were
            out["attach"] = dict(self.attach)
        return out

    def describe(self) -> str:
        """One line per dimension: what each op does (for logs)."""
        lines = []
        for dim in DIMENSIONS:
            parts = []
            for op in OPS:
                r = self._rules[(dim, op)]
                ef = "+ef" if r.error_feedback else ""
                codec = "|".join(f"<{b.below}:{b.codec}" if b.below else b.codec for b in r.sizes) or r.codec
                extra = (f"@{r.transport}" if r.transport != "torch" else "") + (f"/{r.hierarchy}" if r.hierarchy else "")
                wd = f"+delta/{r.weight_delta}" if r.weight_delta else ""
                parts.append(f"{op}={codec}{ef}{wd}{extra}")
            lines.append(f"{dim}: " + " ".join(parts))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Policy {self.source} {self._fingerprint[:12]}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Policy) and self._fingerprint == other._fingerprint

    def __hash__(self) -> int:
        return hash(self._fingerprint)


# --- validation -------------------------------------------------------------------------------------
def _err(source: str, where: str, msg: str) -> PolicyError:
    return PolicyError(f"policy {source}: {where}: {msg}")


def _check_keys(source: str, where: str, mapping: Any, allowed: tuple[str, ...]) -> dict:
    if not isinstance(mapping, dict):
        raise _err(source, where, f"expected a mapping with keys from {', '.join(allowed)}, got {type(mapping).__name__}")
    unknown = [k for k in mapping if k not in allowed]
    if unknown:
        raise _err(source, where, f"unknown key(s) {', '.join(map(repr, unknown))}; valid: {', '.join(allowed)}")
    return mapping


def _parse_size(source: str, where: str, raw: Any, name: str = "min_bytes") -> int:
    if isinstance(raw, bool):
        raise _err(source, where, f"{name} must be a byte count, got {raw!r}")
    try:
        value = units.parse_nbytes(raw, strict=True)
    except UnitsError as e:
        raise _err(source, where, f"{name}={e}") from None
    if value < 0:
        raise _err(source, where, f"{name} must be >= 0, got {raw!r}")
    return value


def _parse_exclude(source: str, where: str, raw: Any) -> tuple[Exclude, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _err(source, where, "exclude must be a list of {dtype: ..., ndim: ...} entries")
    out = []
    for i, entry in enumerate(raw):
        w = f"{where}[{i}]"
        _check_keys(source, w, entry, EXCLUDE_KEYS)
        if not entry:
            raise _err(source, w, f"an exclude entry needs at least one of {', '.join(EXCLUDE_KEYS)}")
        dtypes = ndims = None
        if "dtype" in entry:
            names = entry["dtype"] if isinstance(entry["dtype"], list) else [entry["dtype"]]
            for n in names:
                if n not in DTYPES:
                    raise _err(source, f"{w}.dtype", f"unknown dtype {n!r}; valid: {', '.join(DTYPES)}")
            dtypes = tuple(sorted(set(names)))
        if "ndim" in entry:
            vals = entry["ndim"] if isinstance(entry["ndim"], list) else [entry["ndim"]]
            for v in vals:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise _err(source, f"{w}.ndim", f"ndim must be a non-negative integer, got {v!r}")
            ndims = tuple(sorted(set(vals)))
        out.append(Exclude(dtypes, ndims))
    return tuple(sorted(set(out), key=lambda e: json.dumps(e.to_dict(), sort_keys=True)))


def _parse_codec(source: str, where: str, spec: Any) -> Codec | None:
    if spec is None or spec == NATIVE:
        return None
    try:
        codec = get_codec(spec)
    except CodecSpecError as e:
        raise _err(source, where, f"{e} (or use 'native' to leave the op untouched)") from None
    if torch.float32 not in codec.dtypes:
        raise _err(source, where, f"codec {spec!r} does not take float32 tensors")
    return codec


def _parse_buckets(source: str, where: str, raw: Any) -> "Codec | None | tuple[Bucket, ...]":
    """A ``sizes:`` list -> ascending buckets, normalised: adjacent buckets with the same codec merge, and
    a single remaining bucket is just its codec (so it fingerprints like ``codec:``)."""
    if not isinstance(raw, list) or not raw:
        raise _err(source, where, "sizes must be a non-empty list of {below: <size>, codec: <spec>} entries, "
                                  "the last one without below")
    buckets: list[Bucket] = []
    prev = 0
    for i, entry in enumerate(raw):
        w = f"{where}[{i}]"
        _check_keys(source, w, entry, BUCKET_KEYS)
        if "codec" not in entry:
            raise _err(source, w, "a size bucket needs a codec (a codec spec or native)")
        last = i == len(raw) - 1
        if last and "below" in entry:
            raise _err(source, f"{w}.below", "the last size bucket takes every larger tensor: drop its below")
        if not last and "below" not in entry:
            raise _err(source, w, "only the last size bucket may omit below (the buckets after it could never apply)")
        below = None if last else _parse_size(source, f"{w}.below", entry["below"], "below")
        if below is not None and below <= prev:
            raise _err(source, f"{w}.below", f"below must increase from bucket to bucket: {below} after {prev}")
        prev = below if below is not None else prev
        codec = _parse_codec(source, f"{w}.codec", entry["codec"])
        spec = codec.spec if codec is not None else NATIVE
        if buckets and buckets[-1].codec == spec:
            buckets.pop()  # the previous bucket's range joins this one
        buckets.append(Bucket(below, spec, codec))
    if len(buckets) == 1:
        return buckets[0].codec_obj
    return tuple(buckets)


def _codecs(choice: "Codec | None | tuple[Bucket, ...]") -> list:
    """Every codec a codec choice (one codec, native, or size buckets) may pick."""
    return [b.codec_obj for b in choice] if isinstance(choice, tuple) else [choice]


def _parse_level(source: str, where: str, raw: dict, op: str | None, version: int = VERSION) -> dict[str, Any]:
    """Validate the rule keys of one level (a dimension or one of its ops); returns the keys it sets
    (``codec``: a Codec, None for native, or a tuple of size buckets)."""
    out: dict[str, Any] = {}
    if version < 2:
        v2 = [k for k in V2_KEYS if k in raw]
        if v2:
            raise _err(source, f"{where}.{v2[0]}", f"{v2[0]!r} needs 'version: 2' at the top of the policy")
    if "codec" in raw and "sizes" in raw:
        raise _err(source, where, "set either codec (one codec for every size) or sizes (size buckets), not both")
    if "codec" in raw:
        out["codec"] = _parse_codec(source, f"{where}.codec", raw["codec"])
    if "sizes" in raw:
        out["codec"] = _parse_buckets(source, f"{where}.sizes", raw["sizes"])
    if "transport" in raw:
        t = raw["transport"]
        if t not in TRANSPORTS:
            raise _err(source, f"{where}.transport", f"unknown transport {t!r}; valid: {', '.join(TRANSPORTS)}")
        if t != "torch" and op is not None and op not in TRANSPORT_OPS:
            raise _err(source, f"{where}.transport",
                       f"{op} always goes through torch; transport {t!r} is for {', '.join(TRANSPORT_OPS)}")
        out["transport"] = t
    if "hierarchy" in raw:
        h = raw["hierarchy"]
        h = None if h in (None, "none") else h
        if h is not None and h not in HIERARCHIES:
            raise _err(source, f"{where}.hierarchy", f"unknown hierarchy {h!r}; valid: none, {', '.join(HIERARCHIES)}")
        if h is not None and op is not None and op not in HIERARCHY_OPS:
            raise _err(source, f"{where}.hierarchy",
                       f"{op} has no hierarchical form; hierarchy is for {', '.join(HIERARCHY_OPS)}")
        out["hierarchy"] = h
    if "min_bytes" in raw:
        out["min_bytes"] = _parse_size(source, f"{where}.min_bytes", raw["min_bytes"])
    if "error_feedback" in raw:
        ef = raw["error_feedback"]
        if not isinstance(ef, bool):
            raise _err(source, f"{where}.error_feedback", f"must be true or false, got {ef!r}")
        if ef and op is not None and op not in REDUCING_OPS:
            raise _err(source, f"{where}.error_feedback",
                       f"error feedback needs a reducing op ({', '.join(REDUCING_OPS)}); {op} does not reduce")
        if ef and "codec" in out and not any(c is not None and c.lossy for c in _codecs(out["codec"])):
            name = "/".join(c.spec if c is not None else NATIVE for c in _codecs(out["codec"]))
            raise _err(source, f"{where}.error_feedback",
                       f"error feedback needs a lossy codec; codec {name!r} is exact, so there is no residual")
        out["error_feedback"] = ef
    if "warmup_steps" in raw:
        w = raw["warmup_steps"]
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise _err(source, f"{where}.warmup_steps", f"must be a non-negative integer (optimizer steps), got {w!r}")
        out["warmup_steps"] = w
    if "exclude" in raw:
        out["exclude"] = _parse_exclude(source, f"{where}.exclude", raw["exclude"])
    if "weight_delta" in raw:
        wd = raw["weight_delta"]
        if wd is False:
            wd = 0
        if isinstance(wd, bool) or not isinstance(wd, int) or wd < 0:
            raise _err(source, f"{where}.weight_delta",
                       f"must be the exact-refresh interval in optimizer steps (an integer >= 1; 0 or false = off), got {wd!r}")
        if wd and op is not None and op != "all_gather":
            raise _err(source, f"{where}.weight_delta", f"weight deltas apply to all_gather only, not {op}")
        if wd and "codec" in out and not any(c is not None and c.lossy for c in _codecs(out["codec"])):
            name = "/".join(c.spec if c is not None else NATIVE for c in _codecs(out["codec"]))
            raise _err(source, f"{where}.weight_delta",
                       f"weight deltas need a lossy codec; codec {name!r} sends the weights exactly anyway")
        out["weight_delta"] = wd
    return out


def _validate(data: Any, source: str) -> dict[tuple[str, str], Rule]:
    if data is None:
        raise _err(source, "top level", "empty policy; at least 'version: 1' is required")
    _check_keys(source, "top level", data, ("version", "attach") + DIMENSIONS)
    version = data.get("version")
    if isinstance(version, bool) or version not in VERSIONS:
        raise _err(source, "version", f"expected 'version: 1' or 'version: 2', got {version!r}")
    levels: dict[tuple[str, str | None], dict[str, Any]] = {}
    for dim in DIMENSIONS:
        raw = data.get(dim)
        if raw is None:
            continue
        _check_keys(source, dim, raw, DIM_KEYS)
        levels[(dim, None)] = _parse_level(source, dim, raw, None, version)
        ops = raw.get("ops") or {}
        _check_keys(source, f"{dim}.ops", ops, OPS)
        for op, op_raw in ops.items():
            _check_keys(source, f"{dim}.ops.{op}", op_raw or {}, RULE_KEYS)
            levels[(dim, op)] = _parse_level(source, f"{dim}.ops.{op}", op_raw or {}, op, version)

    rules: dict[tuple[str, str], Rule] = {}
    for dim in DIMENSIONS:
        for op in OPS:
            chain = [levels.get((dim, op), {}), levels.get((dim, None), {}),
                     levels.get(("default", op), {}), levels.get(("default", None), {})]
            eff: dict[str, Any] = {}
            for key in RULE_KEYS:
                eff[key] = next((lvl[key] for lvl in chain if key in lvl), _BUILTIN[key])
            sizes = eff["codec"] if isinstance(eff["codec"], tuple) else ()
            codec = sizes[-1].codec_obj if sizes else eff["codec"] if isinstance(eff["codec"], Codec) else None
            # error feedback only exists for reducing ops with a lossy codec; normalise it away elsewhere
            lossy = any(c is not None and c.lossy for c in _codecs(sizes or codec))
            ef = bool(eff["error_feedback"]) and op in REDUCING_OPS and lossy
            # weight deltas only exist for all_gather with a lossy codec (a dim-level key means its all_gather)
            wd = eff["weight_delta"] if op == "all_gather" and lossy else 0
            rules[(dim, op)] = Rule(
                codec=codec.spec if codec is not None else NATIVE,
                min_bytes=eff["min_bytes"], error_feedback=ef, warmup_steps=eff["warmup_steps"],
                exclude=tuple(eff["exclude"]), weight_delta=wd, codec_obj=codec, sizes=sizes,
                # set on a dimension, these apply to the ops that have them (like error_feedback)
                transport=eff["transport"] if op in TRANSPORT_OPS else "torch",
                hierarchy=eff["hierarchy"] if op in HIERARCHY_OPS else None,
            )
    return rules


def _parse_attach(source: str, data: Any) -> dict[str, bool]:
    """``attach: {ddp: true|false, fsdp: true|false}`` (both true when absent)."""
    raw = data.get("attach") if isinstance(data, dict) else None
    if raw is None:
        return {k: True for k in ATTACH_KEYS}
    _check_keys(source, "attach", raw, ATTACH_KEYS)
    for key, value in raw.items():
        if not isinstance(value, bool):
            raise _err(source, f"attach.{key}", f"expected true or false, got {value!r}")
    return {k: raw.get(k, True) for k in ATTACH_KEYS}


def find_policy(spec: "str | os.PathLike[str]") -> str:
    """The absolute path of the policy file ``spec`` names: an existing file as it is; else a shipped policy by
    bare name (``hybrid`` or ``hybrid.yaml``: ``configs/hybrid.yaml`` as installed with the package, found
    through ``ccoll.resources``), also when written as the checkout spells it (``configs/hybrid.yaml``) from a
    directory that has no such file. Why: ``CCOLL_POLICY=hybrid`` must work for a pip-installed ccoll, whose
    configs live inside site-packages where nobody should have to look them up. PolicyError naming the
    shipped policies otherwise."""
    from . import resources

    path = os.fspath(spec)
    if os.path.isfile(path):
        return os.path.abspath(path)
    head, tail = os.path.split(path)
    if head in ("", "configs"):
        stem = tail[:-5] if tail.endswith(".yaml") else tail[:-4] if tail.endswith(".yml") else tail
        shipped = resources.shipped_policies().get(stem)
        if stem and shipped is not None:
            return str(shipped)
    names = ", ".join(resources.shipped_policies()) or "none found"
    raise PolicyError(f"policy {path}: cannot read (no such file), and it is not a shipped policy name; shipped "
                      f"policies ({resources.config_dir()}): {names}")


def load(policy: "Policy | str | os.PathLike[str] | Mapping") -> Policy:
    """Accept a Policy, a YAML path or shipped policy name (:func:`find_policy`), or a dict (for APIs that take
    any of them)."""
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, Mapping):
        return Policy.from_dict(dict(policy))
    if isinstance(policy, (str, os.PathLike)):
        return Policy.from_yaml(policy)
    raise PolicyError(f"expected a Policy, a YAML path or a dict, got {type(policy).__name__}")
