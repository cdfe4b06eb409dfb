"""Markers and skip logic in one place. GPU tests are skipped without a CUDA device (CI has none) and
network-namespace (``netem``) tests without root and iproute2; MPI and DeepSpeed tests run everywhere
`make test` does, because `make` installs what they need."""
from __future__ import annotations

import os
import shutil

import pytest


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _can_make_namespaces() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0 and bool(shutil.which("ip") and shutil.which("tc"))


def pytest_collection_modifyitems(config, items):
    skips = {}
    if not _has_cuda():
        skips["gpu"] = pytest.mark.skip(reason="needs a CUDA device")
    if not _can_make_namespaces():
        skips["netem"] = pytest.mark.skip(reason="needs root and iproute2 (network namespaces)")
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)
    # The kernels check first: it compiles every module in a pool of one process per core and caches each build by
    # content, so later tests that need a build (the wheel's installed sources, simt) find it instead of compiling it
    # on one core (about a minute and a half of sequential NVRTC otherwise).
    items.sort(key=lambda item: item.nodeid.split("::")[0] != KERNELS_CHECK)


#: the test module whose first test fills the kernel build cache for the whole session
KERNELS_CHECK = "tests/unit/test_kernels_build.py"
