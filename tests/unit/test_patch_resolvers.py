"""Resolvers without a process group: validation, and pass-through (None) until groups exist.
Matching on real groups: tests/dist/test_patch_dist.py; DeepSpeed topologies and a stand-in NeoX mpu:
tests/integration/."""
from __future__ import annotations

import pytest

from ccoll.errors import PolicyError
from ccoll.resolvers import MpuResolver, RankSetResolver, TopologyResolver


class Topo:
    """The three ProcessTopology methods the resolver uses, for pipe 2 x data 2 x model 1."""

    lists = {"pipe": [[0, 2], [1, 3]], "data": [[0, 1], [2, 3]], "model": [[0], [1], [2], [3]]}

    def get_axis_names(self):
        return ["pipe", "data", "model"]

    def get_axis_comm_lists(self, axis):
        return self.lists[axis]

    def get_dim(self, axis):
        return len(self.lists[axis][0])


def test_given_topology_when_building_expect_axes_mapped_and_single_rank_sets_dropped():
    r = TopologyResolver(Topo(), extra={"ep": [[0, 3]]})
    assert r.rank_sets() == {"dp": [[0, 1], [2, 3]], "pp": [[0, 2], [1, 3]], "ep": [[0, 3]]}
    assert r.p2p_on_world == "pp"


def test_given_unknown_dimension_when_building_expect_policyerror_listing_valid():
    with pytest.raises(PolicyError, match="dp, tp, pp, ep"):
        RankSetResolver({"mp": [[0, 1]]})
    with pytest.raises(PolicyError, match="dp, tp, pp, ep"):
        RankSetResolver({}, p2p_on_world="pipe")


def test_given_no_process_group_when_resolving_expect_none_and_nothing_cached():
    r = RankSetResolver({"dp": [[0, 1]]})
    assert r(None, "all_reduce") is None
    assert r._cache == {}  # asked again once the group exists


def test_given_mpu_before_initialisation_when_resolving_expect_passthrough():
    class Mpu:
        def model_parallel_is_initialized(self):
            return False

    assert MpuResolver(Mpu())(None, "all_reduce") is None
