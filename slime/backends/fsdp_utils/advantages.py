"""Advantages of a whole rollout batch: estimator, then the OPD term, then optional whitening.

Every rank calls this on the full, gathered batch and gets identical results, so estimators that
need whole groups (grpo, gspo, reinforce_plus_plus_baseline) and batch whitening see every sample no
matter how the batch is sharded, and 1 and N processes compute the same numbers. The math lives in
``slime.utils.ppo_utils``; this module only wires it together.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slime.utils import ppo_utils

Tensors = list[torch.Tensor]


@dataclass
class RolloutTensors:
    """Per-sample, per-token inputs (response span) of the whole rollout batch."""

    rewards: list[float]
    loss_masks: Tensors
    old_log_probs: Tensors
    ref_log_probs: Tensors | None = None
    teacher_log_probs: Tensors | None = None
    values: Tensors | None = None


@dataclass
class AdvantageResult:
    advantages: Tensors
    returns: Tensors | None  # value targets (ppo only)
    reward_kl: Tensors  # the KL that shaped the rewards (zeros without a reference model)
    opd_reverse_kl: Tensors | None  # student - teacher per token (OPD only)


def compute_advantages(args, data: RolloutTensors, kl_coef: float) -> AdvantageResult:
    estimator = args.advantage_estimator
    masks = data.loss_masks
    lengths = [int(m.numel()) for m in masks]
    if data.ref_log_probs is not None:
        # slime measures the reward-side KL with the same estimator as the KL loss.
        kl = [ppo_utils.compute_approx_kl(lp, ref, args.kl_loss_type)
              for lp, ref in zip(data.old_log_probs, data.ref_log_probs)]
    else:
        if kl_coef and estimator in ("ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"):
            raise ValueError(f"kl_coef={kl_coef} shapes the rewards with the KL to a reference model, but none "
                             "was loaded: start the trainer with --kl-coef > 0 (or --kl-ctrl adaptive)")
        kl = [torch.zeros(n) for n in lengths]

    returns = None
    if estimator in ("grpo", "gspo"):
        scalar = ppo_utils.get_grpo_returns(data.rewards, args.n_samples_per_prompt,
                                            std_normalization=not args.disable_grpo_std_normalization)
        advantages = ppo_utils.broadcast_to_tokens(scalar, lengths)
    elif estimator == "reinforce_plus_plus":
        advantages = ppo_utils.get_reinforce_plus_plus_returns(data.rewards, kl, masks, kl_coef, args.gamma)
    elif estimator == "reinforce_plus_plus_baseline":
        advantages = ppo_utils.get_reinforce_plus_plus_baseline_advantages(data.rewards, kl, masks, kl_coef,
                                                                           args.n_samples_per_prompt)
    elif estimator == "ppo":
        if data.values is None:
            raise ValueError("advantage estimator ppo needs critic values")
        token_rewards = ppo_utils.compute_token_rewards(data.rewards, kl, masks, kl_coef)
        advantages, returns = ppo_utils.get_advantages_and_returns_batch(data.values, token_rewards, masks,
                                                                         args.gamma, args.lambd)
    else:
        raise ValueError(f"unknown --advantage-estimator {estimator!r}")

    rollout_data = {"teacher_log_probs": data.teacher_log_probs}
    if getattr(args, "opd_loss", "sampled") == "full":
        # --opd-loss full trains on the whole-distribution KL as a loss term (actor); here the sampled
        # term is only measured, for the opd/reverse_kl metrics, and kept out of the advantages.
        ppo_utils.apply_opd_kl_to_advantages(args, rollout_data, [torch.zeros_like(a) for a in advantages],
                                             data.old_log_probs)
    else:
        advantages = ppo_utils.apply_opd_kl_to_advantages(args, rollout_data, list(advantages),
                                                          data.old_log_probs)
    if args.normalize_advantages:
        advantages = ppo_utils.whiten_advantages(advantages, masks)
    return AdvantageResult(advantages, returns, kl, rollout_data.get("opd_reverse_kl"))


def sample_mean(values: Tensors, masks: Tensors) -> float:
    """Each sample's masked mean, averaged over samples (verl's unit for the adaptive KL controller, and the
    slime PR's): unlike the batch's token mean, a long sample weighs as much as a short one."""
    means = [float((v * m).sum()) / max(float(m.sum()), 1.0) for v, m in zip(values, masks)]
    return sum(means) / max(len(means), 1)


def token_mean_and_seq_sum(values: Tensors, masks: Tensors) -> tuple[float, float]:
    """Mean over all masked tokens of the batch, and mean over samples of the per-sample masked sum."""
    token_mean = float(ppo_utils.per_token_mean(values, masks))
    seq_sum = float(ppo_utils.masked_token_sum(values, masks)) / max(len(values), 1)
    return token_mean, seq_sum
