"""Batch-invariant numerics for ``--enable-deterministic-inference``: every sequence runs its own forward.

On CPU no batched layout gives per-row results bitwise equal to the single-row result: the matmul
kernels pick their blocking (and so the order of each row's sums) by the number of rows, and a padded
batch changes the length every attention row reduces over. So a request's numbers would depend on
which other requests shared its batch, which depends on arrival times. :class:`RowRunner` keeps the
scheduler's batching (admission, budgets, rows joining and leaving) but runs each row alone, unpadded:
a request's logits are a function of its own tokens only. The cost is one forward per row instead of
one per batch (``benchmarks/hf_engine_determinism.py``; the figure is in docs/en/engines.md).
"""

from __future__ import annotations

import torch


class RowBatch:
    """The running rows, each a one-row :class:`DecodeBatch` with its own unpadded KV cache."""

    def __init__(self, rows: list):
        self.rows = rows

    @property
    def size(self) -> int:
        return len(self.rows)

    def merge(self, other: "RowBatch") -> None:
        self.rows = self.rows + other.rows

    def keep(self, rows: list[int]) -> None:
        self.rows = [self.rows[i] for i in rows]


class RowRunner:
    """A :class:`ModelRunner` whose batched calls run one sequence per forward (same signatures).

    Everything else (tokenizer, model, ``load_weights``, ...) is the wrapped runner's own."""

    def __init__(self, runner):
        self.base = runner

    def __getattr__(self, name):
        return getattr(self.base, name)

    def score(self, seqs, starts, top_ks=None, id_lists=None):
        top_ks = top_ks or [0] * len(seqs)
        id_lists = id_lists or [None] * len(seqs)
        spans = []
        for seq, start, k, ids in zip(seqs, starts, top_ks, id_lists):
            extra = {"id_lists": [ids]} if ids else {}
            spans += self.base.score([seq], [start], [k], **extra)
        return spans

    def prefill(self, seqs, starts, prefixes=None, top_ks=None, id_lists=None):
        prefixes = prefixes or [(0, None)] * len(seqs)
        top_ks = top_ks or [0] * len(seqs)
        id_lists = id_lists or [None] * len(seqs)
        rows, logits, spans = [], [], []
        for seq, start, prefix, k, ids in zip(seqs, starts, prefixes, top_ks, id_lists):
            extra = {"id_lists": [ids]} if ids else {}
            batch, last, span = self.base.prefill([seq], [start], [prefix], [k], **extra)
            rows.append(batch)
            logits.append(last)
            spans += span
        return RowBatch(rows), torch.cat(logits), spans

    def decode(self, batch: RowBatch, tokens: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.base.decode(row, tokens[i:i + 1]) for i, row in enumerate(batch.rows)])

    def row_kv(self, batch: RowBatch, row: int):
        return self.base.row_kv(batch.rows[row], 0)
