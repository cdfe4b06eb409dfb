"""Codecs: tensor <-> fixed-size byte payload. Importing this registers every built-in codec;
none of them imports cupy until a CUDA tensor is encoded."""
from .base import CODECS, Codec, Param, example_specs, get_codec, parse_spec
from . import cast  # noqa: F401  (registers none, bf16, fp16)
from . import quant  # noqa: F401
from . import zfp  # noqa: F401
from . import lossless  # noqa: F401  (registers lossless)

__all__ = ["CODECS", "Codec", "Param", "example_specs", "get_codec", "parse_spec"]
