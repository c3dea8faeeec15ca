"""Next-token sampling for a batch whose rows carry their own temperature, top-k, top-p and generator.

Log-prob convention (SGLang's default, ``SGLANG_RETURN_ORIGINAL_LOGPROB`` unset): the log-prob returned
for a sampled token is ``log_softmax(logits / temperature)`` at that token, taken *before* top-k / top-p
truncation. Greedy rows (temperature < 1e-6 or top_k == 1) use temperature 1, as SGLang does. A trainer
that recomputes log-probs at the rollout temperature therefore sees the same numbers whenever top_p = 1
and top_k = -1.

Reproducibility: each row draws its one uniform number from its own ``torch.Generator`` and picks the
token by inverse CDF over its own probabilities, so a seeded request yields the same tokens whatever
else shares its batch (up to float rounding of the batched forward). :func:`sample_rows` samples each
row alone, so not even the rounding of the batched softmax, sort and cumsum can depend on the batch
(deterministic inference).
"""

from __future__ import annotations

import torch

from slime.backends.hf_engine.protocol import SamplingParams


def make_generator(seed: int) -> torch.Generator:
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
    return gen


def sample_next(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator],
                top_ks: list[int] | None = None, id_lists: list | None = None):
    """Sample one token per row of ``logits`` [B, V]. Returns (token_ids [B], log-probs [B], tops) on CPU,
    plus ``asked`` when ``id_lists`` is given.

    ``tops[i]`` is None, or with ``top_ks[i]`` > 0 the row's ``top_ks[i]`` largest log-probs and their
    token ids (two lists), taken from the same log-probs as the returned one, as SGLang's sampler does.
    ``asked[i]`` is None, or with ``id_lists[i]`` the row's log-probs of those token ids (one list).
    """
    logits = logits.float()
    batch = logits.shape[0]
    greedy = torch.tensor([p.greedy for p in params], dtype=torch.bool)
    temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], dtype=torch.float32)
    logp = torch.log_softmax(logits / temps.to(logits.device)[:, None], dim=-1)
    tokens = torch.argmax(logits, dim=-1).cpu()

    if not bool(greedy.all()):
        rows = (~greedy).nonzero().flatten()
        probs = logp[rows].exp()
        top_k = torch.tensor([params[i].top_k for i in rows.tolist()])
        top_p = torch.tensor([params[i].top_p for i in rows.tolist()], dtype=torch.float32)
        truncate = bool((top_k > 0).any() or (top_p < 1.0).any())
        if truncate:
            probs, order = probs.sort(dim=-1, descending=True)
            rank = torch.arange(probs.shape[-1])[None, :]
            limit = torch.where(top_k > 0, top_k, probs.shape[-1])[:, None]
            # Keep a token while the mass strictly before it is below top_p; the first token always stays.
            before = probs.cumsum(-1) - probs
            keep = (rank < limit) & (before < top_p[:, None])
            keep[:, 0] = True
            probs = probs * keep
        cdf = probs.cumsum(-1)
        uniform = torch.stack([torch.rand((), generator=generators[i]) for i in rows.tolist()])
        target = (uniform * cdf[:, -1]).unsqueeze(-1)
        picked = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
        if truncate:
            picked = order.gather(-1, picked[:, None]).squeeze(-1)
        tokens[rows] = picked.cpu()

    chosen = logp.gather(-1, tokens.to(logp.device)[:, None]).squeeze(-1).cpu()
    assert chosen.shape[0] == batch
    tops = [None] * batch
    if top_ks and max(top_ks) > 0:
        # One topk at the largest k for the rows that ask, each row then cut to its own k.
        rows = [i for i, k in enumerate(top_ks) if k > 0]
        values, indices = logp[rows].topk(max(top_ks), dim=-1)
        for row, vals, ids in zip(rows, values.tolist(), indices.tolist()):
            tops[row] = (vals[:top_ks[row]], ids[:top_ks[row]])
    if id_lists is None:
        return tokens, chosen, tops
    asked = [None if not ids else logp[row, torch.tensor(ids, device=logp.device)].tolist()
             for row, ids in enumerate(id_lists)]
    return tokens, chosen, tops, asked


def sample_rows(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator],
                top_ks: list[int] | None = None, id_lists: list | None = None):
    """:func:`sample_next` one row at a time (same arguments and results): batch-invariant sampling."""
    top_ks = top_ks or [0] * len(params)
    parts = [sample_next(logits[i:i + 1], [params[i]], [generators[i]], [top_ks[i]],
                         None if id_lists is None else [id_lists[i]]) for i in range(len(params))]
    tokens = torch.cat([p[0] for p in parts])
    chosen = torch.cat([p[1] for p in parts])
    tops = [p[2][0] for p in parts]
    if id_lists is None:
        return tokens, chosen, tops
    return tokens, chosen, tops, [p[3][0] for p in parts]
