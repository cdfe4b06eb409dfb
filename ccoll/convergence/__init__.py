"""Convergence comparison of ccoll policies on a small GPT in GPT-NeoX's layout (``python -m ccoll.convergence``).

model.py (mpu-style TP layers in a DeepSpeed PipelineModule), data.py (byte-level stdlib text),
worker.py (one rank), runner.py (launch and collect one run's ranks), compare.py (multi-seed statistics and
verdicts), report.py (csv/png/json/md).
Nothing here is imported by ``import ccoll``.
"""
