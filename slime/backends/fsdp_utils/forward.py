"""Forward passes over micro-batches: response-span log-probs, entropies and critic values.

Layout (docs/en/developer_guide/architecture.md): ``tokens = prompt + response``; the log-prob of token
``i`` comes from the logits at ``i - 1``, so a sample's response span is
``logits[prompt_len - 1 : len(tokens) - 1]`` gathered at ``tokens[prompt_len:]``. Sequences are padded on
the right, so positions 0..len-1 of every row are the real tokens and the default position ids hold.
Logits are divided by the temperature before the log-softmax, for every model alike.
"""

from __future__ import annotations

import torch

from slime.utils.types import Sample


def collate(samples: list[Sample], pad_token_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` and ``attention_mask`` of shape ``[batch, longest]``."""
    longest = max(len(s.tokens) for s in samples)
    input_ids = torch.full((len(samples), longest), int(pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros((len(samples), longest), dtype=torch.long)
    for row, sample in enumerate(samples):
        if sample.response_length < 1 or sample.prompt_length < 1:
            raise ValueError(f"sample {sample.index}: needs at least one prompt token and one response token "
                             f"(prompt {sample.prompt_length}, response {sample.response_length})")
        input_ids[row, :len(sample.tokens)] = torch.as_tensor(sample.tokens, dtype=torch.long)
        attention_mask[row, :len(sample.tokens)] = 1
    return input_ids.to(device), attention_mask.to(device)


def _response_rows(hidden_or_logits: torch.Tensor, samples: list[Sample]):
    """Per sample: the rows of ``hidden_or_logits[b]`` that predict its response tokens, and those tokens."""
    for row, sample in enumerate(samples):
        start, end = sample.prompt_length - 1, len(sample.tokens) - 1
        targets = torch.as_tensor(sample.tokens[sample.prompt_length:], dtype=torch.long,
                                  device=hidden_or_logits.device)
        yield hidden_or_logits[row, start:end], targets


def response_log_softmax(model, samples: list[Sample], *, temperature: float, pad_token_id: int,
                         device) -> list[torch.Tensor]:
    """Per sample, the float32 log-softmax rows ``[response_length, vocab]`` of its response span.

    Gradients flow when called outside ``torch.no_grad``.
    """
    input_ids, attention_mask = collate(samples, pad_token_id, device)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    return [torch.log_softmax(rows.float() / temperature, dim=-1) for rows, _ in _response_rows(logits, samples)]


def response_targets(samples: list[Sample], device) -> list[torch.Tensor]:
    return [torch.as_tensor(s.tokens[s.prompt_length:], dtype=torch.long, device=device) for s in samples]


def gather_log_probs(rows: list[torch.Tensor], targets: list[torch.Tensor]) -> list[torch.Tensor]:
    return [logp.gather(-1, t.unsqueeze(-1)).squeeze(-1) for logp, t in zip(rows, targets)]


def entropies_of(rows: list[torch.Tensor]) -> list[torch.Tensor]:
    return [-(logp.exp() * logp).sum(-1) for logp in rows]


def log_probs_and_entropy(model, samples: list[Sample], *, temperature: float, pad_token_id: int, device,
                          with_entropy: bool = False) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Response-span log-probs (and per-token entropies) of ``model`` on ``samples``.

    Gradients flow when called outside ``torch.no_grad``. Computed in float32 whatever the model dtype.
    """
    rows = response_log_softmax(model, samples, temperature=temperature, pad_token_id=pad_token_id, device=device)
    log_probs = gather_log_probs(rows, response_targets(samples, rows[0].device if rows else device))
    return log_probs, entropies_of(rows) if with_entropy else None


def values(critic, samples: list[Sample], *, pad_token_id: int, device) -> list[torch.Tensor]:
    """Critic values aligned with the response tokens: the value of the state before each token."""
    input_ids, attention_mask = collate(samples, pad_token_id, device)
    scores = critic(input_ids=input_ids, attention_mask=attention_mask)
    return [rows.float() for rows, _ in _response_rows(scores, samples)]
