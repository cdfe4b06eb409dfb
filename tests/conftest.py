"""Markers and skip logic in one place. Only GPU tests are skipped (CI has no GPU); MPI, DeepSpeed and
network-namespace tests run everywhere `make test` does, because `make` installs what they need."""
from __future__ import annotations

import pytest


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
