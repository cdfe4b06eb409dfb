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


def test_given_the_package_expect_no_transport_kind_switch_outside_transports():
    """What differs between transports (subgroup creation, whether a receive may be posted larger than its
    message) is each transport's own method or attribute (``Transport.subgroups``, ``short_receives``), so a
    new transport is one class in ccoll/transports/, not edits in the collectives. A switch on a transport's
    kind name elsewhere fails here."""
    import pathlib
    import re

    package = pathlib.Path(__file__).resolve().parents[2] / "ccoll"
    switch = re.compile(r"""\.kind\s*[!=]=\s*["'](torch|mpi|memory)["']|["'](torch|mpi|memory)["']\s*[!=]=\s*\w+\.kind\b""")
    found = [f"{p.relative_to(package)}:{i}" for p in package.rglob("*.py") if "transports" not in p.parts
             for i, line in enumerate(p.read_text().splitlines(), 1) if switch.search(line)]
    assert not found, found
