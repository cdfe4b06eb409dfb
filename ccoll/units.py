"""Byte sizes, link rates and dtype names as people write them: one parser and one formatter each.

    parse_nbytes("64K") == parse_nbytes("64KiB") == parse_nbytes("64kb") == 65536   # binary multiples
    parse_nbytes("1.5M") == 1572864;  parse_nbytes("8MiB", strict=True) == 8 << 20
    parse_rate_bits("1gbit") == 1e9;  parse_rate_bits("125mbps") == 1e9            # tc's units
    format_nbytes(65536) == "64KiB";  format_nbytes(65536, short=True) == "64K";  human_nbytes(1536) == "1.50 KiB"

Command lines (``-b 1K``, ``--sizes 64K,1M``) take the lenient form: an integer or decimal with an optional
K, M or G, optionally followed by B or iB, any case, always binary multiples (as nccl-tests). Policy YAML
takes the strict form (``strict=True``): an integer with an optional ``B``/``KiB``/``MiB``/``GiB``, so
``12 KB`` (which some read as 12000) is an error there. Every failure is a :class:`ccoll.errors.UnitsError`
that shows the accepted forms; :func:`nbytes_arg` / :func:`rate_arg` wrap the parsers for argparse.
"""
from __future__ import annotations

import argparse
import re

from .errors import UnitsError

_BINARY = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_LENIENT = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)((?<=[kKmMgG])i?[bB]|[bB])?\s*")
_STRICT = re.compile(r"\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*")
_STRICT_UNITS = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
LENIENT_FORMS = "an integer, optionally with K, M or G (binary multiples; KB, KiB alike), e.g. 64K, 1.5M, 8MiB, 1024"
STRICT_FORMS = "an integer or <n>B/KiB/MiB/GiB"


def parse_nbytes(text: str | int, *, strict: bool = False) -> int:
    """A byte count from ``text`` (see the module docstring for the two forms); ints pass through."""
    if isinstance(text, bool):
        raise UnitsError(f"{text!r} is not a size; write {STRICT_FORMS if strict else LENIENT_FORMS}")
    if isinstance(text, int):
        return text
    if strict:
        m = _STRICT.fullmatch(str(text))
        if m:
            return int(m.group(1)) * _STRICT_UNITS[m.group(2)]
        raise UnitsError(f"{text!r} is not a size; write {STRICT_FORMS}")
    m = _LENIENT.fullmatch(str(text))
    if m:
        value = float(m.group(1)) * _BINARY[m.group(2).upper()]
        if value == int(value):
            return int(value)
    raise UnitsError(f"{text!r} is not a size; write {LENIENT_FORMS}")


def parse_nbytes_list(text: str) -> list[int]:
    """``"64K,1M,8M"`` -> byte counts in the given order (empty items skipped)."""
    return [parse_nbytes(x) for x in str(text).split(",") if x.strip()]


def format_nbytes(n: int, *, short: bool = False) -> str:
    """The exact count in the largest binary unit that divides it: 65536 -> "64KiB" ("64K" if ``short``),
    1000 -> "1000". Parses back to ``n`` (strictly unless ``short``)."""
    for unit, k in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k}{unit}{'' if short else 'iB'}"
    return str(n)


def human_nbytes(n: float, digits: int = 2) -> str:
    """An approximate, readable size for tables: 1536 -> "1.50 KiB", 12 -> "12 B"."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n:.0f} B"


# --- link rates (tc's syntax) ------------------------------------------------------------------------

_RATE = re.compile(r"\s*(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)\s*", re.I)
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}
RATE_FORMS = "tc units, e.g. 100mbit, 1gbit, 10gbit (or bytes per second: 125mbps)"


def parse_rate_bits(text: str) -> float:
    """tc's rate syntax -> bits per second: "1gbit" -> 1e9, "100mbit" -> 1e8, "125mbps" (bytes) -> 1e9."""
    m = _RATE.fullmatch(str(text))
    if not m or float(m.group(1)) <= 0:
        raise UnitsError(f"{text!r} is not a link rate; use {RATE_FORMS}")
    return float(m.group(1)) * _RATE_UNITS[m.group(2).lower()]


def format_rate_bits(bits_per_s: float) -> str:
    """The inverse for whole units: 1e9 -> "1gbit", 1e8 -> "100mbit", 1.5e9 -> "1500mbit"."""
    for unit, scale in (("tbit", 1e12), ("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits_per_s >= scale and float(bits_per_s / scale).is_integer():
            return f"{int(bits_per_s / scale)}{unit}"
    return f"{bits_per_s:g}bit"


# --- argparse adapters: the parser's message, not argparse's "invalid value" -------------------------

def _argparse_type(parse):
    def convert(text: str):
        try:
            return parse(text)
        except UnitsError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = convert.__qualname__ = f"{parse.__name__}_arg"
    return convert


def _checked_rate(text: str) -> str:
    parse_rate_bits(text)
    return text.strip()  # handed to tc as written


nbytes_arg = _argparse_type(parse_nbytes)
nbytes_list_arg = _argparse_type(parse_nbytes_list)
rate_arg = _argparse_type(_checked_rate)


# --- dtype names (command lines, policy excludes, model tables) --------------------------------------

def _torch_dtypes() -> dict:
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


#: canonical name -> torch dtype (the float dtypes ccoll's codecs and tools take)
DTYPES = _torch_dtypes()
#: the short names people type, -> canonical name
DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16",
                 "fp64": "float64", "double": "float64"}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def dtype_name(text: str) -> str:
    """"bf16" -> "bfloat16"; canonical names pass through; anything else is returned unchanged (so an
    argparse ``choices`` check reports it)."""
    return DTYPE_ALIASES.get(text, text)
