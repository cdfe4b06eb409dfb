"""Where ccoll's data is: the kernel sources (kernels/*.cu, common.cuh, simt/), the shipped configs (policies,
clusters/, codecs/) and the cache of built kernels. The one place that knows; everything else asks here.

Why importlib.resources: the sources stay at the top of the checkout (kernels/, configs/), and pyproject.toml
maps them into the package as ``ccoll._kernels`` and ``ccoll._configs``. A wheel carries them there, so the
look-up never depends on where site-packages is. The one fallback, when those packages do not import: a source
tree, where the top-level directories beside the ``ccoll`` package are the data -- a checkout on sys.path
without an install (``make gpu-check PYTHON=python3`` on a machine with nothing installed), and an editable
install (setuptools' editable finder maps a package directory only when it has an ``__init__.py``, which the
data directories must not have: see ``_data_dir``).

The build cache (NVRTC images, host libraries, simt libraries, the carried cubin bundle): ``$CCOLL_BUILD_DIR``;
else the checkout's ``build/`` when ccoll runs from a source checkout (tests, ``make gpu-bundle`` and the
device runs read it there); else a per-user cache (``$XDG_CACHE_HOME/ccoll``, ``~/.cache/ccoll``), never
site-packages, which may be read-only and is shared by every user of the interpreter."""
from __future__ import annotations

import functools
import os
from importlib import import_module, resources
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
#: data packages (pyproject.toml [tool.setuptools.package-dir]) -> the checkout directory they are made from
DATA_PACKAGES = {"ccoll._kernels": "kernels", "ccoll._configs": "configs"}


def _data_dir(package: str) -> Path:
    """The directory of data package ``package`` on disk: importlib.resources when the package imports (a
    wheel), else the checkout directory it is made from (a source tree: on sys.path, or an editable install)."""
    try:
        module = import_module(package)
    except ModuleNotFoundError:
        module = None
    if module is not None:
        # the data packages have no __init__.py (namespace packages): one in the checkout's kernels/ would be
        # a top-level package ``kernels`` wherever the checkout is on sys.path (ccoll-run puts it there) and
        # shadow the PyPI package of that name, which transformers imports. resources.files() of a namespace
        # package is a MultiplexedPath; a wheel's is one directory, a real one (nvcc and NVRTC need -I paths)
        files = resources.files(module)
        return files if isinstance(files, Path) else Path(next(iter(module.__path__)))
    return _PACKAGE_DIR.parent / DATA_PACKAGES[package]


@functools.lru_cache(maxsize=None)
def shipped_kernel_dir() -> Path:
    """The kernel sources ccoll ships (kernels/*.cu, common.cuh, and simt/, the CPU shim of the simt backend)."""
    return _data_dir("ccoll._kernels")


def kernel_dir() -> Path:
    """The kernel sources to build: ``$CCOLL_KERNEL_DIR`` when set (e.g. sources being edited elsewhere), else
    the shipped ones."""
    override = os.environ.get("CCOLL_KERNEL_DIR")
    return Path(override) if override else shipped_kernel_dir()


@functools.lru_cache(maxsize=None)
def config_dir() -> Path:
    """The shipped configs: policies (``*.yaml``), ``clusters/``, ``codecs/``."""
    return _data_dir("ccoll._configs")


def config_path(relative: str) -> Path:
    """A shipped config file by its path under configs/ (``"codecs/measured.yaml"``, ``"znaive.yaml"``)."""
    return config_dir() / relative


def shipped_policies() -> dict[str, Path]:
    """Policy name -> file: every ``*.yaml`` directly in the shipped configs (clusters/ and codecs/ are not
    policies)."""
    return {p.stem: p for p in sorted(config_dir().glob("*.yaml"))}


def source_checkout() -> Path | None:
    """The checkout ccoll runs from (the directory holding the ``ccoll`` package, pyproject.toml and
    kernels/), or None for an installed wheel."""
    root = _PACKAGE_DIR.parent
    if (root / "pyproject.toml").is_file() and (root / "kernels").is_dir() and (root / "ccoll").is_dir():
        return root
    return None


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/ccoll``, else ``~/.cache/ccoll``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ccoll"


def build_dir() -> Path:
    """Where built kernels are cached (module docstring): ``$CCOLL_BUILD_DIR``, the checkout's build/, or the
    user cache."""
    override = os.environ.get("CCOLL_BUILD_DIR")
    if override:
        return Path(override)
    root = source_checkout()
    return root / "build" if root is not None else user_cache_dir()
