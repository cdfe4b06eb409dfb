"""The GPU check, shipped with the package so that a pip-installed ccoll can check the machine it runs on:
``python -m ccoll.gpucheck`` (``make gpu-check`` in a checkout) times the GPU path and compares its bytes with
digests computed on the CPU (``expected.json``); ``--cpu-selftest`` is CI's run of the same comparison without
a GPU. ``matrix``: the specs and inputs; ``expected``: the digests (``make gpu-expected`` writes them);
``check``: the phases, the report and the command line. Nothing else in ccoll imports this package."""
