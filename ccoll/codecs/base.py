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

import contextlib
import dataclasses
import functools
import threading
import time
from typing import Any, ClassVar

import torch

from .. import stats as _stats
from ..errors import CodecError, CodecSpecError
from ..registry import Registry
from .buffers import new_buffer

BACKENDS = ("torch", "emulated", "cupy", "simt")


#: the backends that run kernels/*.cu (host build, GPU): their paths differ only in the launcher
KERNEL_BACKENDS = ("emulated", "cupy")


def per_backend(impl: str, ops: tuple[str, ...], backends: tuple[str, ...] = KERNEL_BACKENDS):
    """Class decorator: ``_<op>_<backend>`` = ``_<op>_<impl>(backend, ...)`` for each op and backend, so a
    codec writes a path once with the backend as its parameter (the launch point picks the launcher)."""
    def bind(cls):
        for op in ops:
            for backend in backends:
                setattr(cls, f"_{op}_{backend}", functools.partialmethod(getattr(cls, f"_{op}_{impl}"), backend))
        return cls

    return bind


class _OnSimt:
    """``_<op>_simt``: the codec's own ``_<op>_cupy`` (its launch geometry and arguments, unchanged) with this
    thread's kernel launches routed to ccoll.simt, which runs the ``__global__`` kernels on CPU threads (the
    "simt" backend, for CI without a GPU). Absent (AttributeError) where the codec has no cupy path."""

    def __set_name__(self, owner, name: str) -> None:
        self.cupy = name[: -len("simt")] + "cupy"

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        fn = getattr(obj, self.cupy)

        def on_simt(*args):
            from ..kernels.call import cupy_on_simt

            with cupy_on_simt():
                return fn(*args)

        return on_simt


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
        raise CodecSpecError(f"codec spec must be a non-empty string, got {spec!r}")
    name, _, rest = spec.strip().partition(":")
    params: dict[str, str] = {}
    if rest:
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not eq or not key or not value:
                raise CodecSpecError(f"codec spec {spec!r}: expected key=value, got {item!r}")
            if key in params:
                raise CodecSpecError(f"codec spec {spec!r}: parameter {key!r} given twice")
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
        raise CodecSpecError(f"codec {codec!r}: parameter {key}={raw!r} is not a valid {p.type.__name__}") from None
    if p.choices is not None and value not in p.choices:
        raise CodecSpecError(
            f"codec {codec!r}: parameter {key}={raw!r} must be one of {', '.join(map(str, p.choices))}"
        )
    return value


class Codec:
    """Base class. Subclasses set ``name``, ``PARAMS``, capability flags, and implement
    ``encoded_nbytes`` plus ``_encode_<backend>`` / ``_decode_<backend>`` for the backends they have.

    Backends: "torch" (CPU tensors; libzfp via zfpy, vectorised torch ops), "cupy" (CUDA tensors,
    kernels/*.cu through CuPy), "emulated" (CPU tensors, the same kernels/*.cu built for the host), "simt"
    (CPU tensors, the cupy path's own launches of the ``__global__`` kernels run by ccoll.simt; a test backend).
    "auto" picks "cupy" for CUDA tensors and, for CPU tensors, the codec's ``_cpu_backend()``: "torch" unless
    the codec has a faster CPU path that writes the same bytes (the block quantizers: the host build, when
    it is built). ``CCOLL_CPU_BACKEND=torch`` (or ``emulated``) overrides that choice for the codecs that
    have both.
    """

    name: ClassVar[str] = ""
    PARAMS: ClassVar[dict[str, Param]] = {}
    _encode_simt, _decode_simt = _OnSimt(), _OnSimt()
    _encode_rows_simt, _decode_rows_simt, _decode_sum_simt = _OnSimt(), _OnSimt(), _OnSimt()
    #: decoded values may differ from the input (False only for exact codecs like "none")
    lossy: ClassVar[bool] = True
    #: payloads use a per-row number of bytes up to ``encoded_nbytes`` (a capacity), read back with
    #: ``used_nbytes(rows)``; collectives then move only the used bytes (ccoll/collectives/varsize.py)
    variable_size: ClassVar[bool] = False
    #: the payload carries the values' float bits as they are (casts, lossless), NaN payload bits included.
    #: IEEE 754 leaves a NaN's payload to the implementation and torch's kernels differ (a float32 NaN
    #: narrowed to bf16 is 0xffff on its AVX-512 path, 0x7fc0 on the scalar one, another pattern on CUDA),
    #: so such a payload's NaN bits are not part of the contract: replicas on one kind of device agree,
    #: machines need not. The GPU check (ccoll.gpucheck.expected) compares these codecs' payloads of
    #: non-finite inputs decoded, NaN as NaN; every other case byte for byte.
    float_bits_on_wire: ClassVar[bool] = False
    #: input dtypes this codec accepts
    dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.bfloat16, torch.float16)
    #: specs covering this codec's parameter space (see :meth:`example_specs`)
    EXAMPLE_SPECS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, backend: str = "auto", **params: Any):
        if backend != "auto" and backend not in BACKENDS:
            raise CodecSpecError(f"unknown backend {backend!r}; available: auto, {', '.join(BACKENDS)}")
        self.backend = backend
        unknown = sorted(set(params) - set(self.PARAMS))
        if unknown:
            allowed = ", ".join(sorted(self.PARAMS)) or "none"
            raise CodecSpecError(f"codec {self.name!r}: unknown parameter(s) {', '.join(unknown)}; allowed: {allowed}")
        self.params: dict[str, Any] = {}
        for key, p in self.PARAMS.items():
            if key in params:
                self.params[key] = _convert(self.name, key, p, params[key])
            elif p.default is None:
                raise CodecSpecError(f"codec {self.name!r}: parameter {key!r} is required ({p.doc})")
            else:
                self.params[key] = p.default
        self._validate()
        self._nbytes_memo: dict[tuple[int, torch.dtype], int] = {}

    # --- subclass hooks -------------------------------------------------------------------------
    def _validate(self) -> None:
        """Reject parameter combinations that can never work (raise CodecSpecError)."""

    def _check_block(self, multiple: int, max_block: int, examples: str) -> None:
        """The ``block`` parameter of block codecs: a multiple of ``multiple`` in [multiple, max_block]
        (the kernels' thread mapping and payload alignment rest on it)."""
        block = self.params["block"]
        if block < multiple or block > max_block or block % multiple:
            raise CodecSpecError(
                f"codec {self.name!r}: block={block} is invalid; block must be a multiple of {multiple} between "
                f"{multiple} and {max_block} (e.g. {examples})"
            )

    def encoded_nbytes(self, numel: int, dtype: torch.dtype) -> int:
        raise NotImplementedError

    #: (numel, dtype) answers :meth:`payload_nbytes` keeps per codec; a training run asks for few sizes
    _NBYTES_MEMO_MAX = 4096

    def payload_nbytes(self, numel: int, dtype: torch.dtype) -> int:
        """``encoded_nbytes(numel, dtype)``, memoised: what the collectives and the batched calls' checks
        ask. Why: a compressed call asks it three times (its send buffer, then encode_rows' and the
        decode's size checks), each a fresh computation of the layout (~0.5 us, a few percent of a small
        message's host path), and the answer never changes (the parameters are fixed after construction).
        Only answers are kept: a (numel, dtype) that ``encoded_nbytes`` rejects raises every time."""
        key = (numel, dtype)
        nbytes = self._nbytes_memo.get(key)
        if nbytes is None:
            nbytes = self.encoded_nbytes(numel, dtype)
            if len(self._nbytes_memo) < self._NBYTES_MEMO_MAX:
                self._nbytes_memo[key] = nbytes
        return nbytes

    # --- public API -----------------------------------------------------------------------------
    @property
    def spec(self) -> str:
        """Canonical spec string: parsing it gives an equal codec. Made once per codec: the parameters are
        fixed after construction, and every compressed call reads the spec (its stats row), where
        formatting it again cost a few microseconds of a small message's host path."""
        try:
            return self._spec
        except AttributeError:
            self._spec: str = self._spec_text()
            return self._spec

    def _spec_text(self) -> str:
        """The spec, formatted (a codec whose spec omits parameters overrides this)."""
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

    # --- what callers may know about a codec without reading its parameters ----------------------
    # Tests, benchmarks and tools enumerate codecs with ``example_specs()`` and check them against
    # ``error_bound`` / ``deterministic`` / ``fixed_size``: a new codec enters every check by declaring
    # these, and no caller hard-codes a codec's name, parameters or error.

    @classmethod
    def example_specs(cls) -> tuple[str, ...]:
        """Specs covering this codec's parameter space (its block sizes, rounding modes, formats,
        rotations, rates, dimensions): the specs checks and benchmarks run it with."""
        return cls.EXAMPLE_SPECS or (cls.name,)

    @property
    def deterministic(self) -> bool:
        """True when a payload equals ``encode(x)`` byte for byte wherever and whenever it is made;
        False for stochastic rounding, which collectives salt per call and rank (only the error bound
        holds then)."""
        return True

    @property
    def fixed_size(self) -> bool:
        """True when every payload is exactly ``encoded_nbytes`` bytes (no size exchange needed)."""
        return not self.variable_size

    def relative_error_bound(self, dtype: torch.dtype = torch.float32) -> float | None:
        """A data-independent bound of one round trip's absolute error per element, as a fraction of the
        absmax of the encoded values (0.0 for exact codecs), before the decode is rounded to a bf16/fp16
        output; None where the codec has no such bound. Each codec derives it from its math (docstrings)."""
        return 0.0 if self.exact_for(dtype) else None

    def error_bound(self, x: torch.Tensor) -> float:
        """Max |decode(encode(c)) - c| per element, for ``c`` = ``x`` or any chunk of it encoded alone
        (collectives encode chunks of a tensor), as the codec's documented bound; the decode is taken
        before its rounding to a bf16/fp16 output (callers that decode to such a dtype add that
        rounding). Default: ``relative_error_bound(x.dtype) * absmax(x)``; codecs with an absolute floor
        (subnormal steps) or a data-dependent bound override it. inf: no bound (e.g. overflow)."""
        rel = self.relative_error_bound(x.dtype)
        if rel is None:
            raise NotImplementedError(f"codec {self.spec!r} declares no error bound")
        return rel * _absmax(x) if rel else 0.0

    def check_dtype(self, dtype: torch.dtype) -> None:
        if dtype not in self.dtypes:
            names = ", ".join(str(d).replace("torch.", "") for d in self.dtypes)
            raise CodecError(f"codec {self.spec!r} does not take {dtype}; it takes {names}")

    def _cpu_backend(self) -> str:
        """The backend "auto" runs on CPU tensors; codecs with a faster CPU path of the same bytes override."""
        return "torch"

    def resolve_backend(self, device: torch.device) -> str:
        if self.backend == "auto":
            return "cupy" if device.type == "cuda" else self._cpu_backend()
        want_cuda = self.backend == "cupy"
        if want_cuda != (device.type == "cuda"):
            raise CodecError(
                f"codec {self.spec!r} backend {self.backend!r} cannot run on a {device.type} tensor"
            )
        return self.backend

    def _impl(self, op: str, backend: str):
        """The backend's ``_<op>_rows_<backend>`` (the batched hook every codec implements) or, for codecs
        whose plain form is cheaper (a zero-copy view), ``_<op>_<backend>``."""
        fn = getattr(self, f"_{op}_rows_{backend}", None) or getattr(self, f"_{op}_{backend}", None)
        if fn is None:
            have = [b for b in BACKENDS if hasattr(self, f"_{op}_rows_{b}") or hasattr(self, f"_{op}_{b}")]
            raise CodecError(f"codec {self.spec!r} has no {backend!r} backend; available: {', '.join(have)}")
        return fn

    # --- one tensor = one row: written once here, from the batched hooks ---------------------------
    def _encode_one(self, flat: torch.Tensor, backend: str) -> torch.Tensor:
        """Encode a contiguous 1-D tensor: the codec's own ``_encode_<backend>`` when it has one, else
        ``_encode_rows_<backend>`` with one row into a fresh [1, nbytes] payload."""
        own = getattr(self, f"_encode_{backend}", None)
        if own is not None:
            return own(flat)
        rows = self._impl("encode", backend)
        out = new_buffer(self.encoded_nbytes(flat.numel(), flat.dtype), torch.uint8, flat.device)
        rows(flat, out.view(1, -1), flat.numel(), None, 0)
        return out

    def _decode_one(self, payload: torch.Tensor, numel: int, dtype: torch.dtype, backend: str) -> torch.Tensor:
        """Decode one payload: the codec's own ``_decode_<backend>`` when it has one, else
        ``_decode_rows_<backend>`` with one row into a fresh tensor."""
        own = getattr(self, f"_decode_{backend}", None)
        if own is not None:
            return own(payload, numel, dtype)
        rows = self._impl("decode", backend)
        out = new_buffer(numel, dtype, payload.device)
        rows(payload.view(1, -1), out, numel)
        return out

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
        payload = self._encode_one(flat, backend)
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
        if out is not None and out.is_contiguous() and hasattr(self, f"_decode_rows_{backend}"):
            # straight into the caller's memory (one row), no decode-then-copy
            self.decode_rows(payload.contiguous().view(1, -1), out.view(-1), numel)
            return out
        result = self._decode_one(payload.contiguous(), numel, dtype, backend)
        if out is None:
            return result
        out.copy_(result.view(out.shape) if out.is_contiguous() else result.reshape(out.shape))
        return out

    def decode_sum(
        self, payloads: torch.Tensor, numel: int, dtype: torch.dtype, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Sum in fp32 of the decodes of ``payloads`` (shape [p, encoded_nbytes]), each row's decode
        rounded to ``dtype`` first (as ``decode`` returns it), rows added in order 0..p-1. This is the
        reduce step of all_reduce / reduce_scatter; backends fuse it (``_decode_sum_<backend>(payloads,
        numel, dtype, out)``, one launch). ``out``: a contiguous fp32 tensor of ``numel`` elements to
        write into (allocated when None). Returns it."""
        if payloads.dim() != 2:
            raise CodecError(f"decode_sum expects a [p, nbytes] payload tensor, got shape {tuple(payloads.shape)}")
        p, row_nbytes = payloads.shape
        device = payloads.device
        if p:  # every row has row 0's size: checked from the shape, no row view made
            self._check_payload_size(payloads, row_nbytes, numel, dtype)
        if out is None:
            out = torch.empty(numel, dtype=torch.float32, device=device)
        elif out.numel() != numel or out.dtype != torch.float32 or not out.is_contiguous() or out.device != device:
            raise CodecError(f"decode_sum out= must be a contiguous fp32 tensor of {numel} elements on {device}")
        backend = self.resolve_backend(device)
        with _host_clock(self.name, "decode_sum", p * numel * dtype.itemsize, device):
            fused = getattr(self, f"_decode_sum_{backend}", None)
            if fused is not None:
                fused(payloads.contiguous(), numel, dtype, out if out.dim() == 1 else out.view(-1))
            else:
                out.zero_()
                for row in payloads:
                    out += self.decode(row, numel, dtype).to(torch.float32)
        return out

    # --- batched API: the only codec calls the collectives make -----------------------------------
    # Why batched: a collective on p ranks encodes p chunks and decodes p payloads per phase. Done one
    # chunk at a time that is O(p) kernel launches (or torch ops) per phase, host-bound at p = 256.
    # Each method below is ONE kernel launch (cupy, emulated) / one vectorised pass (torch) whatever
    # the number of rows, and writes straight into the caller's buffer. Backends specialise them as
    # ``_encode_rows_<backend>`` / ``_decode_rows_<backend>`` / ``_decode_sum_<backend>``; the generic
    # versions here are the reference semantics (a loop over rows) the specialisations must match
    # byte for byte.

    @property
    def align_numel(self) -> int:
        """Row lengths that are multiples of this never put padding inside a row (quant: ``block``;
        zfp: 4^dims; casts: 1). Collectives size per-rank chunks with it and never read codec
        parameters themselves."""
        return 1

    def feedback_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """dtype of error-feedback residuals for inputs of ``dtype`` (fp32; fp64 for fp64 input)."""
        return torch.float64 if dtype == torch.float64 else torch.float32

    def encode_rows(
        self, src: torch.Tensor, out: torch.Tensor, row_numel: int, *,
        feedback: torch.Tensor | None = None, salt: int = 0,
    ) -> torch.Tensor:
        """Encode row i = ``src[i*row_numel : (i+1)*row_numel]`` (1-D contiguous ``src``; elements past
        its end are zeros, so trailing rows may be partly or wholly padding) into ``out[i]``, where
        ``out`` is a [rows, encoded_nbytes(row_numel, src.dtype)] uint8 tensor on ``src.device``.
        Returns ``out``.

        ``feedback``: error feedback, a contiguous ``feedback_dtype(src.dtype)`` tensor of
        ``rows * row_numel`` residuals updated in place: for each valid element,
        ``c = src + feedback`` (in the feedback dtype) is rounded to ``src.dtype`` and encoded, and
        ``feedback = c - decode(payload)`` (the decode the receivers see, rounded to ``src.dtype``);
        non-finite residuals become 0 (an overflowing step must not poison later ones) and residuals
        of padding stay 0.

        ``salt``: a per-call value the caller derives from (step, call key, rank); stochastic codecs
        mix it into their seed (the stochastic index of element j of row i is i*row_numel + j) so
        errors decorrelate across calls and ranks; deterministic codecs ignore it. It never travels:
        decoding does not need it."""
        numel, dtype, device = src.numel(), src.dtype, src.device  # read once: each read is a call into torch
        rows = self._check_rows(out, numel, row_numel, dtype, "encode_rows")
        if not src.is_contiguous() or src.dim() != 1:
            raise CodecError("encode_rows: src must be a contiguous 1-D tensor")
        if feedback is not None and (
            feedback.numel() != rows * row_numel or feedback.dtype != self.feedback_dtype(dtype)
            or not feedback.is_contiguous() or feedback.device != device
        ):
            raise CodecError(
                f"encode_rows: feedback must be a contiguous {self.feedback_dtype(dtype)} tensor of "
                f"{rows * row_numel} elements on {device}, got {feedback.numel()} x {feedback.dtype}"
            )
        backend = self.resolve_backend(device)
        with _host_clock(self.name, "encode", numel * dtype.itemsize, device):
            fn = getattr(self, f"_encode_rows_{backend}", None)
            if fn is not None:
                fn(src, out, row_numel, feedback, salt)
            else:
                self._encode_rows_generic(src, out, row_numel, feedback, salt)
        return out

    def decode_rows(self, payloads: torch.Tensor, out: torch.Tensor, row_numel: int) -> torch.Tensor:
        """Decode row i of ``payloads`` ([rows, encoded_nbytes(row_numel, out.dtype)]) into
        ``out[i*row_numel : (i+1)*row_numel]``, clipped at the end of ``out`` (a contiguous 1-D tensor
        of at most rows * row_numel elements; rows wholly past its end are not decoded). Returns ``out``."""
        numel, dtype, device = out.numel(), out.dtype, out.device
        self._check_rows(payloads, numel, row_numel, dtype, "decode_rows")
        if not out.is_contiguous() or out.dim() != 1:
            raise CodecError("decode_rows: out must be a contiguous 1-D tensor")
        backend = self.resolve_backend(device)
        with _host_clock(self.name, "decode", numel * dtype.itemsize, device):
            fn = getattr(self, f"_decode_rows_{backend}", None)
            if fn is not None:
                fn(payloads, out, row_numel)
            else:
                self._decode_rows_generic(payloads, out, row_numel)
        return out

    def _check_rows(self, rows2d: torch.Tensor, numel: int, row_numel: int, dtype: torch.dtype, what: str) -> int:
        if not isinstance(rows2d, torch.Tensor) or rows2d.dtype != torch.uint8 or rows2d.dim() != 2:
            raise CodecError(f"{what}: payloads must be a [rows, nbytes] uint8 tensor")
        self.check_dtype(dtype)
        rows, row_nbytes = rows2d.shape
        if row_numel <= 0 or numel <= 0 or numel > rows * row_numel:
            raise CodecError(f"{what}: {numel} elements do not fit {rows} rows of {row_numel}")
        nbytes = self.payload_nbytes(row_numel, dtype)
        if row_nbytes != nbytes or rows2d.stride() != (nbytes, 1):
            raise CodecError(
                f"codec {self.spec!r} {what}: rows must be contiguous [{rows}, {nbytes}] for "
                f"{row_numel} x {dtype}, got shape {tuple(rows2d.shape)} strides {rows2d.stride()}"
            )
        return rows

    def _salted(self, salt: int) -> "Codec":
        """The codec that encodes one call with ``salt`` (stochastic codecs override)."""
        return self

    def _encode_row_at(self, x: torch.Tensor, index0: int) -> torch.Tensor:
        """Encode one padded row whose first element has global index ``index0`` (the index stochastic
        rounding draws for; deterministic codecs ignore it)."""
        return self._encode_one(x, self.resolve_backend(x.device))

    def _encode_rows_generic(self, src, out, row_numel, feedback, salt) -> None:
        enc = self._salted(salt)
        n = src.numel()
        for i in range(out.shape[0]):
            lo, hi = i * row_numel, min((i + 1) * row_numel, n)
            x = torch.zeros(row_numel, dtype=src.dtype, device=src.device)
            if hi > lo:
                x[: hi - lo] = src[lo:hi]
            if feedback is None:
                out[i].copy_(enc._encode_row_at(x, i * row_numel))
                continue
            r = feedback[i * row_numel:(i + 1) * row_numel]
            comp = x.to(r.dtype) + r
            sent = comp.to(src.dtype)
            out[i].copy_(enc._encode_row_at(sent, i * row_numel))
            res = comp - self.decode(out[i], row_numel, src.dtype).to(r.dtype)
            res = torch.where(torch.isfinite(res), res, torch.zeros((), dtype=r.dtype, device=r.device))
            if hi - lo < row_numel:
                res[max(hi - lo, 0):] = 0
            r.copy_(res)

    def _decode_rows_generic(self, payloads, out, row_numel) -> None:
        n = out.numel()
        for i in range(payloads.shape[0]):
            lo, hi = i * row_numel, min((i + 1) * row_numel, n)
            if hi <= lo:
                break
            y = self._decode_one(payloads[i], row_numel, out.dtype, self.resolve_backend(out.device))
            out[lo:hi].copy_(y[: hi - lo])

    def _check_payload(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> None:
        """One payload (all its bytes) standing for ``numel`` x ``dtype``."""
        nbytes = payload.numel() if isinstance(payload, torch.Tensor) else None  # a non-tensor fails the first check
        self._check_payload_size(payload, nbytes, numel, dtype)

    def _check_payload_size(self, payload: torch.Tensor, nbytes: int | None, numel: int, dtype: torch.dtype) -> None:
        """The checks of one payload of ``nbytes`` bytes (a 1-D payload's numel, or the row length of
        [rows, nbytes] payloads, checked once for all rows) standing for ``numel`` x ``dtype``."""
        if not isinstance(payload, torch.Tensor) or payload.dtype != torch.uint8:
            raise CodecError("payload must be a uint8 torch.Tensor")
        if numel <= 0:
            raise CodecError(f"codec {self.spec!r}: numel must be positive, got {numel}")
        self.check_dtype(dtype)
        expected = self.payload_nbytes(numel, dtype)
        if nbytes != expected:
            raise CodecError(
                f"codec {self.spec!r}: payload has {nbytes} bytes, expected {expected} "
                f"for {numel} x {dtype}"
            )


class _HostClock:
    """Times one batched codec call into ccoll.stats.codec_stats (see :func:`_host_clock`)."""

    busy = threading.local()
    __slots__ = ("name", "phase", "nbytes", "t0")

    def __init__(self, name: str, phase: str, nbytes: int):
        self.name, self.phase, self.nbytes = name, phase, nbytes

    def __enter__(self) -> None:
        self.busy.on = True
        self.t0 = time.perf_counter()

    def __exit__(self, *exc) -> None:
        seconds = time.perf_counter() - self.t0
        self.busy.on = False
        if exc[0] is None:
            _stats.record_codec(self.name, self.phase, self.nbytes, seconds)


_NO_CLOCK = contextlib.nullcontext()


def _host_clock(name: str, phase: str, nbytes: int, device: torch.device):
    """A clock for one batched codec call when ``ccoll.stats.time_codecs()`` is on, its tensors are on the
    host (a GPU call returns before its kernels have run) and no batched call of this thread is already
    timed (a generic decode_sum or an error-feedback encode may call decode_rows inside); else a no-op."""
    if not _stats.codec_clock.on or device.type != "cpu" or getattr(_HostClock.busy, "on", False):
        return _NO_CLOCK
    return _HostClock(name, phase, nbytes)


def _absmax(x: torch.Tensor) -> float:
    """max |x| as a Python float (0.0 for an empty tensor; NaN propagates)."""
    return float(x.detach().abs().max()) if x.numel() else 0.0


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


def example_specs() -> list[str]:
    """Every registered codec's ``example_specs()``, codecs in name order: what checks, benchmarks and
    tools enumerate, so a newly registered codec enters all of them."""
    return [spec for name in CODECS.names() for spec in CODECS.get(name).example_specs()]
