"""Hugging Face Trainer: every Trainer built while installed gets :class:`ccoll.hf.CcollCallback` first among
its callbacks (``Trainer.__init__``, wrapped when the process imports ``transformers.trainer``; ccoll never
imports transformers). Why the constructor: Trainer builds its callback list there and offers no other
place to join it, and the callback must come before the integrations to reach them. Places no group."""
from __future__ import annotations

import functools

from ..log import logger
from .patches import IMPORT, Patch, Wrapping, replace, replaced, when_imported

NAME = "HF Trainer"
SOURCE = None
DESCS: dict = {}
MODULE = "transformers.trainer"
OWNER = f"{MODULE}.Trainer"
signature = None

PATCHES = (
    Patch(NAME, OWNER, ("__init__",), IMPORT, "ccoll.frameworks.hf -> ccoll.hf.attach",
          "ccoll's per-dimension figures in every Trainer log and report_to integration", module=MODULE),
)


def present() -> bool:
    import sys

    return MODULE in sys.modules


def place(placer, default_pg) -> int:
    return 1


def _wrap() -> None:
    from .. import auto

    if not auto.installed():
        return
    try:
        from transformers.trainer import Trainer
    except ImportError as e:  # a Trainer-less transformers
        logger.debug("ccoll: transformers Trainer not wrapped (%s)", e)
        return
    if replaced(Trainer, "__init__"):
        return
    init = Trainer.__init__

    @functools.wraps(init)  # frameworks read Trainer's signature (inspect follows __wrapped__)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if auto.installed():
            from ..hf import attach

            attach(self)

    replace(Trainer, "__init__", __init__)


def install(w: Wrapping) -> None:
    when_imported(MODULE, _wrap)


def uninstall(w: Wrapping) -> None:
    pass
