"""The transformers model behind the engine: batched scoring, prefill and one-step decode.

Batches are left-padded: every row ends in the last column, so a decode step feeds one column for all
rows. Each row carries its own position ids (count of real tokens before it), and the 2-D attention
mask hides the padding, so a row's numbers do not depend on what else is in the batch (up to float
rounding). The KV cache is a transformers ``DynamicCache`` whose per-layer tensors this module pads,
concatenates and slices when rows join or leave a running batch.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F


def _left_pad(seqs: list[list[int]], pad_id: int):
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s):] = 1
    return ids, mask


def _cache_of(out):
    # transformers 5 names the returned cache ``cache``; older releases ``past_key_values``.
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


class Span(NamedTuple):
    """One row's input log-probs: the chosen tokens' [n], with top-k asked (values, ids) [n, k], and with
    ``token_ids_logprob`` asked the log-probs of those ids [n, m]."""

    logprobs: torch.Tensor
    top: tuple[torch.Tensor, torch.Tensor] | None = None
    asked: torch.Tensor | None = None


@dataclass
class DecodeBatch:
    """Rows being decoded together: their KV cache, attention mask and next position ids."""

    cache: object  # transformers DynamicCache, tensors [B, heads, T, head_dim]
    mask: torch.Tensor  # [B, T] 1 = real token
    next_pos: torch.Tensor  # [B] position id of the token fed at the next step

    @property
    def size(self) -> int:
        return self.mask.shape[0]

    def _layers(self):
        return self.cache.layers

    def merge(self, other: "DecodeBatch") -> None:
        """Append ``other``'s rows, left-padding whichever side is shorter."""
        width = max(self.mask.shape[1], other.mask.shape[1])

        def pad(t, dim_from_end):
            missing = width - t.shape[-dim_from_end]
            if missing == 0:
                return t
            spec = [0, 0] * (dim_from_end - 1) + [missing, 0]
            return F.pad(t, spec)

        for mine, theirs in zip(self._layers(), other._layers()):
            mine.keys = torch.cat([pad(mine.keys, 2), pad(theirs.keys, 2)], dim=0)
            mine.values = torch.cat([pad(mine.values, 2), pad(theirs.values, 2)], dim=0)
        self.mask = torch.cat([pad(self.mask, 1), pad(other.mask, 1)], dim=0)
        self.next_pos = torch.cat([self.next_pos, other.next_pos])

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in this order) and drop columns that are padding for every remaining row."""
        index = torch.tensor(rows, dtype=torch.long)
        self.mask = self.mask.index_select(0, index)
        self.next_pos = self.next_pos.index_select(0, index)
        used = self.mask.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else self.mask.shape[1]
        for layer in self._layers():
            layer.keys = layer.keys.index_select(0, index)[:, :, first:]
            layer.values = layer.values.index_select(0, index)[:, :, first:]
        self.mask = self.mask[:, first:]


class ModelRunner:
    """Owns the model and tokenizer; every method runs on the engine's worker thread."""

    def __init__(self, model_path: str, *, tokenizer_path: str | None = None, dtype: str = "float32",
                 device: str = "cpu", context_length: int | None = None):
        from transformers import AutoTokenizer

        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype)
        self.tokenizer_path = tokenizer_path or model_path
        self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        self.model_path = model_path
        self.model = self._load(model_path)
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.eos_token_id or 0
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else ([eos] if eos is not None else []))
        self.vocab_size = int(self.model.config.vocab_size)
        # SGLang's --context-length overrides the model's own (max_position_embeddings); None keeps it.
        self.context_length_arg = context_length
        self.context_len = int(context_length or getattr(self.model.config, "max_position_embeddings", 4096))
        # transformers 5 renamed the cache argument; older releases take past_key_values.
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def _load(self, path: str):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype, use_safetensors=True)
        return model.to(self.device).eval()

    def load_weights(self, path: str) -> None:
        """Load the weights of the HF checkpoint at ``path`` into the served model, in place (as SGLang's
        ``update_weights_from_disk``: only the ``*.safetensors`` files are read, the architecture stays).

        Every parameter must come with its name and shape (tied ones may be left out, as HF saves them);
        a name the model lacks, a missing one or a shape mismatch fails before any weight changes."""
        from pathlib import Path

        from safetensors.torch import load_file

        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise ValueError(f"{path}: no *.safetensors files")
        loaded = {}
        for f in files:
            loaded.update(load_file(str(f)))
        own = self.model.state_dict()
        unexpected = sorted(set(loaded) - set(own))
        tied = {name for name in own if name not in loaded and self._is_tied(name)}
        missing = sorted(set(own) - set(loaded) - tied)
        if unexpected or missing:
            raise ValueError(f"{path}: weights do not match the served model (missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]})")
        for name, tensor in loaded.items():
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ValueError(f"{path}: {name} has shape {tuple(tensor.shape)}, the served model "
                                 f"{tuple(own[name].shape)}")
        with torch.no_grad():
            for name, tensor in loaded.items():
                own[name].copy_(tensor.to(own[name].dtype))
        self.model_path = path

    def _is_tied(self, name: str) -> bool:
        # HF checkpoints of tied-embedding models leave the output projection out.
        if not getattr(self.model.config, "tie_word_embeddings", False):
            return False
        out = self.model.get_output_embeddings()
        return out is not None and self.model.state_dict()[name].data_ptr() == out.weight.data_ptr()

    # ------------------------------------------------------------------ forwards
    @torch.inference_mode()
    def score(self, seqs: list[list[int]], starts: list[int], top_ks: list[int] | None = None,
              id_lists: list | None = None) -> list[Span]:
        """Log-probs of tokens ``start+1 .. end`` of each sequence (from one batched forward), with
        ``top_ks[i]`` > 0 the top ``top_ks[i]`` log-probs at those positions too, and with ``id_lists[i]``
        the log-probs of those token ids there."""
        ids, mask = _left_pad(seqs, self.pad_id)
        logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                            position_ids=_positions(mask).to(self.device), use_cache=False).logits
        width = ids.shape[1]
        top_ks = top_ks or [0] * len(seqs)
        id_lists = id_lists or [None] * len(seqs)
        return [self._span_logprobs(logits[i], ids[i], width - len(s), start, k, asked)
                for i, (s, start, k, asked) in enumerate(zip(seqs, starts, top_ks, id_lists))]

    @staticmethod
    def _span_logprobs(row_logits, row_ids, offset: int, start: int, top_k: int = 0,
                       asked: list[int] | None = None) -> Span:
        # Token j (j > start) is predicted by the logits at j - 1; offset skips the left padding.
        lo, hi = offset + start, row_ids.shape[0] - 1  # lo == hi (an empty span) when start is the last token
        logp = torch.log_softmax(row_logits[lo:hi].float(), dim=-1)
        chosen = logp.gather(-1, row_ids[lo + 1:hi + 1, None].to(logp.device)).squeeze(-1).cpu()
        # Top-k from the same [positions, V] tensor as the chosen log-probs (so top-1 equals the chosen
        # value where the token is the argmax); only the [positions, k] result outlives this row.
        top = None
        if top_k:
            values, indices = logp.topk(top_k, dim=-1)
            top = (values.cpu(), indices.cpu())
        asked_lps = logp[:, torch.tensor(asked, device=logp.device)].cpu() if asked else None
        return Span(chosen, top, asked_lps)

    @torch.inference_mode()
    def prefill(self, seqs: list[list[int]], starts: list[int | None], prefixes: list | None = None,
                top_ks: list[int] | None = None, id_lists: list | None = None):
        """Run prompts, returning (DecodeBatch, last-position logits [B, V], input :class:`Span` per row).

        ``starts[i]`` is None when row i needs no input log-probs (its span is None); full-sequence
        logits are only materialised when some row asks for them. ``top_ks[i]`` > 0 adds that many top
        log-probs per position of row i's span, ``id_lists[i]`` the log-probs of those ids. ``prefixes[i]`` is ``(n, entry)`` from the prefix
        cache: the KV of row i's first ``n`` tokens is taken from ``entry`` and only the rest is fed
        (``(0, None)`` for a row without one). A row's ``starts[i]`` must then be ``>= n``: its input
        log-probs (top-k included) need the logits from ``starts[i]`` on.
        """
        reused = [n for n, _ in prefixes] if prefixes else [0] * len(seqs)
        past_width = max(reused)
        fed = [s[n:] for s, n in zip(seqs, reused)]
        ids, fed_mask = _left_pad(fed, self.pad_id)
        if past_width:
            past, past_mask = self._past_cache(prefixes, past_width)
            mask = torch.cat([past_mask, fed_mask], dim=1)
            kwargs = {self._cache_kw: past}
        else:
            mask, kwargs = fed_mask, {}
        # Position ids count the real tokens before each one, the reused ones included.
        positions = _positions(fed_mask) + torch.tensor(reused, dtype=torch.long).view(-1, 1)
        need_all = any(s is not None for s in starts)
        out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                         position_ids=positions.to(self.device), use_cache=True,
                         logits_to_keep=0 if need_all else 1, **kwargs)
        width = ids.shape[1]
        top_ks = top_ks or [0] * len(seqs)
        id_lists = id_lists or [None] * len(seqs)
        input_lps = [None if start is None else
                     self._span_logprobs(out.logits[i], ids[i], width - len(f), start - n, k, asked)
                     for i, (f, start, n, k, asked) in enumerate(zip(fed, starts, reused, top_ks, id_lists))]
        batch = DecodeBatch(cache=_cache_of(out), mask=mask,
                            next_pos=torch.tensor([len(s) for s in seqs], dtype=torch.long))
        return batch, out.logits[:, -1, :], input_lps

    def _past_cache(self, prefixes, width: int):
        """A DynamicCache holding each row's reused KV, right-aligned in ``width`` columns, and its mask."""
        from transformers import DynamicCache

        template = next(entry for n, entry in prefixes if n)
        mask = torch.zeros((len(prefixes), width), dtype=torch.long)
        for row, (n, _) in enumerate(prefixes):
            mask[row, width - n:] = 1
        cache = DynamicCache()
        for layer, (k0, _) in enumerate(template.layers):
            shape = (len(prefixes), k0.shape[0], width, k0.shape[2])
            keys = torch.zeros(shape, dtype=k0.dtype, device=k0.device)
            values = torch.zeros_like(keys)
            for row, (n, entry) in enumerate(prefixes):
                if n:
                    keys[row, :, width - n:] = entry.layers[layer][0][:, :n]
                    values[row, :, width - n:] = entry.layers[layer][1][:, :n]
            cache.update(keys, values, layer)
        return cache, mask

    @staticmethod
    def row_kv(batch: "DecodeBatch", row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of one row's KV over its real columns, per layer ``[heads, tokens, head_dim]``."""
        cols = batch.mask[row].nonzero().view(-1)
        return [(layer.keys[row].index_select(1, cols.to(layer.keys.device)).contiguous(),
                 layer.values[row].index_select(1, cols.to(layer.values.device)).contiguous())
                for layer in batch.cache.layers]

    @torch.inference_mode()
    def decode(self, batch: DecodeBatch, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row; returns next-token logits [B, V] and grows the batch's cache."""
        batch.mask = torch.cat([batch.mask, torch.ones((batch.size, 1), dtype=batch.mask.dtype)], dim=1)
        out = self.model(input_ids=tokens.view(-1, 1).to(self.device), attention_mask=batch.mask.to(self.device),
                         position_ids=batch.next_pos.view(-1, 1).to(self.device), use_cache=True,
                         **{self._cache_kw: batch.cache})
        batch.cache = _cache_of(out)
        batch.next_pos = batch.next_pos + 1
        return out.logits[:, -1, :]
