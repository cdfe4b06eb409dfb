"""Evidence tools: the collective benchmark harness and the shaped-link runner.

- ``python -m ccoll.bench <collective> [options]``: one harness for every collective, nccl-tests / OSU
  style (see :mod:`ccoll.bench.harness`).
- ``python -m ccoll.bench.netem --ranks N --rate 1gbit [--delay 1ms] -- <command>``: one rank per
  network namespace, joined by shaped links (see :mod:`ccoll.bench.netem`).
"""
from __future__ import annotations

__all__ = ["harness", "netem"]
