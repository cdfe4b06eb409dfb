"""Evidence tools: the collective benchmark harness, the shaped-link runners and the measurement scripts.

- ``python -m ccoll.bench <collective> [options]``: one harness for every collective, nccl-tests / OSU
  style: :mod:`.harness` (command line, sweep, printing), :mod:`.cases` (the collectives table),
  :mod:`.measure` (timing and checking one case), :mod:`.worlds` (torch.distributed or mpi4py ranks).
- ``python -m ccoll.bench.netem --ranks N --rate 1gbit [--delay 1ms] -- <command>``: one rank per
  network namespace, joined by shaped links (:mod:`.netem`); :mod:`.nodes`: ranks grouped into emulated
  nodes, hierarchical vs flat all_reduce.
- :mod:`.rd` (rate-distortion on captured tensors), :mod:`.lossless_bench` (the lossless codec and the
  variable-size collectives), :mod:`.two_transports` (gloo + MPI in one job), :mod:`.plot`.
- ``python -m ccoll.bench.hooks``: one DDP model trained with each of torch's DDP comm hooks and ccoll's
  (:mod:`.hooks`): step time, wire ratio, held-out loss and the wall time to a target loss.

Rank processes are started and ended by :mod:`ccoll.launch`.
"""
from __future__ import annotations

__all__ = ["harness", "netem"]
