"""ccoll/frameworks: the one table of every patch, and the one mechanism every replacement goes through.

- In a process that has imported torch.distributed, DDP, FSDP2's state module, DeviceMesh, DeepSpeed (with
  its comm backend built), transformers' Trainer and Megatron-core modules that cache torch functions:
  every attribute of every owner the table names and of those frameworks' modules and classes is
  snapshotted; install changes exactly what the table lists (each row at least once) and what the
  mechanism recorded; uninstall puts back every attribute (``is``) and leaves no ccoll entry on
  ``sys.meta_path``; the after-import hooks of FSDP2 / Trainer are taken off when they did not fire.
- ``replace`` refuses what the table does not list; a replacement on top of ccoll's is left at uninstall.
- No code in ccoll/ replaces another package's attribute except through ccoll/frameworks/patches.py.
"""
from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys
import types

import pytest
import torch.distributed as dist

import ccoll.frameworks as fw
import ccoll.patch as patch
from ccoll.frameworks import patches
from ccoll.policy import Policy

ROOT = pathlib.Path(__file__).resolve().parents[2]
NATIVE = Policy.from_dict({"version": 1})

SNAPSHOT = r'''
import json, os, sys, tempfile
import torch, torch.distributed as dist
import torch.nn.parallel.distributed
import torch.distributed.device_mesh
out = {}

import ccoll.frameworks as fw, ccoll.patch as patch
from ccoll.frameworks import patches
from ccoll.policy import Policy
NATIVE = Policy.from_dict({"version": 1})

# FSDP2 and Trainer not imported yet: their after-import hooks wait on sys.meta_path, and leave with uninstall
ours = lambda: sorted(h.name for h in sys.meta_path if type(h).__name__ == "AfterImport")
patch.install(NATIVE)
out["hooks_installed"] = ours()
patch.uninstall()
out["hooks_uninstalled"] = ours()

import torch.distributed.fsdp._fully_shard._fsdp_state
import transformers.trainer
import deepspeed, deepspeed.comm.comm
import megatron.core.tensor_parallel.mappings, megatron.core.distributed.param_and_grad_buffer
store = tempfile.mktemp()
dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
deepspeed.init_distributed(dist_backend="gloo")  # deepspeed.comm.comm.cdb: caches torch's functions

def owners():
    found = {}
    for row in fw.TABLE:
        if row.owner.endswith(".*"):
            prefix = row.owner[:-2]
            for name, mod in list(sys.modules.items()):
                if mod is not None and (name == prefix or name.startswith(prefix + ".")):
                    found[name] = mod
        elif row.owner != "sys":
            found[row.owner] = patches.resolve(row.owner)
    for name in ("torch.distributed", "torch.distributed.distributed_c10d", "torch.nn.parallel.distributed",
                 "torch.distributed.device_mesh", "torch.distributed.fsdp._fully_shard._fsdp_state",
                 "deepspeed", "deepspeed.comm", "deepspeed.comm.comm", "transformers.trainer"):
        found[name] = sys.modules[name]
    return found

OWNERS = owners()
out["missing"] = sorted(n for n, o in OWNERS.items() if o is None)
def snap():
    return {(n, a): v for n, o in OWNERS.items() if o is not None for a, v in list(vars(o).items())}

before = snap()
patch.install(NATIVE)
during = snap()
out["changed"] = sorted(k for k in before if during.get(k, before) is not before[k])
out["added"] = sorted(k for k in during if k not in before)
out["active"] = sorted(patches.active())
out["hooks_during"] = ours()
patch.uninstall()
after = snap()
out["not_restored"] = sorted(k for k in before if after.get(k, None) is not before[k])
out["added_after"] = sorted(k for k in after if k not in before and not isinstance(after[k], type(sys)))
out["hooks_after"] = ours()
out["active_after"] = patches.active()
print("JSON" + json.dumps(out))
'''


@pytest.fixture(scope="module")
def snapshot():
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "DS_BUILD_OPS": "0", "PYTHONPATH": str(ROOT)}
    env = {k: v for k, v in env.items() if not k.startswith("CCOLL_")}
    proc = subprocess.run([sys.executable, "-c", SNAPSHOT], env=env, text=True, capture_output=True, timeout=600,
                          cwd=ROOT)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("JSON")), None)
    assert proc.returncode == 0 and line, proc.stderr[-4000:]
    out = json.loads(line[4:])
    for key in ("changed", "added", "active", "not_restored", "added_after"):
        out[key] = {tuple(k) for k in out[key]}
    return out


@pytest.mark.slow
def test_given_every_framework_imported_when_installing_expect_exactly_the_table_changed_and_all_restored(snapshot):
    s = snapshot
    assert not s["missing"], s["missing"]
    assert not s["added"], f"install added attributes: {sorted(s['added'])}"
    # what changed is what the mechanism recorded, and every one of them is a row of the table
    assert s["changed"] == s["active"], (s["changed"] ^ s["active"])
    unlisted = sorted(k for k in s["changed"] if patches.row_of(*k) is None)
    assert not unlisted, f"ccoll replaced what the table does not list: {unlisted}"
    # every row that install (or an import while installed) makes was made here: the table is not stale
    rows_hit = {patches.row_of(*k) for k in s["changed"]}
    expected = {r for r in fw.TABLE if r.when in (fw.INSTALL, fw.IMPORT) and r.owner != "sys"}
    assert expected <= rows_hit, sorted(f"{r.owner}.{r.attrs}" for r in expected - rows_hit)
    # torch.distributed: every function the table lists that this torch has
    for name in fw.torch_distributed.FUNCTIONS:
        if hasattr(dist, name):
            assert ("torch.distributed", name) in s["changed"], name
    assert ("deepspeed.comm.comm.cdb", "all_gather_function") in s["changed"]
    assert ("megatron.core.tensor_parallel.mappings", "dist_all_gather_func") in s["changed"]
    # uninstall: every attribute is the very object it was, nothing new, no ccoll hook left
    assert not s["not_restored"], sorted(s["not_restored"])
    assert not s["added_after"], sorted(s["added_after"])
    assert s["hooks_after"] == [] and s["active_after"] == [] and s["hooks_during"] == []


@pytest.mark.slow
def test_given_fsdp2_and_trainer_not_imported_when_installing_expect_hooks_waiting_then_gone(snapshot):
    assert snapshot["hooks_installed"] == sorted([fw.fsdp2.MODULE, fw.hf.MODULE])
    assert snapshot["hooks_uninstalled"] == []


def test_given_unlisted_attribute_when_replacing_expect_patch_error_and_nothing_changed():
    from torch.nn.parallel import DistributedDataParallel as DDP

    before_new_group, before_forward = dist.new_group, DDP.forward
    for obj, attr in ((dist, "new_group"), (DDP, "forward")):
        with pytest.raises(fw.PatchError, match="no row lists"):
            fw.replace(obj, attr, lambda *a, **k: None)
    mod = types.ModuleType("megatron.core.somewhere")
    mod.helper = len
    with pytest.raises(fw.PatchError, match=r"megatron\.core\.somewhere\.helper"):
        fw.replace(mod, "helper", abs)
    with pytest.raises(fw.PatchError, match="neither a module nor a class"):
        fw.replace(object(), "x", 1)
    with pytest.raises(fw.PatchError, match="is not what"):
        fw.replace(object(), "all_gather_function", 1, owner="deepspeed.comm.comm.cdb")
    assert dist.new_group is before_new_group and DDP.forward is before_forward and mod.helper is len
    assert patches.active() == []


def test_given_someone_wrapping_on_top_of_ccoll_when_uninstalling_expect_theirs_left_and_the_rest_restored():
    original_ar, original_b = dist.all_reduce, dist.broadcast
    patch.install(NATIVE)
    try:
        theirs = lambda *a, **k: None  # noqa: E731
        dist.all_reduce = theirs
    finally:
        patch.uninstall()
    try:
        assert dist.all_reduce is theirs and dist.broadcast is original_b
        assert patches.active() == []
    finally:
        dist.all_reduce = original_ar


def test_given_megatron_module_named_by_pattern_when_replacing_expect_row_and_restore():
    mod = types.ModuleType("megatron.core.tensor_parallel.fake_mappings")
    mod.dist_all_gather_func = dist.all_gather_into_tensor
    sentinel = lambda *a, **k: None  # noqa: E731
    assert fw.replace(mod, "dist_all_gather_func", sentinel) is dist.all_gather_into_tensor
    with pytest.raises(fw.PatchError, match="already replaced"):
        fw.replace(mod, "dist_all_gather_func", sentinel)
    fw.restore()
    assert mod.dist_all_gather_func is dist.all_gather_into_tensor and patches.active() == []


def test_given_table_expect_torch_distributed_functions_match_the_patch_and_rows_well_formed():
    assert set(fw.torch_distributed.FUNCTIONS) == set(patch.WRAPPED) | {"init_process_group"}
    for row in fw.TABLE:
        assert row.when in (fw.INSTALL, fw.IMPORT, fw.CCOLL_RUN), row
        assert row.attrs and row.why and row.by and row.framework, row
        assert (row.when == fw.IMPORT and row.owner != "sys") == bool(row.module), row
    names = [a.NAME for a in fw.ADAPTERS]
    assert names == ["torch.distributed", "DeviceMesh", "Megatron", "DeepSpeed", "DDP", "FSDP2", "HF Trainer"]
    for adapter in fw.ADAPTERS:  # the one shape every adapter has
        for attr in ("NAME", "PATCHES", "SOURCE", "DESCS", "signature", "present", "place", "install", "uninstall"):
            assert hasattr(adapter, attr), (adapter.__name__, attr)


# --- every replacement goes through ccoll/frameworks/patches.py ------------------------------------------------
#: (file, line text) that set an attribute of something not ccoll's own on purpose, and why it is no patch
ALLOWED = {
    ("ccoll/codecs/base.py", "setattr(cls, f\"_{op}_{backend}\""): "a codec class's own methods, at its definition",
    ("ccoll/info.py", "mpi4py.rc.initialize = False"): "mpi4py's documented run-time option, not a replacement",
    ("ccoll/bench/overhead.py", "setattr(cls, n, "): "the bench blanks a ccoll codec's own kernels for a timing",
    ("ccoll/convergence/__main__.py", "setattr(args, k, v)"): "its own argparse namespace",
}


def _replacements(path: pathlib.Path, table_attrs: set[str]):
    """setattr calls, sys.meta_path insertions and assignments to an attribute the table names (on anything
    but self/cls), with their line's text."""
    src = path.read_text()
    lines = src.splitlines()
    for node in sorted(ast.walk(ast.parse(src)), key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0))):
        hit = False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            hit = True
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("insert", "append") and ast.unparse(node.func.value) == "sys.meta_path"):
            hit = True
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if (isinstance(t, ast.Attribute) and t.attr in table_attrs
                        and not (isinstance(t.value, ast.Name) and t.value.id in ("self", "cls"))):
                    hit = True
        if hit:
            yield lines[node.lineno - 1].strip()


def test_given_ccoll_tree_expect_no_replacement_outside_the_frameworks_mechanism():
    table_attrs = {a for row in fw.TABLE for a in row.attrs}
    mechanism = {"ccoll/frameworks/patches.py", "ccoll/_activate/sitecustomize.py"}  # the latter: ccoll-run rows
    found = []
    for path in sorted((ROOT / "ccoll").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in mechanism:
            continue
        for text in _replacements(path, table_attrs):
            if not any(rel == f and text.startswith(t) for f, t in ALLOWED):
                found.append(f"{rel}: {text}")
    assert not found, "replaced outside ccoll/frameworks/patches.py (use frameworks.replace):\n" + "\n".join(found)


def test_given_a_direct_assignment_when_scanning_expect_it_found(tmp_path):
    """The scanner itself: the three shapes of a replacement are seen."""
    f = tmp_path / "m.py"
    f.write_text("import sys\nsetattr(a, 'b', 1)\nFSDPState._lazy_init = g\nsys.meta_path.insert(0, h)\n"
                 "self.__init__ = x\n")
    assert list(_replacements(f, {"_lazy_init", "__init__"})) == [
        "setattr(a, 'b', 1)", "FSDPState._lazy_init = g", "sys.meta_path.insert(0, h)"]


def test_given_adapters_with_signatures_expect_the_written_out_signature_to_agree():
    from ccoll.frameworks import fsdp2

    assert fw.signature() == tuple(s() for s in fw.SIGNATURES)
    fsdp2.place_group(object.__new__(type("G", (), {})), "dp", "test")  # a new placement: both move alike
    assert fw.signature() == tuple(s() for s in fw.SIGNATURES)
