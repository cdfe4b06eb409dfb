"""Zero code, without a process group: the policy's ``attach:`` key, ``import ccoll``'s lazy subpackages,
DDP accepting ``ccoll.ddp.compress_hook`` as annotated, and what ccoll.report tells about a process that
compressed nothing."""
from __future__ import annotations

import subprocess
import sys

import pytest

from ccoll.errors import PolicyError
from ccoll.policy import Policy

BASE = {"version": 1, "dp": {"codec": "int4:block=64", "error_feedback": True}}


def test_given_no_attach_key_when_loading_expect_both_on_and_fingerprint_unchanged():
    pol = Policy.from_dict(dict(BASE))
    assert pol.attach == {"ddp": True, "fsdp": True}
    assert "attach" not in pol.to_dict()
    assert pol == Policy.from_dict(dict(BASE, attach={"ddp": True}))


def test_given_attach_ddp_false_when_loading_expect_off_and_fingerprint_differs():
    pol = Policy.from_dict(dict(BASE, attach={"ddp": False}))
    assert pol.attach == {"ddp": False, "fsdp": True}
    assert pol.to_dict()["attach"] == {"ddp": False, "fsdp": True}
    assert pol.fingerprint() != Policy.from_dict(dict(BASE)).fingerprint()


@pytest.mark.parametrize("attach, match", [
    ({"ddp": "no"}, r"attach\.ddp: expected true or false, got 'no'"),
    ({"ddp": 0}, r"attach\.ddp: expected true or false"),
    ({"deepspeed": False}, r"attach: unknown key\(s\) 'deepspeed'; valid: ddp, fsdp"),
    (False, r"attach: expected a mapping"),
])
def test_given_bad_attach_value_when_loading_expect_policy_error_naming_the_key(attach, match):
    with pytest.raises(PolicyError, match=match):
        Policy.from_dict(dict(BASE, attach=attach), source="p.yaml")


def test_given_import_ccoll_when_reading_integrations_expect_lazy_attributes_and_no_heavy_modules():
    code = ("import sys, ccoll\n"
            "before = [m for m in ('ccoll.ddp', 'ccoll.fsdp', 'ccoll.resolvers', 'ccoll.patch') if m in sys.modules]\n"
            "mods = [ccoll.ddp, ccoll.fsdp, ccoll.resolvers, ccoll.patch]\n"
            "assert ccoll.ddp.compress_hook and ccoll.fsdp.compress and ccoll.resolvers.AutoResolver\n"
            "print(before, [m.__name__ for m in mods], [m for m in ('cupy', 'mpi4py', 'deepspeed') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] ['ccoll.ddp', 'ccoll.fsdp', 'ccoll.resolvers', 'ccoll.patch'] []"


def test_given_compress_hook_when_ddp_checks_its_annotations_expect_accepted():
    import torch
    from torch.nn.parallel import DistributedDataParallel

    import ccoll

    errors = []
    fake = type("FakeDDP", (), {"_log_and_throw": lambda self, cls, msg: errors.append(msg)})()
    DistributedDataParallel._check_comm_hook(fake, ccoll.ddp.compress_hook)  # what register_comm_hook runs
    assert errors == []
    assert ccoll.ddp.compress_hook.__annotations__["return"] == torch.futures.Future[torch.Tensor]


def test_given_process_that_joined_no_group_and_recorded_nothing_when_exiting_expect_no_stats_file_note():
    import ccoll
    from ccoll import report

    ccoll.reset_stats()
    if report._seen.joined:
        pytest.skip("this process already joined a process group")
    assert report.outcome() is None  # a launcher process (torchrun's) writes no file
