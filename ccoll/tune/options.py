"""What the tuner tunes by default: ops, dimensions, candidate codecs, and which ops each dimension uses."""
from __future__ import annotations

from pathlib import Path

from ..policy import DENSE_DIMS

#: harness collective -> policy op
POLICY_OPS = {"all_reduce": "all_reduce", "reduce_scatter": "reduce_scatter", "all_gather": "all_gather",
              "broadcast": "broadcast", "all_to_all": "all_to_all", "sendrecv": "send_recv"}
DEFAULT_OPS = "all_reduce,reduce_scatter,all_gather,sendrecv"
DEFAULT_CODECS = "native,bf16,int8:block=256,int4:block=64"
DEFAULT_DIMS = ",".join(DENSE_DIMS)
#: which ops each dimension's traffic uses (only these get rules)
DIM_OPS = {"dp": ("all_reduce", "reduce_scatter", "all_gather"), "tp": ("all_reduce", "reduce_scatter", "all_gather"),
           "pp": ("send_recv",), "ep": ("all_to_all",)}
HYBRID = Path(__file__).resolve().parents[2] / "configs" / "hybrid.yaml"
SYNTH_NUMEL = 1 << 20
