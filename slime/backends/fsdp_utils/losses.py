"""Loss of one micro-batch, normalised by the GLOBAL batch of its optimizer step.

Each micro-batch contributes ``sum over its samples / global denominator``, so summing the
contributions of all micro-batches on all ranks gives the loss of the whole step, and the gradient
does not depend on how the step was split. Denominator: the number of samples of the step (each
sample's tokens averaged first, slime's default) or, with ``--calculate-per-token-loss``, the number
of trainable tokens of the step. The returned metric values are contributions too: summed over
micro-batches and ranks they are the step's means.
"""

from __future__ import annotations

from typing import Callable

import torch

from slime.utils import ppo_utils

Tensors = list[torch.Tensor]


def make_aggregator(args, step_masks: Tensors) -> Callable[[Tensors, Tensors], torch.Tensor]:
    """``agg(x, masks)``: this micro-batch's share of the step-level masked mean of ``x``."""
    if getattr(args, "calculate_per_token_loss", False):
        tokens = max(float(sum(float(m.sum()) for m in step_masks)), 1.0)
        return lambda x, masks: ppo_utils.masked_token_sum(x, masks) / tokens
    n = len(step_masks)
    return lambda x, masks: ppo_utils.masked_sample_mean_sum(x, masks) / n


def sft_loss(agg, log_probs: Tensors, masks: Tensors) -> tuple[torch.Tensor, dict[str, float]]:
    """Negative log-likelihood of the trainable tokens."""
    loss = agg([-lp for lp in log_probs], masks)
    return loss, {"loss": float(loss.detach())}


def policy_loss(args, agg, *, log_probs: Tensors, entropies: Tensors, old_log_probs: Tensors, advantages: Tensors,
                masks: Tensors, ref_log_probs: Tensors | None) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip (or GSPO) surrogate, minus the entropy bonus, plus the optional KL loss."""
    if args.advantage_estimator == "gspo":
        pg, clipfrac = ppo_utils.compute_gspo_policy_loss(log_probs, old_log_probs, advantages, masks,
                                                          args.eps_clip, args.eps_clip_high)
    else:
        pairs = [ppo_utils.compute_policy_loss(lp, old, adv, args.eps_clip, args.eps_clip_high, args.eps_clip_c)
                 for lp, old, adv in zip(log_probs, old_log_probs, advantages)]
        pg, clipfrac = [p for p, _ in pairs], [c for _, c in pairs]
    pg_loss = agg(pg, masks)
    entropy = agg(entropies, masks)
    loss = pg_loss - args.entropy_coef * entropy
    metrics = {
        "pg_loss": float(pg_loss.detach()),
        "pg_clipfrac": float(agg(clipfrac, masks)),
        "entropy": float(entropy.detach()),
        "ppo_kl": float(agg([(old - lp).detach() for lp, old in zip(log_probs, old_log_probs)], masks)),
    }
    if args.use_kl_loss:
        if ref_log_probs is None:
            raise ValueError("--use-kl-loss needs reference log-probs, but no reference model was loaded")
        kl = [ppo_utils.compute_approx_kl(lp, ref, args.kl_loss_type) for lp, ref in zip(log_probs, ref_log_probs)]
        kl_loss = agg(kl, masks)
        loss = loss + args.kl_loss_coef * kl_loss
        metrics["kl_loss"] = float(kl_loss.detach())
    metrics["loss"] = float(loss.detach())
    return loss, metrics


def value_loss(args, agg, *, values: Tensors, old_values: Tensors, returns: Tensors,
               masks: Tensors) -> tuple[torch.Tensor, dict[str, float]]:
    pairs = [ppo_utils.compute_value_loss(v, old, ret, args.value_clip)
             for v, old, ret in zip(values, old_values, returns)]
    loss = agg([p for p, _ in pairs], masks)
    return loss, {"critic/value_loss": float(loss.detach()),
                  "critic/value_clipfrac": float(agg([c for _, c in pairs], masks))}
