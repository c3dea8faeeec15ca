"""Reuse the KV cache of finished requests for later requests that start with the same tokens.

A multi-turn agent sends its whole history each turn: turn k+1's input is turn k's input, its output
and the new observation. Without reuse the engine prefills the history again every turn, so an
episode's prefill cost grows with the square of its length. SGLang avoids this with its radix cache;
this is the same idea at a small engine's scale.

When a generation request finishes, the scheduler stores the KV of every token it fed the model (its
input and all but its last output token), keyed by those tokens. A new request looks for the stored
entry sharing the longest common prefix with its input and prefills only the rest. The shared prefix
may be partial: samples of one prompt (``n_samples_per_prompt``) reuse each other's prompt. Entries
are evicted least recently used beyond a byte budget. New weights make every entry stale, so the
scheduler clears the cache at each weight update (and on ``/flush_cache``).

Only the KV tensors are kept, never logits: a request that asks for input log-probs inside the
shared prefix (``logprob_start_len`` before its end) cannot use it, and the lookup takes a limit.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

# Shorter matches save less than the bookkeeping of a mixed past/suffix prefill costs.
MIN_REUSE_TOKENS = 8


@dataclass
class CacheEntry:
    tokens: np.ndarray  # [n] the tokens whose KV is stored
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each [heads, n, head_dim]
    nbytes: int


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class PrefixCache:
    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"prefix cache size must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict[int, CacheEntry] = OrderedDict()
        self._next_id = 0
        self.nbytes = 0
        self.lookups = self.hits = self.reused_tokens = self.looked_up_tokens = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def lookup(self, input_ids: list[int], limit: int) -> tuple[int, CacheEntry | None]:
        """The entry sharing the longest prefix with ``input_ids``, and that length capped at ``limit``.

        ``limit`` is at most ``len(input_ids) - 1``: the last input token must be fed to get the logits
        of the first new token. Returns ``(0, None)`` when nothing worth reusing is stored.
        """
        self.lookups += 1
        self.looked_up_tokens += len(input_ids)
        if not self._entries or limit < MIN_REUSE_TOKENS:
            return 0, None
        query = np.asarray(input_ids, dtype=np.int64)
        best_len, best_id = 0, None
        for entry_id, entry in self._entries.items():
            if entry.tokens[0] != query[0]:
                continue
            n = common_prefix_len(entry.tokens, query)
            if n > best_len:
                best_len, best_id = n, entry_id
        best_len = min(best_len, limit)
        if best_id is None or best_len < MIN_REUSE_TOKENS:
            return 0, None
        self._entries.move_to_end(best_id)
        self.hits += 1
        self.reused_tokens += best_len
        return best_len, self._entries[best_id]

    def insert(self, tokens: list[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Store the KV of ``tokens`` (per layer ``[heads, len(tokens), head_dim]``), evicting LRU entries."""
        if not self.enabled or len(tokens) < MIN_REUSE_TOKENS:
            return
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if nbytes > self.max_bytes:
            return
        array = np.asarray(tokens, dtype=np.int64)
        # An entry that is a prefix of the new one adds nothing once the new one is stored.
        for entry_id in [i for i, e in self._entries.items()
                         if len(e.tokens) <= len(array) and common_prefix_len(e.tokens, array) == len(e.tokens)]:
            self.nbytes -= self._entries.pop(entry_id).nbytes
        while self._entries and self.nbytes + nbytes > self.max_bytes:
            self.nbytes -= self._entries.popitem(last=False)[1].nbytes
        self._entries[self._next_id] = CacheEntry(array, layers, nbytes)
        self._next_id += 1
        self.nbytes += nbytes

    def stats(self) -> dict:
        return {"entries": len(self._entries), "bytes": self.nbytes, "max_bytes": self.max_bytes,
                "lookups": self.lookups, "hits": self.hits, "reused_tokens": self.reused_tokens,
                "looked_up_tokens": self.looked_up_tokens}
