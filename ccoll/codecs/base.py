"""The codec contract: tensor <-> fixed-size uint8 payload, identical bytes on every backend.

Why fixed size: a receiver can post its buffer from (numel, dtype) alone, so no collective ever needs a
size exchange, and all-to-all / all-gather chunks have equal length.

Non-finite input (NaN, +-Inf) is never turned into silent garbage: every lossy codec decodes a block
that held a non-finite value as NaN for the whole block (the block is the codec's unit: 4 or 16 values
for ZFP, ``block`` values for int8/int4). The non-finite value therefore propagates the way it would in
an uncompressed reduction, deterministically and identically on every rank, and overflow checks in the
training loop still see it. Finite input is never affected by this rule.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch

from ..errors import CodecError, PolicyError
from ..registry import Registry

BACKENDS = ("torch", "emulated", "cupy")

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@dataclasses.dataclass(frozen=True)
class Param:
    """One spec parameter: its type, default (None = required) and allowed values."""

    type: type
    default: Any = None
    choices: tuple | None = None
    doc: str = ""


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split "name:key=value,key=value" into (name, {key: value}); values stay strings."""
    if not isinstance(spec, str) or not spec.strip():
        raise PolicyError(f"codec spec must be a non-empty string, got {spec!r}")
    name, _, rest = spec.strip().partition(":")
    params: dict[str, str] = {}
    if rest:
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not eq or not key or not value:
                raise PolicyError(f"codec spec {spec!r}: expected key=value, got {item!r}")
            if key in params:
                raise PolicyError(f"codec spec {spec!r}: parameter {key!r} given twice")
            params[key] = value
    return name.strip(), params


def _convert(codec: str, key: str, p: Param, raw: Any) -> Any:
    try:
        if p.type is bool and isinstance(raw, str):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            value = raw.lower() in ("true", "1")
        elif p.type is int and isinstance(raw, str):
            value = int(raw, 0)
        else:
            value = p.type(raw)
    except (TypeError, ValueError):
        raise PolicyError(f"codec {codec!r}: parameter {key}={raw!r} is not a valid {p.type.__name__}") from None
    if p.choices is not None and value not in p.choices:
        raise PolicyError(
            f"codec {codec!r}: parameter {key}={raw!r} must be one of {', '.join(map(str, p.choices))}"
        )
    return value


class Codec:
    """Base class. Subclasses set ``name``, ``PARAMS``, capability flags, and implement
    ``encoded_nbytes`` plus ``_encode_<backend>`` / ``_decode_<backend>`` for the backends they have.

    Backends: "torch" (CPU tensors; libzfp via zfpy, vectorised torch ops), "cupy" (CUDA tensors,
    kernels/*.cu through CuPy), "emulated" (CPU tensors, the same kernels/*.cu built for the host).
    "auto" picks "cupy" for CUDA tensors and "torch" otherwise.
    """

    name: ClassVar[str] = ""
    PARAMS: ClassVar[dict[str, Param]] = {}
    #: decoded values may differ from the input (False only for exact codecs like "none")
    lossy: ClassVar[bool] = True
    #: input dtypes this codec accepts
    dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.bfloat16, torch.float16)

    def __init__(self, backend: str = "auto", **params: Any):
        if backend != "auto" and backend not in BACKENDS:
            raise PolicyError(f"unknown backend {backend!r}; available: auto, {', '.join(BACKENDS)}")
        self.backend = backend
        unknown = sorted(set(params) - set(self.PARAMS))
        if unknown:
            allowed = ", ".join(sorted(self.PARAMS)) or "none"
            raise PolicyError(f"codec {self.name!r}: unknown parameter(s) {', '.join(unknown)}; allowed: {allowed}")
        self.params: dict[str, Any] = {}
        for key, p in self.PARAMS.items():
            if key in params:
                self.params[key] = _convert(self.name, key, p, params[key])
            elif p.default is None:
                raise PolicyError(f"codec {self.name!r}: parameter {key!r} is required ({p.doc})")
            else:
                self.params[key] = p.default
        self._validate()

    # --- subclass hooks -------------------------------------------------------------------------
    def _validate(self) -> None:
        """Reject parameter combinations that can never work (raise PolicyError)."""

    def encoded_nbytes(self, numel: int, dtype: torch.dtype) -> int:
        raise NotImplementedError

    # --- public API -----------------------------------------------------------------------------
    @property
    def spec(self) -> str:
        """Canonical spec string: parsing it gives an equal codec."""
        if not self.params:
            return self.name
        return self.name + ":" + ",".join(f"{k}={_fmt(v)}" for k, v in self.params.items())

    def __repr__(self) -> str:
        return f"<Codec {self.spec} backend={self.backend}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Codec) and (self.spec, self.backend) == (other.spec, other.backend)

    def __hash__(self) -> int:
        return hash((self.spec, self.backend))

    def exact_for(self, dtype: torch.dtype) -> bool:
        """True when decode(encode(x)) == x bit for bit for every x of this dtype."""
        return not self.lossy

    def check_dtype(self, dtype: torch.dtype) -> None:
        if dtype not in self.dtypes:
            names = ", ".join(str(d).replace("torch.", "") for d in self.dtypes)
            raise CodecError(f"codec {self.spec!r} does not take {dtype}; it takes {names}")

    def resolve_backend(self, device: torch.device) -> str:
        if self.backend == "auto":
            return "cupy" if device.type == "cuda" else "torch"
        want_cuda = self.backend == "cupy"
        if want_cuda != (device.type == "cuda"):
            raise CodecError(
                f"codec {self.spec!r} backend {self.backend!r} cannot run on a {device.type} tensor"
            )
        return self.backend

    def _impl(self, op: str, backend: str):
        fn = getattr(self, f"_{op}_{backend}", None)
        if fn is None:
            have = [b for b in BACKENDS if hasattr(self, f"_{op}_{b}")]
            raise CodecError(f"codec {self.spec!r} has no {backend!r} backend; available: {', '.join(have)}")
        return fn

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Encode any-shape, possibly non-contiguous float tensor into a 1-D uint8 payload of exactly
        ``encoded_nbytes(x.numel(), x.dtype)`` bytes on ``x.device``. The payload may alias ``x``
        for exact codecs on contiguous input (zero copy)."""
        if not isinstance(x, torch.Tensor):
            raise CodecError(f"encode expects a torch.Tensor, got {type(x).__name__}")
        self.check_dtype(x.dtype)
        if x.numel() == 0:
            raise CodecError(f"codec {self.spec!r}: cannot encode an empty tensor")
        backend = self.resolve_backend(x.device)
        flat = x.reshape(-1)
        if not flat.is_contiguous():
            flat = flat.contiguous()
        payload = self._impl("encode", backend)(flat)
        expected = self.encoded_nbytes(x.numel(), x.dtype)
        assert payload.dtype == torch.uint8 and payload.numel() == expected, (payload.shape, expected)
        return payload

    def decode(
        self, payload: torch.Tensor, numel: int, dtype: torch.dtype, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Decode a payload made by ``encode`` of a tensor with ``numel`` elements of ``dtype``.
        Returns a 1-D tensor (or fills ``out``, any shape with ``numel`` elements, and returns it)."""
        self._check_payload(payload, numel, dtype)
        if out is not None:
            if out.numel() != numel or out.dtype != dtype or out.device != payload.device:
                raise CodecError(
                    f"decode out= must have {numel} elements of {dtype} on {payload.device}, "
                    f"got {out.numel()} of {out.dtype} on {out.device}"
                )
        backend = self.resolve_backend(payload.device)
        result = self._impl("decode", backend)(payload.contiguous(), numel, dtype)
        if out is None:
            return result
        out.copy_(result.view(out.shape) if out.is_contiguous() else result.reshape(out.shape))
        return out

    def decode_sum(self, payloads: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Sum in fp32 of the decodes of ``payloads`` (shape [p, encoded_nbytes]), rows added in order
        0..p-1. This is the reduce step of all_reduce; backends with a fused kernel override
        ``_decode_sum_<backend>``."""
        if payloads.dim() != 2:
            raise CodecError(f"decode_sum expects a [p, nbytes] payload tensor, got shape {tuple(payloads.shape)}")
        for row in payloads[:1]:
            self._check_payload(row, numel, dtype)
        backend = self.resolve_backend(payloads.device)
        fused = getattr(self, f"_decode_sum_{backend}", None)
        if fused is not None:
            return fused(payloads.contiguous(), numel, dtype)
        acc = torch.zeros(numel, dtype=torch.float32, device=payloads.device)
        for row in payloads:
            acc += self.decode(row, numel, dtype).to(torch.float32)
        return acc

    def _check_payload(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> None:
        if not isinstance(payload, torch.Tensor) or payload.dtype != torch.uint8:
            raise CodecError("payload must be a uint8 torch.Tensor")
        if numel <= 0:
            raise CodecError(f"codec {self.spec!r}: numel must be positive, got {numel}")
        self.check_dtype(dtype)
        expected = self.encoded_nbytes(numel, dtype)
        if payload.numel() != expected:
            raise CodecError(
                f"codec {self.spec!r}: payload has {payload.numel()} bytes, expected {expected} "
                f"for {numel} x {dtype}"
            )


def _fmt(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


CODECS: Registry[type[Codec]] = Registry("codec")


def get_codec(spec: "str | Codec", backend: str = "auto") -> Codec:
    """Build (or pass through) a codec from a spec such as "zfp:rate=8,dims=2" or "int8:block=256"."""
    if isinstance(spec, Codec):
        if backend in ("auto", spec.backend):
            return spec
        return type(spec)(backend=backend, **spec.params)
    name, params = parse_spec(spec)
    return CODECS.get(name)(backend=backend, **params)
