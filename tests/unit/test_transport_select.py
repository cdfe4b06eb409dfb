"""``for_group(group, transport=...)``: the transport kinds a policy may name, and the typed errors for
combinations that cannot work (real MPI mapping: tests/dist/test_two_transports.py)."""
from __future__ import annotations

import pytest

from ccoll.errors import TransportError
from ccoll.transports import Transport, for_group


class _OwnTransport:
    """A group carrying its own transport, as the simulated world's MemoryGroup does."""

    def __init__(self):
        self.ccoll_transport = Transport()


def test_given_unknown_transport_kind_expect_transport_error_listing_the_kinds():
    with pytest.raises(TransportError, match="unknown transport 'nccl'; valid: torch, mpi"):
        for_group(None, transport="nccl")


@pytest.mark.parametrize("kind", ["torch", "mpi"])
def test_given_group_with_its_own_transport_when_asking_another_kind_expect_transport_error(kind):
    with pytest.raises(TransportError, match=f"cannot be sent through '{kind}'"):
        for_group(_OwnTransport(), transport=kind)


def test_given_group_with_its_own_transport_when_no_kind_given_expect_its_transport():
    g = _OwnTransport()
    assert for_group(g) is g.ccoll_transport
