"""Whole-distribution reverse KL between the student and the teacher, per position (runtime, not slime's).

slime's OPD term (``ppo_utils.apply_opd_kl_to_advantages``) uses one sample per position: the
student's own token ``a`` and ``log s(a) - log t(a)``. That is an unbiased estimate of the reverse KL
``KL(s || t) = sum_v s(v) (log s(v) - log t(v))`` at that position, with the variance of one draw.
This module computes the KL itself, for the exact-KL diagnostic and for ``--opd-loss full``:

* :func:`full_reverse_kl`: both distributions over the whole vocabulary (in-trainer teacher);
* :func:`topk_reverse_kl`: the teacher known only by its top-k log-probs (a server teacher answering
  ``top_logprobs_num``). The vocabulary is split into the teacher's k tokens plus one bucket holding
  every other token, and the KL is taken between the two (k + 1)-outcome distributions. Merging
  outcomes never increases a KL, so this is a lower bound of the exact KL, equal to it when the
  bucket is empty (k = vocabulary size). The gap is the student's mass outside the teacher's top k
  times the KL between the two inside that remainder: small once the student puts its mass where a
  confident teacher does, large for a student that spreads mass over tokens the teacher rules out
  (those tokens still get pushed down, through the bucket). It is differentiable in the student's
  log-probs.

Inputs are log-softmax rows ``[positions, vocab]`` (float32, any device); outputs are ``[positions]``.
"""

from __future__ import annotations

import torch

# A teacher whose top-k mass rounds to 1 has an empty bucket: keep its log finite.
_MIN_LOG_MASS = -30.0


def full_reverse_kl(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor) -> torch.Tensor:
    """``sum_v s(v) (log s(v) - log t(v))`` per row."""
    if student_log_probs.shape != teacher_log_probs.shape:
        raise ValueError(f"student rows {tuple(student_log_probs.shape)} and teacher rows "
                         f"{tuple(teacher_log_probs.shape)} differ: same positions and vocabulary needed")
    teacher = teacher_log_probs.to(student_log_probs.dtype)
    return (student_log_probs.exp() * (student_log_probs - teacher)).sum(-1)


def topk_reverse_kl(student_log_probs: torch.Tensor, teacher_ids: torch.Tensor,
                    teacher_top_log_probs: torch.Tensor) -> torch.Tensor:
    """Reverse KL over the teacher's top-k tokens plus a bucket for the rest of the vocabulary.

    ``teacher_ids`` / ``teacher_top_log_probs``: ``[positions, k]`` (distinct ids per row).
    """
    if teacher_ids.shape != teacher_top_log_probs.shape or teacher_ids.dim() != 2 \
            or teacher_ids.shape[0] != student_log_probs.shape[0]:
        raise ValueError(f"teacher top-k ids {tuple(teacher_ids.shape)} and log-probs "
                         f"{tuple(teacher_top_log_probs.shape)} must both be [positions, k] for "
                         f"{student_log_probs.shape[0]} positions")
    ids = teacher_ids.to(student_log_probs.device, torch.long)
    t_top = teacher_top_log_probs.to(student_log_probs.device, student_log_probs.dtype)
    s_top = student_log_probs.gather(-1, ids)
    # log of the student's mass outside the teacher's k tokens, exactly: logsumexp over the rest.
    outside = student_log_probs.scatter(-1, ids, float("-inf"))
    return topk_kl_from_parts(s_top, torch.logsumexp(outside, dim=-1), t_top)


def topk_kl_from_parts(s_top: torch.Tensor, s_rest: torch.Tensor, t_top: torch.Tensor) -> torch.Tensor:
    """:func:`topk_reverse_kl` from the student's log-probs of the teacher's k tokens (``[positions, k]``)
    and the log of its remaining mass (``[positions]``): what a head split over vocabulary shards can
    assemble without whole rows."""
    s_rest = s_rest.clamp_min(_MIN_LOG_MASS)
    t_rest = torch.log1p(-t_top.exp().sum(-1).clamp(max=1.0 - 1e-7)).clamp_min(_MIN_LOG_MASS)
    top = (s_top.exp() * (s_top - t_top)).sum(-1)
    return top + s_rest.exp() * (s_rest - t_rest)

