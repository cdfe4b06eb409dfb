"""GPT-NeoX's training entry point with ccoll's compression patch installed first.

    cd <gpt-neox checkout>
    CCOLL_POLICY=<ccoll>/configs/hybrid.yaml python deepy.py <ccoll>/gpt_neox_patch/train.py configs/125M.yml configs/local_setup.yml

deepy.py hands this script to the DeepSpeed launcher in place of NeoX's train.py; on every rank it
1. loads the policy named by ``CCOLL_POLICY`` (NeoX rejects unknown YAML keys, so the policy travels in
   the environment) and fails before any work if it is missing or invalid;
2. installs ``ccoll.patch`` with the automatic resolver (:class:`ccoll.resolvers.AutoResolver`) before
   NeoX calls ``deepspeed.init_distributed``: the policy fingerprints are compared right after the
   process group comes up, and DeepSpeed's backend caches the wrapped all-gather/reduce-scatter; until
   ``mpu.initialize_model_parallel`` has built NeoX's groups every call uses the policy's ``default``
   rules (native in the shipped policies), then NeoX's data / model / pipe groups (found through
   ``megatron.mpu``'s topology) and the pipeline engine's WORLD send/recv are dp / tp / pp. An explicit
   ``MpuResolver(megatron.mpu)`` is still available for scripts that want exactly NeoX's groups;
3. runs NeoX's own ``train.py`` unchanged (same ``sys.argv``), as ``__main__``.

``GPT_NEOX_DIR`` names the NeoX checkout (default: the working directory, where deepy.py runs).
"""
from __future__ import annotations

import os
import runpy
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fail(msg: str) -> "None":
    raise SystemExit(f"gpt_neox_patch: {msg}")


def main() -> None:
    policy_path = os.environ.get("CCOLL_POLICY")
    if not policy_path:
        _fail("set CCOLL_POLICY=<policy.yaml> (e.g. configs/hybrid.yaml from the ccoll checkout)")
    neox_dir = os.path.abspath(os.environ.get("GPT_NEOX_DIR") or os.getcwd())
    neox_train = os.path.join(neox_dir, "train.py")
    if not os.path.isfile(neox_train) or not os.path.isdir(os.path.join(neox_dir, "megatron")):
        _fail(f"{neox_dir} is not a GPT-NeoX checkout (no train.py and megatron/); run deepy.py from the "
              "checkout or set GPT_NEOX_DIR")
    try:
        import ccoll  # noqa: F401
    except ImportError:
        sys.path.insert(0, _REPO)  # running from a ccoll checkout that is not pip-installed
    sys.path.insert(0, neox_dir)

    import ccoll.patch

    ccoll.patch.install(policy_path)  # automatic resolver: finds megatron.mpu's groups once they exist
    sys.argv[0] = neox_train
    runpy.run_path(neox_train, run_name="__main__")


if __name__ == "__main__":
    main()
