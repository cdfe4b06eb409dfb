"""The policy in the DeepSpeed config: a ``"ccoll"`` block that ``deepspeed.initialize`` honours.

DeepSpeed users configure today's compression (ZeRO++'s ``zero_quantized_gradients``, 1-bit Adam) in the
DeepSpeed JSON, so ccoll reads its policy from there too::

    {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2},
     "ccoll": {"policy": "hybrid"}}

``"policy"`` is a shipped policy's name, a YAML path, or the policy itself as an inline mapping (the
YAML's content as JSON). Under ``ccoll-run`` every rank wraps ``deepspeed.initialize`` as soon as it
imports deepspeed (ccoll/_activate); the wrapper reads the block of the config it is given (``config=``,
``config_params=``, or ``args.deepspeed_config``: a dict or a JSON path, as DeepSpeed accepts them) and
installs ``ccoll.patch`` with it before the engine is built, so the engine's groups and its first
collectives are already under ccoll. DeepSpeed ignores the key. A config without the block leaves
things as they were; a block that disagrees with a policy already installed (``--policy`` /
``CCOLL_POLICY``) is a PolicyError naming both, never a silent choice of one.
"""
from __future__ import annotations

import functools
import json
import os
from typing import Any, Callable, Mapping

from ..errors import PolicyError

#: the key of ccoll's block in a DeepSpeed config, and the keys the block may hold
KEY = "ccoll"
BLOCK_KEYS = ("policy",)


def read_config(config: Any) -> "Mapping | None":
    """A DeepSpeed config as DeepSpeed accepts it (a dict, or a path to a JSON file) -> the mapping, or
    None for anything else (DeepSpeed itself reports those)."""
    if isinstance(config, Mapping):
        return config
    if isinstance(config, (str, os.PathLike)) and os.path.isfile(config):
        try:
            with open(config) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise PolicyError(f"ccoll: cannot read the DeepSpeed config {os.fspath(config)!r}: {e}") from None
        return data if isinstance(data, Mapping) else None
    return None


def policy_spec(config: Any) -> "str | Mapping | None":
    """The ``"policy"`` of ``config``'s ccoll block (a name, a path or a mapping), or None without one.
    A relative path is taken from the config file's folder when the config is a file, as users write
    paths next to their JSON."""
    data = read_config(config)
    if data is None or KEY not in data:
        return None
    block = data[KEY]
    where = f"the {KEY!r} block of the DeepSpeed config"
    if not isinstance(block, Mapping):
        raise PolicyError(f"{where} must be a mapping like {{\"policy\": \"hybrid\"}}, got {block!r}")
    unknown = sorted(set(block) - set(BLOCK_KEYS))
    if unknown:
        raise PolicyError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(BLOCK_KEYS)}")
    if "policy" not in block:
        raise PolicyError(f"{where} names no policy: add \"policy\": a shipped name (e.g. \"hybrid\"), a YAML "
                          f"path or an inline mapping")
    spec = block["policy"]
    if isinstance(spec, str) and not isinstance(config, Mapping) and not os.path.isabs(spec):
        beside = os.path.join(os.path.dirname(os.path.abspath(config)), spec)
        if os.path.isfile(beside):
            spec = beside
    if not isinstance(spec, (str, Mapping)) or not spec:
        raise PolicyError(f"{where}: \"policy\" must be a name, a path or a mapping, got {spec!r}")
    return spec


def load_policy(config: Any):
    """The Policy of ``config``'s ccoll block (validated), or None without a block."""
    spec = policy_spec(config)
    if spec is None:
        return None
    from ..policy import Policy, load

    if isinstance(spec, Mapping):
        return Policy.from_dict(dict(spec), source="DeepSpeed config 'ccoll' block")
    return load(spec)


def config_of(args: Any, kwargs: Mapping) -> Any:
    """Which config ``deepspeed.initialize(*args, **kwargs)`` will use, by its own precedence:
    ``config``, then ``config_params``, then ``args.deepspeed_config``."""
    config = kwargs.get("config")
    if config is None:
        config = kwargs.get("config_params")
    if config is None:
        ds_args = kwargs.get("args", args[0] if args else None)
        config = getattr(ds_args, "deepspeed_config", None)
    return config


def honour(config: Any) -> None:
    """Install ccoll.patch with ``config``'s ccoll block; nothing without one. A patch already installed
    with the same rules (``ccoll-run --policy`` naming the same policy) stays; other rules are an error."""
    policy = load_policy(config)
    if policy is None:
        return
    from .install import current_policy, install

    current = current_policy()
    if current is None:
        install(policy)
    elif current.fingerprint() != policy.fingerprint():
        raise PolicyError(f"ccoll: two policies: {current.source} is installed (ccoll-run --policy / CCOLL_POLICY) "
                          f"and the DeepSpeed config's {KEY!r} block says {policy.source}; keep one of them")


def wrap_initialize(module: Any) -> None:
    """Make ``module.initialize`` (deepspeed's) honour the ccoll block first, for the life of the process
    (a ``ccoll-run`` row of ccoll/frameworks' table: ``ccoll.patch.uninstall`` leaves it). Idempotent."""
    from ..frameworks import replace

    original: Callable = module.initialize
    if getattr(original, "__ccoll_original__", None) is not None:
        return

    @functools.wraps(original)
    def initialize(*args, **kwargs):
        honour(config_of(args, kwargs))
        return original(*args, **kwargs)

    initialize.__ccoll_original__ = original
    replace(module, "initialize", initialize)
