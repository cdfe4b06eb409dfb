"""Single-process checks of the automatic-resolution plumbing: the default resolver, rebinding of functions
frameworks cache at import (Megatron-core), ``ccoll.stats`` as module and function, one min_bytes default."""
from __future__ import annotations

import sys
import types

import torch.distributed as dist

import ccoll
import ccoll.patch as patch
from ccoll.policy import Policy
from ccoll.resolvers import UNPLACED, AutoResolver

NATIVE = Policy.from_dict({"version": 1})


def test_given_no_resolver_when_installing_expect_auto_resolver_and_explicit_one_wins():
    try:
        patch.install(NATIVE)
        assert isinstance(patch._STATE.resolver, AutoResolver)
        mine = lambda group, op: "dp"  # noqa: E731
        patch.install(NATIVE, mine)
        assert patch._STATE.resolver is mine
        patch.set_resolver(None)
        assert isinstance(patch._STATE.resolver, AutoResolver)
    finally:
        patch.uninstall()


def test_given_no_process_group_when_auto_resolving_expect_default_dimension():
    assert not dist.is_initialized()
    assert AutoResolver()(None, "all_reduce") == UNPLACED == "default"


def test_given_megatron_module_bound_before_install_when_installing_expect_rebound_and_restored():
    """Megatron-core's mappings.py does ``dist_all_gather_func = torch.distributed.all_gather_into_tensor`` at
    import; megatron-core is not installed here, so a module object made the same way stands in for it."""
    original_ag, original_rs = dist.all_gather_into_tensor, dist.reduce_scatter_tensor
    early = types.ModuleType("megatron.core.tensor_parallel.mappings")
    early.dist_all_gather_func, early.dist_reduce_scatter_func = original_ag, original_rs
    sys.modules[early.__name__] = early
    try:
        patch.install(NATIVE)
        assert early.dist_all_gather_func is dist.all_gather_into_tensor is not original_ag  # the wrapper
        assert early.dist_reduce_scatter_func is dist.reduce_scatter_tensor is not original_rs
        # imported while installed: binds the wrapper itself; uninstall restores both modules
        late = types.ModuleType("megatron.core.distributed.param_and_grad_buffer")
        late.dist_all_gather_func = dist.all_gather_into_tensor
        sys.modules[late.__name__] = late
        patch.uninstall()
        assert early.dist_all_gather_func is original_ag and early.dist_reduce_scatter_func is original_rs
        assert late.dist_all_gather_func is original_ag
        patch.install(NATIVE)  # and again: the new wrappers
        assert late.dist_all_gather_func is dist.all_gather_into_tensor is not original_ag
    finally:
        patch.uninstall()
        sys.modules.pop("megatron.core.tensor_parallel.mappings", None)
        sys.modules.pop("megatron.core.distributed.param_and_grad_buffer", None)


def test_given_ccoll_stats_when_called_and_used_as_module_expect_both_work():
    ccoll.reset_stats()
    assert ccoll.stats() == []
    with ccoll.stats.dimension("tp"):  # the docstrings' spelling
        assert ccoll.stats.current_dimension() == "tp"
    ccoll.stats.record("all_reduce", "native", 8, 8, 0.0, dim="dp")
    assert [r["dim"] for r in ccoll.stats()] == ["dp"] == [r["dim"] for r in ccoll.stats.stats()]
    import ccoll.stats as stats_module

    assert stats_module is ccoll.stats
    ccoll.reset_stats()


def test_given_policy_and_collectives_when_reading_min_bytes_default_expect_one_value():
    from ccoll import collectives, defaults

    rule = NATIVE.rule("dp", "all_reduce")
    assert rule.min_bytes == defaults.DEFAULT_MIN_BYTES == collectives.DEFAULT_MIN_BYTES
