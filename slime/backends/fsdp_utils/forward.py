"""Forward passes over micro-batches: response-span log-probs, entropies, OPD KLs and critic values.

Layout (docs/en/developer_guide/architecture.md): ``tokens = prompt + response``; the log-prob of token
``i`` comes from the logits at ``i - 1``, so a sample's response span is
``logits[prompt_len - 1 : len(tokens) - 1]`` gathered at ``tokens[prompt_len:]``. Sequences are padded on
the right, so positions 0..len-1 of every row are the real tokens and the default position ids hold.
Logits are divided by the temperature before the log-softmax, for every model alike.

Two ways to get there (``--log-probs-chunk-size``):

* chunked (``chunk_size >= 1``, the default): the decoder runs once, then only the response positions'
  final hidden states go through the LM head, ``chunk_size`` positions at a time
  (``chunked_head``), so no ``[sequence, vocab]`` float32 rows are ever held. The head runs inside a
  forward method registered with FSDP (``attach_response_head``), so the root's parameters (embeddings,
  final norm, head) are gathered while it runs and their gradients are reduced like any forward's.
* whole rows (``chunk_size <= 0``): ``model(...).logits`` and a float32 log-softmax of every position,
  the original path, kept as the reference the chunked one is tested against.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch
from torch.distributed.fsdp import register_fsdp_forward_method

from slime.backends.fsdp_utils import opd_kl
from slime.backends.fsdp_utils.chunked_head import FullTeacher, HeadSpec, TopkTeacher, head_stats
from slime.utils.types import Sample

RESPONSE_HEAD = "slime_response_head"
# Config fields that change logits after lm_head; the chunked head does not apply them.
_UNSUPPORTED_HEAD_OPTIONS = ("final_logit_softcapping", "logit_scale")


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
    """Per sample: the rows of ``hidden_or_logits[b]`` that predict its response tokens."""
    for row, sample in enumerate(samples):
        yield hidden_or_logits[row, sample.prompt_length - 1:len(sample.tokens) - 1]


def response_log_softmax(model, samples: list[Sample], *, temperature: float, pad_token_id: int,
                         device) -> list[torch.Tensor]:
    """Per sample, the float32 log-softmax rows ``[response_length, vocab]`` of its response span.

    Gradients flow when called outside ``torch.no_grad``. Holds whole rows: the unchunked path.
    """
    input_ids, attention_mask = collate(samples, pad_token_id, device)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    return [torch.log_softmax(rows.float() / temperature, dim=-1) for rows in _response_rows(logits, samples)]


def response_targets(samples: list[Sample], device) -> list[torch.Tensor]:
    return [torch.as_tensor(s.tokens[s.prompt_length:], dtype=torch.long, device=device) for s in samples]


def gather_log_probs(rows: list[torch.Tensor], targets: list[torch.Tensor]) -> list[torch.Tensor]:
    return [logp.gather(-1, t.unsqueeze(-1)).squeeze(-1) for logp, t in zip(rows, targets)]


def entropies_of(rows: list[torch.Tensor]) -> list[torch.Tensor]:
    return [-(logp.exp() * logp).sum(-1) for logp in rows]


# ---------------------------------------------------------------------------- the chunked path
def _response_head(self, input_ids, attention_mask, callback):
    """Decoder, then ``callback(final hidden states [batch, seq, hidden], lm_head)``: one FSDP forward."""
    body = getattr(self, self.base_model_prefix)
    hidden = body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    return callback(hidden, self.get_output_embeddings())


def attach_response_head(model) -> None:
    """Give a (sharded) causal LM the forward method the chunked path calls; a no-op for other models."""
    if getattr(model, "get_output_embeddings", None) is None or model.get_output_embeddings() is None:
        return
    model.slime_unsupported_head = [k for k in _UNSUPPORTED_HEAD_OPTIONS if getattr(model.config, k, None)]
    setattr(model, RESPONSE_HEAD, types.MethodType(_response_head, model))
    # FSDP gathers the root's parameters around forward() only; this makes it do so around our method too.
    register_fsdp_forward_method(model, RESPONSE_HEAD)


def _run_head(model, samples, pad_token_id, device, fn):
    """``fn(response rows [positions, hidden], lm_head)`` over the response positions of ``samples``."""
    if getattr(model, "slime_unsupported_head", None):
        raise ValueError(f"--log-probs-chunk-size: {type(model).__name__} sets {model.slime_unsupported_head}, "
                         "which the chunked head does not apply; pass --log-probs-chunk-size -1")
    if not hasattr(model, RESPONSE_HEAD):
        attach_response_head(model)  # an unsharded model (tests, benchmarks)
    input_ids, attention_mask = collate(samples, pad_token_id, device)
    return getattr(model, RESPONSE_HEAD)(
        input_ids, attention_mask, lambda hidden, head: fn(torch.cat(list(_response_rows(hidden, samples))), head))


def _flat_targets(samples, device) -> torch.Tensor:
    return torch.cat(response_targets(samples, device))


def split_per_sample(column: torch.Tensor, samples) -> list[torch.Tensor]:
    """A flat per-position column cut back into one tensor per sample (response lengths)."""
    return list(column.split([s.response_length for s in samples]))


# ---------------------------------------------------------------------------- teachers for the KL
@dataclass
class TeacherRows:
    """Unchunked: the teacher's whole log-softmax rows per sample."""

    rows: list[torch.Tensor]


def teacher_for_kl(model, samples, *, temperature, pad_token_id, device,
                   chunk_size) -> tuple[list[torch.Tensor], FullTeacher | TeacherRows]:
    """A frozen in-trainer teacher on ``samples``: its log-probs of the sampled tokens, and what the
    student's whole-distribution KL is taken against (hidden states + head weight, or whole rows)."""
    with torch.no_grad():
        if chunk_size <= 0:
            rows = response_log_softmax(model, samples, temperature=temperature, pad_token_id=pad_token_id,
                                        device=device)
            return gather_log_probs(rows, response_targets(samples, device)), TeacherRows(rows)

        def keep(rows, head):
            # Copies: the teacher's gathered head weight is freed once its forward ends.
            return rows, head.weight.detach().clone(), None if head.bias is None else head.bias.detach().clone()

        teacher = FullTeacher(*_run_head(model, samples, pad_token_id, device, keep))
        spec = HeadSpec(_flat_targets(samples, device), temperature, chunk_size)
        log_probs = head_stats(teacher.hidden, teacher.weight, teacher.bias, spec)[:, 0]
    return split_per_sample(log_probs, samples), teacher


def topk_teacher(samples, device) -> TopkTeacher:
    """The server teacher's top-k log-probs of every response position (``metadata["teacher_topk"]``).

    A sample without them is accepted only if none of its tokens is trained (its KL is then 0).
    """
    found = [(s.metadata or {}).get("teacher_topk") for s in samples]
    k = next((len(t["ids"][0]) for t in found if t is not None and t["ids"]), 1)
    ids, log_probs, valid = [], [], []
    for sample, topk in zip(samples, found):
        n = sample.response_length
        if topk is None or len(topk["ids"]) != n:
            if sample.loss_mask is not None and not any(sample.loss_mask):
                # Placeholder rows (k distinct ids, finite log-probs) whose KL is masked to 0.
                ids.append(torch.arange(k).repeat(n, 1))
                log_probs.append(torch.full((n, k), -float(torch.log(torch.tensor(k + 1.0)))))
                valid.append(torch.zeros(n, dtype=torch.bool))
                continue
            raise ValueError(f"sample {sample.index}: no teacher top-k log-probs of response length {n} "
                             "(--opd-teacher-top-k needs the teacher server's top_logprobs_num and "
                             "on_policy_distillation.post_process_rewards)")
        ids.append(torch.tensor(topk["ids"], dtype=torch.long))
        log_probs.append(torch.tensor(topk["logprobs"], dtype=torch.float32))
        valid.append(torch.ones(n, dtype=torch.bool))
    return TopkTeacher(torch.cat(ids).to(device), torch.cat(log_probs).to(device), torch.cat(valid).to(device))


# ---------------------------------------------------------------------------- scoring
@dataclass
class Scores:
    """Per sample (response span): log-probs, and entropies / reverse KL to the teacher when asked."""

    log_probs: list[torch.Tensor]
    entropy: list[torch.Tensor] | None = None
    kl: list[torch.Tensor] | None = None


def _unchunked_kl(rows, samples, teacher) -> list[torch.Tensor]:
    if isinstance(teacher, TeacherRows):
        return [opd_kl.full_reverse_kl(s, t) for s, t in zip(rows, teacher.rows)]
    out, start = [], 0
    for logp, sample in zip(rows, samples):
        sl = slice(start, start + sample.response_length)
        start = sl.stop
        out.append(teacher.kl(logp, sl))
    return out


def score(model, samples: list[Sample], *, temperature: float, pad_token_id: int, device, chunk_size: int,
          entropy: bool = False, teacher: FullTeacher | TopkTeacher | TeacherRows | None = None) -> Scores:
    """Response-span log-probs of ``model`` on ``samples`` (float32), with per-token entropies and the
    whole-distribution reverse KL to ``teacher`` when asked. Gradients flow outside ``torch.no_grad``."""
    if chunk_size <= 0:
        rows = response_log_softmax(model, samples, temperature=temperature, pad_token_id=pad_token_id,
                                    device=device)
        return Scores(gather_log_probs(rows, response_targets(samples, device)),
                      entropies_of(rows) if entropy else None,
                      _unchunked_kl(rows, samples, teacher) if teacher is not None else None)
    if isinstance(teacher, TeacherRows):
        raise ValueError("a chunked score needs the teacher as hidden states (teacher_for_kl with chunk_size >= 1)")
    spec = HeadSpec(_flat_targets(samples, device), temperature, chunk_size, entropy, teacher)
    out = _run_head(model, samples, pad_token_id, device,
                    lambda rows, head: head_stats(rows, head.weight, head.bias, spec))
    cols = [split_per_sample(out[:, c], samples) for c in range(spec.columns)]
    return Scores(cols[0], cols[1] if entropy else None, cols[-1] if teacher is not None else None)


def values(critic, samples: list[Sample], *, pad_token_id: int, device) -> list[torch.Tensor]:
    """Critic values aligned with the response tokens: the value of the state before each token."""
    input_ids, attention_mask = collate(samples, pad_token_id, device)
    scores = critic(input_ids=input_ids, attention_mask=attention_mask)
    return [rows.float() for rows in _response_rows(scores, samples)]
