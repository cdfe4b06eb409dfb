"""The cross-rank policy check: every rank must install the same policy.

Policy fingerprints are compared through the default group's key-value store (no collective, so no
device and no ordering constraint): at install when torch.distributed is initialised, otherwise right
after ``torch.distributed.init_process_group`` (wrapped while installed), or at the first handled call as
a last resort. Ranks that disagree raise PolicyError naming the ranks on every rank; a rank that never
installs makes the others fail after ``CCOLL_FINGERPRINT_TIMEOUT_S`` (default 120 s).
"""
from __future__ import annotations

import datetime
import functools
import itertools
import os
from typing import Callable

import torch.distributed as dist

from ..errors import PolicyError
from ..log import logger
from .state import SLOT, State

# one store prefix per check in this process: every rank installs the same sequence of policies, so the
# n-th check of every rank meets under the same prefix
_generations = itertools.count(1)


def agreement(policy) -> str:
    """What every rank must share, as one token: the policy's rules (its fingerprint covers its schema
    version) and what the ranks derive their segments and wire layout from without talking — the
    segment size (a rank that pipelines in other pieces would issue other collectives and hang the
    group) and ccoll's own version (layouts may change between releases)."""
    from .. import __version__
    from ..collectives import segments

    return f"{policy.fingerprint()[:16]}/seg{segments.SEGMENT_BYTES}/v{__version__}"


def check(st: State) -> None:
    """Every rank publishes its policy fingerprint in the default store and reads everyone's."""
    with st.lock:
        if st.checked:
            return
        st.checked = True
    if not (dist.is_available() and dist.is_initialized()):
        st.checked = False
        return
    world = dist.get_world_size()
    rank = dist.get_rank()
    if world == 1:
        return
    prefix = f"ccoll/policy/{next(_generations)}/"
    mine = f"{agreement(st.policy)} {st.policy.source}"
    timeout_s = float(os.environ.get("CCOLL_FINGERPRINT_TIMEOUT_S", "120"))
    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - backends without a store (e.g. some MPI setups): use a collective
        store = None
    if store is not None:
        store.set(prefix + str(rank), mine)
        keys = [prefix + str(r) for r in range(world)]
        try:
            store.wait(keys, datetime.timedelta(seconds=timeout_s))
        except Exception:  # noqa: BLE001 - store timeouts raise backend-specific errors
            missing = [r for r in range(world) if not store.check([prefix + str(r)])]
            raise PolicyError(
                f"ccoll policy check: ranks {missing} did not publish a policy fingerprint within {timeout_s:.0f} s; "
                f"install ccoll.patch with the same policy on every rank (this rank: {st.policy.source})"
            ) from None
        theirs = [store.get(k).decode() for k in keys]
    else:
        theirs = [None] * world
        dist.distributed_c10d.all_gather_object(theirs, mine)
    if len(set(theirs)) > 1:
        by_fp: dict[str, list[int]] = {}
        for r, v in enumerate(theirs):
            by_fp.setdefault(v, []).append(r)
        detail = "; ".join(f"ranks {rs}: {v.split(' ', 1)[0]} ({v.split(' ', 1)[1]})" for v, rs in by_fp.items())
        raise PolicyError(f"ccoll policy mismatch across ranks (rank {rank} has {mine.split(' ', 1)[0]}): {detail}")
    logger.debug("ccoll policy %s agreed on %d ranks", mine, world)


def wrap_init_process_group(orig: Callable) -> Callable:
    """``init_process_group`` that runs the check once the default group exists."""
    @functools.wraps(orig)
    def init_process_group(*args, **kwargs):
        result = orig(*args, **kwargs)
        st = SLOT.current
        if st is not None and not st.checked:
            check(st)
        return result

    return init_process_group
