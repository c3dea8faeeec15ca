"""Forward passes of a Megatron ``GPTModel`` for the trainer: response-span log-probs, entropies, KLs.

The decoder runs once per micro-batch (embedding, layers, final norm; ``GPTModel._preprocess`` and
``.decoder``, Megatron's own pieces); the LM head then runs on the response positions only, through the
chunked head the FSDP backend uses (``fsdp_utils.chunked_head``: closed-form gradients, a chunk of
positions at a time), on this rank's rows of the vocabulary-parallel output layer (``output_head``): the
head's log-softmax, picks and sums are completed over the tensor-parallel group, so no rank ever holds a
whole-vocabulary weight or row. Rows past the HF vocabulary (padding to a multiple of TP) are left out.

Batches are right-padded (``fsdp_utils.forward.collate``) and the mask is causal, so padding never
reaches a real position. Layout and temperature conventions: docs/en/developer_guide/architecture.md.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.utils.checkpoint

from slime.backends.fsdp_utils.chunked_head import WHOLE, FullTeacher, HeadSpec, TopkTeacher, Vocab, head_stats
from slime.backends.fsdp_utils.forward import Scores, collate, response_targets, split_per_sample
from slime.utils.types import Sample


def _tp_group():
    from megatron.core import parallel_state as ps

    return ps.get_tensor_model_parallel_group() if ps.get_tensor_model_parallel_world_size() > 1 else None


def output_head(model) -> tuple[torch.Tensor, Vocab]:
    """This rank's output-layer rows that hold real vocabulary ids, and which ids those are."""
    local = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights \
        else model.output_layer.weight
    vocab_size, group = model.slime_shape.vocab_size, _tp_group()
    if group is None:
        return local[:vocab_size], WHOLE
    start = dist.get_rank(group) * local.shape[0]
    held = max(0, min(local.shape[0], vocab_size - start))
    return local[:held], Vocab(start, held, group)


def enable_recompute(model) -> None:
    """Recompute each decoder layer in backward (torch.utils.checkpoint; --recompute-granularity full,
    uniform, 1 layer): only layer inputs stay alive. Used on every device instead of Megatron's recompute,
    whose CUDA-RNG bookkeeping cannot run on CPU. Idempotent."""
    for layer in model.decoder.layers:
        if getattr(layer, "slime_recompute", False):
            continue
        inner = layer.forward

        def checkpointed(*args, _inner=inner, **kwargs):
            if not torch.is_grad_enabled():
                return _inner(*args, **kwargs)
            return torch.utils.checkpoint.checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        layer.forward = checkpointed
        layer.slime_recompute = True


def final_hidden(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Final-norm hidden states ``[batch, seq, hidden]`` of right-padded ``input_ids`` ``[batch, seq]``."""
    batch, seq = input_ids.shape
    tp = model.config.tensor_model_parallel_size if model.config.sequence_parallel else 1
    pad = -seq % tp  # sequence parallel splits the sequence evenly across ranks
    if pad:
        input_ids = torch.cat([input_ids, input_ids.new_zeros(batch, pad)], dim=1)
    total = seq + pad
    positions = torch.arange(total, device=input_ids.device).unsqueeze(0).expand(batch, -1)
    causal = torch.triu(torch.ones(total, total, dtype=torch.bool, device=input_ids.device), 1).view(1, 1, total, total)
    pre = model._preprocess(input_ids=input_ids, position_ids=positions)
    hidden = model.decoder(hidden_states=pre[0], attention_mask=causal, rotary_pos_emb=pre[1],
                           rotary_pos_cos=pre[2], rotary_pos_sin=pre[3], sequence_len_offset=pre[4])
    if model.config.sequence_parallel:
        from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

        # The head hands every rank the whole (summed) gradient of these states, so backward only keeps
        # this rank's part of the sequence (no reduce-scatter, which would add the same gradient TP times).
        hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
    return hidden.transpose(0, 1)[:, :seq]  # Megatron runs [seq, batch, hidden]


def _response_rows(model, samples: list[Sample], device) -> torch.Tensor:
    input_ids, _ = collate(samples, 0, device)  # the pad id is never attended to (causal, right-padded)
    hidden = final_hidden(model, input_ids)
    return torch.cat([hidden[row, s.prompt_length - 1:len(s.tokens) - 1] for row, s in enumerate(samples)])


def _chunk(chunk_size: int, positions: int) -> int:
    return chunk_size if chunk_size > 0 else max(positions, 1)  # <= 0: one chunk, whole rows


def _autocast(device):
    # GPUs compute in bfloat16 against the float32 master weights; CPUs in float32.
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)


def score(model, samples: list[Sample], *, temperature: float, device, chunk_size: int, entropy: bool = False,
          teacher: FullTeacher | TopkTeacher | None = None) -> Scores:
    """Response-span log-probs (float32), with entropies / reverse KL to ``teacher`` when asked."""
    with _autocast(device):
        rows = _response_rows(model, samples, device)
        weight, vocab = output_head(model)
        targets = torch.cat(response_targets(samples, device))
        spec = HeadSpec(targets, temperature, _chunk(chunk_size, rows.shape[0]), entropy, teacher, vocab)
        out = head_stats(rows, weight, None, spec)
    cols = [split_per_sample(out[:, c], samples) for c in range(spec.columns)]
    return Scores(cols[0], cols[1] if entropy else None, cols[-1] if teacher is not None else None)


@torch.no_grad()
def teacher_for_kl(model, samples: list[Sample], *, temperature: float, device,
                   chunk_size: int) -> tuple[list[torch.Tensor], FullTeacher]:
    """A frozen in-trainer teacher: its log-probs of the sampled tokens, and itself as hidden states + its
    rows of the output layer (the same vocabulary split as the student's) for the whole-distribution KL."""
    with _autocast(device):
        rows = _response_rows(model, samples, device)
        weight, vocab = output_head(model)
        teacher = FullTeacher(rows, weight.detach())
        spec = HeadSpec(torch.cat(response_targets(samples, device)), temperature, _chunk(chunk_size, rows.shape[0]),
                        vocab=vocab)
        log_probs = head_stats(teacher.hidden, teacher.weight, None, spec)[:, 0]
    return split_per_sample(log_probs, samples), teacher
