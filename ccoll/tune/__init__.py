"""``python -m ccoll.tune``: measure every candidate and write the v2 policy that picks the fastest one
within each dimension's error budget, per op and size bucket (MCR-DL's tuning suite, COCCL's per-size
autotuning).

    python -m ccoll.tune --np 4 --out tuned.yaml                         # local ranks (gloo)
    torchrun --nproc-per-node 8 ... -m ccoll.tune --out tuned.yaml        # the user's own cluster
    mpirun -n 8 python -m ccoll.tune --transports torch,mpi --out tuned.yaml
    python -m ccoll.bench.netem --ranks 4 --rate 1gbit -- python -m ccoll.tune --out tuned.yaml
    python -m ccoll.tune --np 2 --data results/capture --compare configs/*.yaml --out tuned.yaml

What it does, on every rank (rank 0 prints and writes):

1. Timing: for each op x size x transport x candidate codec, the collective's time as
   ``ccoll.bench``'s harness measures it (:func:`ccoll.bench.harness.measure`: barrier, time each
   iteration), on the harness's inputs; ``--stat`` picks the figure that decides: ``best`` (default,
   the fastest iteration: on a shared machine noise only adds time), ``median``, or ``mean`` (the
   harness's slowest-rank mean). Each size's candidates are timed in ``--rounds`` interleaved rounds
   (default 3) and a candidate's rounds are folded the same way (fastest round for ``best``, else the
   median round): a disturbance of a shared machine lasts seconds, so one candidate measured once can
   lose by a third what it wins in the next minute (4 ranks at 1 Gbit/s, 8 MiB: int8 80 ms in the
   tuning pass, 60 ms in the compare pass). Sizes are the harness's (all_gather: the
   gathered output; the policy's buckets use each rank's input, size / n).
2. Error: each codec's relative L2 round-trip error (pooled, :func:`ccoll.bench.rd.measure`) on
   real-looking data per (dimension, op): tensors captured with ``CCOLL_CAPTURE`` (``--data DIR``) where
   the capture has that (dim, op), else synthetic: heavy-tailed (Student-t, 3 degrees of freedom) for
   DP gradients, Gaussian otherwise.
3. Budget: a codec is a candidate for (dim, op) when its error is within the budget: ``--budget
   dp=0.12`` (per dimension), by default the error the shipped ``configs/hybrid.yaml`` codec of that
   (dim, op) measures on the same data x ``--slack`` (so an op hybrid keeps exact admits only exact
   codecs).
4. Choice, per (dim, op): for each transport, at each measured size the fastest candidate; a codec must
   beat torch's native time at that size by ``--margin`` (default 5%) or native is kept, so the policy
   is never slower than native where measured (native wins ties). ``--confirm`` (default): every
   codec/transport that beats native by the margin within a budget is timed again, right after native,
   and must win again: the slower of its two figures must beat the faster of native's, while candidates
   are ranked among themselves by their faster figure. A size bucket ``[s_i, s_i+1)`` takes
   the choice measured at ``s_i``, its smallest size (compression gains grow with size), and tensors
   below the smallest measured size stay native. ``transport: mpi`` is chosen for a (dim, op) only when
   it is feasible at every size (nothing slower than torch's native) and faster overall by the margin.
5. Output: a v2 policy YAML with the measured figures as comments (``--out``) and the raw table as JSON
   (``--json``, default: the YAML's path with ``.json``).
6. ``--compare A.yaml B.yaml ...``: after tuning, a second, independent timing pass of every policy
   (the tuned one included) at every size, in the same run: the codec each policy resolves for (dim,
   op, size) is timed again, and the JSON/printout gives per size the tuned policy's speed relative to
   native and to the best static policy (all of them, and those within the budget).

A progress bar goes to stderr (rank 0). ``--np N`` starts N local ranks (gloo; with ``--transports``
including mpi: under mpiexec, torch.distributed initialised from its ranks).

Modules: :mod:`.options` (defaults: ops, dimensions, candidates), :mod:`.budget` (errors and budgets),
:mod:`.choose` (choice per size, buckets, the policy YAML), :mod:`.run` (the timing run on every rank),
:mod:`.cli` (command line, local ranks); ``python -m ccoll.tune`` runs :func:`.cli.main`.
"""
from __future__ import annotations

from .budget import default_budgets, error_table, samples_by_key, synthetic
from .choose import beating_native, buckets, choose, policy_yaml
from .cli import build_parser, main
from .options import DEFAULT_CODECS, DEFAULT_DIMS, DEFAULT_OPS, DIM_OPS, POLICY_OPS
from .run import fold, run_rank

__all__ = ["DEFAULT_CODECS", "DEFAULT_DIMS", "DEFAULT_OPS", "DIM_OPS", "POLICY_OPS", "beating_native", "build_parser",
           "buckets", "choose", "default_budgets", "error_table", "fold", "main", "policy_yaml", "run_rank",
           "samples_by_key", "synthetic"]
