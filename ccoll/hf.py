"""ccoll's figures in Hugging Face Trainer's logs, so ``report_to`` (TensorBoard, W&B, ...) and
``trainer.state.log_history`` receive them next to the loss.

At every Trainer log (``logging_steps``, and the end-of-training metrics), :class:`CcollCallback` adds, per
dimension that carried traffic on this rank (:func:`figures`; cumulative since the start, native calls
included, so the ratio is what the dimension really saved)::

    ccoll/dp_raw_MB   ccoll/dp_wire_MB   ccoll/dp_ratio

Under ``ccoll-run`` (any ``ccoll.patch.install``) nothing is to be done: ccoll.auto attaches the callback
to every Trainer built while ccoll is installed. Otherwise, one line::

    ccoll.hf.attach(trainer)

Why ``attach`` and not ``Trainer(callbacks=[CcollCallback()])`` / ``trainer.add_callback``: Trainer calls
its callbacks in list order, the ``report_to`` integrations before the user's, with one ``logs`` dict;
figures added by a callback that runs after TensorBoard's would reach the console but not TensorBoard.
``attach`` puts the callback first. (``trainer.state.log_history`` gets the figures either way: Trainer
appends its copy of ``logs`` before the callbacks run, and the callback adds them to that entry too.)

Importing this module imports transformers; ``import ccoll`` never imports it.
"""
from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from . import stats as _stats

__all__ = ["CcollCallback", "attach", "figures"]


def figures() -> dict[str, float]:
    """``ccoll/<dim>_raw_MB``, ``ccoll/<dim>_wire_MB`` (10^6 bytes, this rank's, since the start) and
    ``ccoll/<dim>_ratio`` (raw / wire) for every dimension in ccoll.stats."""
    out: dict[str, float] = {}
    for dim, t in _stats.by_dimension().items():
        raw, wire = t["raw_bytes"], t["wire_bytes"]
        out[f"ccoll/{dim}_raw_MB"] = raw / 1e6
        out[f"ccoll/{dim}_wire_MB"] = wire / 1e6
        out[f"ccoll/{dim}_ratio"] = raw / wire if wire else 1.0
    return out


class CcollCallback(TrainerCallback):
    """Adds :func:`figures` to every Trainer log (see the module docstring for where to put it)."""

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if logs is None:
            return
        mine = figures()
        logs.update(mine)
        # Trainer.log appended {**logs, "step": global_step} to log_history just before calling us
        history = getattr(state, "log_history", None)
        if history and history[-1] is not logs and history[-1].get("step") == state.global_step:
            history[-1].update(mine)


def attach(trainer: Any) -> CcollCallback:
    """Make ``trainer`` log ccoll's figures: a :class:`CcollCallback` first in its callback list (one
    already there, e.g. from ``callbacks=[...]``, is moved first instead of adding a second). Returns it."""
    callbacks = trainer.callback_handler.callbacks
    mine = next((c for c in callbacks if isinstance(c, CcollCallback)), None)
    if mine is None:
        mine = CcollCallback()
    else:
        callbacks.remove(mine)
    callbacks.insert(0, mine)
    return mine
