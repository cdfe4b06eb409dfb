"""Row-order sums on the CPU: the one helper the codecs' decode_sum uses to add decoded rows into an
accumulator, row 0 first, bit for bit the same as adding them one at a time in a loop."""
from __future__ import annotations

import torch

#: up to this many rows are added one ``add_`` each, more with one ``index_add_``. Why: the same fp32
#: adds in the same row order (index_add_ on CPU adds source rows into the accumulator in index order),
#: but index_add_ (CPU: scatter_add_) splits even a 16K-value row over torch's thread pool, and on a
#: host whose cores are busy (the usual case when ranks share a node) a small call then waits for a
#: thread to be scheduled (int8 all_reduce of 64 KiB on two ranks, 2-core host under load: ~160 us per
#: call in index_add_ for ~4 us of adding). Two rows covers two ranks (flat sums one received row, the
#: one-exchange path two); from three rows on, one index_add_, so a collective's torch op count does not
#: depend on the world size (tests/dist/test_collectives_launch_counts.py: the same ops at p = 4, 16, 64).
ADD_ROWS_MAX = 2


def add_rows_(acc: torch.Tensor, rows: torch.Tensor) -> None:
    """acc ([1, L]) += rows[0], += rows[1], ... (rows: [r, L]), each add rounded in acc's dtype."""
    r = rows.shape[0]
    if r <= ADD_ROWS_MAX:
        for i in range(r):
            acc.add_(rows[i : i + 1])
    else:
        acc.index_add_(0, torch.zeros(r, dtype=torch.long), rows)
