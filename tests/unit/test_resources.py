"""Where ccoll finds its data (ccoll.resources), shipped policies by bare name (ccoll.policy.find_policy), and
pyproject.toml's package list and data globs, which decide what a wheel carries (the wheel itself is built and
installed by tests/integration/test_wheel.py)."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import setuptools

import ccoll
from ccoll import resources
from ccoll.errors import PolicyError
from ccoll.policy import Policy, find_policy, load

REPO = Path(__file__).resolve().parents[2]


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_given_the_checkout_expect_every_ccoll_package_and_every_data_directory_in_the_wheel_list():
    cfg = _pyproject()["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = set(setuptools.find_packages(str(REPO), include=["ccoll*"]))
    assert found <= listed, f"pyproject.toml [tool.setuptools] packages lacks {sorted(found - listed)}"
    for package, directory in cfg["package-dir"].items():
        assert package in listed and (REPO / directory).is_dir(), (package, directory)
    # every file under kernels/ and configs/ is matched by a package-data glob of its directory's package
    for package, directory in cfg["package-dir"].items():
        globs = cfg["package-data"][package]
        files = [p for p in (REPO / directory).iterdir() if p.is_file() and p.name != "__init__.py"]
        assert files, directory
        unmatched = [p.name for p in files if not any(p.match(g) for g in globs)]
        assert not unmatched, f"{directory}: {unmatched} would be left out of the wheel (globs {globs})"


def test_given_the_version_attr_expect_a_literal_setuptools_reads_without_importing_ccoll():
    assert _pyproject()["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "ccoll.__version__"}
    tree = ast.parse((REPO / "ccoll" / "__init__.py").read_text())
    literal = [n.value.value for n in tree.body if isinstance(n, ast.Assign)
               and [getattr(t, "id", None) for t in n.targets] == ["__version__"] and isinstance(n.value, ast.Constant)]
    assert literal == [ccoll.__version__]
    # what the build backend calls (an AST read first): it must not import ccoll, hence torch, at build time
    code = ("import sys; from setuptools.config.expand import read_attr; "
            f"print(read_attr('ccoll.__version__', root_dir={str(REPO)!r}), 'ccoll' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.stdout.split() == [ccoll.__version__, "False", "False"], out.stderr


def test_given_a_source_checkout_expect_data_from_the_checkout_and_the_cache_in_its_build_dir(monkeypatch):
    monkeypatch.delenv("CCOLL_KERNEL_DIR", raising=False)
    monkeypatch.delenv("CCOLL_BUILD_DIR", raising=False)
    assert resources.shipped_kernel_dir() == REPO / "kernels"
    assert resources.kernel_dir() == REPO / "kernels"
    assert (resources.shipped_kernel_dir() / "common.cuh").is_file()
    assert (resources.shipped_kernel_dir() / "simt" / "simt.h").is_file()
    assert resources.config_dir() == REPO / "configs"
    assert resources.source_checkout() == REPO and resources.build_dir() == REPO / "build"
    assert set(resources.shipped_policies()) >= {"baseline", "hybrid", "zhybrid", "znaive"}
    assert "measured" not in resources.shipped_policies() and "lassen" not in resources.shipped_policies()


def test_given_the_environment_variables_expect_them_to_win(monkeypatch, tmp_path):
    monkeypatch.setenv("CCOLL_KERNEL_DIR", str(tmp_path / "k"))
    monkeypatch.setenv("CCOLL_BUILD_DIR", str(tmp_path / "b"))
    assert resources.kernel_dir() == tmp_path / "k" and resources.build_dir() == tmp_path / "b"
    assert resources.shipped_kernel_dir() == REPO / "kernels"  # the simt shim is always ccoll's own


def test_given_no_checkout_expect_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("CCOLL_BUILD_DIR", raising=False)
    monkeypatch.setattr(resources, "source_checkout", lambda: None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resources.build_dir() == tmp_path / "xdg" / "ccoll"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resources.build_dir() == tmp_path / "home" / ".cache" / "ccoll"


def test_given_a_source_tree_that_is_not_installed_expect_the_directories_beside_the_package(tmp_path):
    """``make gpu-check PYTHON=python3`` on a bare machine: the checkout on sys.path, no install, so no
    ``ccoll._kernels`` (``-S``: site-packages appended as a plain directory, its editable-install finder unused)."""
    import sysconfig

    code = (f"import sys; sys.path[:0] = [{str(REPO)!r}]; sys.path.append({sysconfig.get_paths()['purelib']!r}); "
            "import importlib.util as u, ccoll.resources as r; "
            "print(u.find_spec('ccoll._kernels') is None, r.shipped_kernel_dir(), r.config_dir())")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", str(REPO / "kernels"), str(REPO / "configs")]


@pytest.mark.parametrize("spec", ["hybrid", "hybrid.yaml", "configs/hybrid.yaml"])
def test_given_a_shipped_policy_name_expect_its_absolute_path(spec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here
    path = find_policy(spec)
    assert os.path.isabs(path) and Path(path) == REPO / "configs" / "hybrid.yaml"
    assert Policy.from_yaml(spec) == load(spec) == Policy.from_yaml(REPO / "configs" / "hybrid.yaml")
    assert Policy.from_yaml(spec).source == path


def test_given_an_existing_file_expect_it_to_win_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hybrid.yaml").write_text("version: 1\ndefault: {codec: native}\n")
    assert find_policy("hybrid.yaml") == str(tmp_path / "hybrid.yaml")
    assert Policy.from_yaml("hybrid.yaml").passthrough  # the local file, not the shipped hybrid
    assert find_policy("hybrid") == str(REPO / "configs" / "hybrid.yaml")  # no local file named "hybrid"


@pytest.mark.parametrize("spec", ["no-such-policy", "elsewhere/hybrid.yaml", "lassen", "measured.yaml"])
def test_given_neither_a_file_nor_a_shipped_name_expect_a_policy_error_naming_the_shipped_ones(spec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PolicyError, match="cannot read") as e:
        find_policy(spec)
    assert "hybrid" in str(e.value) and "baseline" in str(e.value) and spec in str(e.value)
