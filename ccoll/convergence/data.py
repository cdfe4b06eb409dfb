"""Byte-level training text that every machine has: the Python standard library's own source.

Why bytes: a 256-symbol vocabulary needs no tokenizer download, and the loss is directly comparable
across machines with the same Python version. Why the stdlib: real, varied text (code, comments,
docstrings) that is always installed. The file order is sorted and the sampling is seeded, so every
policy in a comparison sees exactly the same batches in the same order.
"""
from __future__ import annotations

import os
import sysconfig

import torch

from ..errors import CcollError

VOCAB_SIZE = 256


def stdlib_files() -> list[str]:
    """The stdlib's top-level ``*.py`` files, sorted by name (deterministic across runs)."""
    root = sysconfig.get_paths()["stdlib"]
    return sorted(os.path.join(root, n) for n in os.listdir(root) if n.endswith(".py"))


def load_corpus(path: str | None = None, max_nbytes: int = 8 << 20) -> torch.Tensor:
    """1-D uint8 tensor of the corpus: ``path`` if given, else the stdlib sources concatenated.

    ``max_nbytes`` caps memory (every rank holds its own copy)."""
    if path is not None:
        try:
            with open(path, "rb") as f:
                raw = f.read(max_nbytes)
        except OSError as e:
            raise CcollError(f"--data {path!r}: cannot read ({e.strerror})") from e
    else:
        chunks, total = [], 0
        for name in stdlib_files():
            with open(name, "rb") as f:
                b = f.read()
            chunks.append(b)
            total += len(b)
            if total >= max_nbytes:
                break
        raw = b"".join(chunks)[:max_nbytes]
        if not raw:
            raise CcollError(f"no Python sources found in {sysconfig.get_paths()['stdlib']!r}; pass --data FILE")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()


def split_corpus(corpus: torch.Tensor, heldout_fraction: float = 0.05) -> tuple[torch.Tensor, torch.Tensor]:
    """(training text, held-out text): the last ``heldout_fraction`` of the corpus is never trained on.

    A contiguous tail, not random windows: with the stdlib corpus it is whole files the model never saw,
    so the validation loss measures generalisation, not memorisation of overlapping windows."""
    if not 0.0 < heldout_fraction < 1.0:
        raise CcollError(f"held-out fraction must be in (0, 1), got {heldout_fraction}")
    cut = int(corpus.numel() * (1.0 - heldout_fraction))
    return corpus[:cut], corpus[cut:]


class BatchSampler:
    """Seeded random windows of ``seq_len + 1`` bytes: input = window[:-1], label = window[1:].

    Batch ``step`` for data-parallel rank ``dp_rank`` depends only on (seed, step, dp_rank), not on
    the policy or the pipeline/tensor layout, so runs are comparable sample for sample."""

    def __init__(self, corpus: torch.Tensor, seq_len: int, micro_batch: int, seed: int):
        if corpus.numel() < seq_len + 2:
            raise CcollError(f"corpus has {corpus.numel()} bytes; need more than seq_len + 1 = {seq_len + 1}")
        self.corpus = corpus.long()
        self.seq_len = seq_len
        self.micro_batch = micro_batch
        self.seed = seed
        self._offsets = torch.arange(seq_len + 1)

    def micro_batch_at(self, step: int, dp_rank: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + step) * 65_537 + dp_rank * 257 + micro)
        starts = torch.randint(0, self.corpus.numel() - self.seq_len - 1, (self.micro_batch,), generator=g)
        window = self.corpus[starts[:, None] + self._offsets]
        return window[:, :-1].contiguous(), window[:, 1:].contiguous()

    def iterator(self, dp_rank: int, micro_batches_per_step: int, start_step: int = 0):
        """Endless iterator in the order DeepSpeed's pipeline engine pulls micro-batches."""
        step = start_step
        while True:
            for m in range(micro_batches_per_step):
                yield self.micro_batch_at(step, dp_rank, m)
            step += 1
