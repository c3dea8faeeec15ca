"""Backend-agnostic tensor math for policy-gradient training and on-policy distillation.

Per-token quantities (log-probs, KL, rewards, advantages, masks) are lists of 1-D float tensors, one
per sample, each of length ``response_length`` (see docs/en/developer_guide/architecture.md). A mask
entry of 1 marks a trainable (student-sampled) token; observation and replayed tokens have mask 0.

Nothing here talks to a process group: where a reduction must span data-parallel ranks the caller
passes the global denominator or a reduction function.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

Tensors = list[torch.Tensor]

# Keeps exp() finite in the low-variance estimator; the clamp of its result to [-10, 10] is customary.
_LOW_VAR_LOG_RATIO_CLAMP = 20.0
_LOW_VAR_KL_CLAMP = 10.0


# ---------------------------------------------------------------------------- KL estimators
def compute_approx_kl(log_probs: torch.Tensor, log_probs_base: torch.Tensor, kl_loss_type: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || base) from the sampled tokens' log-probs (elementwise).

    With ``log r = log_probs - log_probs_base`` and tokens sampled from the policy:

    * ``k1``: ``log r`` (unbiased, high variance, can be negative per token);
    * ``k2``: ``0.5 * (log r) ** 2`` (biased, always >= 0);
    * ``k3``: ``exp(-log r) - 1 + log r`` (unbiased, always >= 0);
    * ``low_var_kl``: ``k3`` with ``log r`` clamped to [-20, 20] and the result to [-10, 10].
    """
    log_ratio = log_probs.float() - log_probs_base.float()
    if kl_loss_type == "k1":
        return log_ratio
    if kl_loss_type == "k2":
        return 0.5 * log_ratio.square()
    if kl_loss_type == "k3":
        return torch.exp(-log_ratio) - 1.0 + log_ratio
    if kl_loss_type == "low_var_kl":
        log_ratio = log_ratio.clamp(-_LOW_VAR_LOG_RATIO_CLAMP, _LOW_VAR_LOG_RATIO_CLAMP)
        kl = torch.exp(-log_ratio) - 1.0 + log_ratio
        return kl.clamp(-_LOW_VAR_KL_CLAMP, _LOW_VAR_KL_CLAMP)
    raise ValueError(f"unknown kl_loss_type {kl_loss_type!r}; expected k1, k2, k3 or low_var_kl")


# ---------------------------------------------------------------------------- scalar-reward estimators
def _as_float_tensor(values) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.float32).reshape(-1)


def get_grpo_returns(rewards, group_size: int, std_normalization: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Per-sample GRPO advantages: reward minus its group mean, divided by (group std + eps) when asked.

    ``rewards`` holds consecutive groups of ``group_size`` samples of the same prompt. The std is the
    unbiased one (as ``torch.std``); a group of one has no spread, so it is only centred (to 0).
    GSPO uses the same advantages; it differs in the loss (:func:`compute_gspo_policy_loss`).
    """
    rewards = _as_float_tensor(rewards)
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.view(-1, group_size)
    centred = grouped - grouped.mean(dim=-1, keepdim=True)
    if std_normalization and group_size > 1:
        centred = centred / (grouped.std(dim=-1, keepdim=True) + eps)
    return centred.reshape(-1)


def broadcast_to_tokens(values, response_lengths: Sequence[int]) -> Tensors:
    """One constant tensor per sample: ``values[i]`` repeated ``response_lengths[i]`` times."""
    values = _as_float_tensor(values)
    if values.numel() != len(response_lengths):
        raise ValueError(f"{values.numel()} values for {len(response_lengths)} samples")
    return [torch.full((int(n),), float(v)) for v, n in zip(values.tolist(), response_lengths)]


# ---------------------------------------------------------------------------- per-token rewards and returns
def compute_token_rewards(rewards, kl: Tensors, loss_masks: Tensors, kl_coef: float) -> Tensors:
    """Shaped per-token rewards: ``-kl_coef * kl`` on trainable tokens, task reward at the last one.

    Masked tokens get 0. A sample without trainable tokens has nowhere to put its task reward and
    gets all zeros (it contributes nothing to the loss either way).
    """
    rewards = _as_float_tensor(rewards)
    if not len(kl) == len(loss_masks) == rewards.numel():
        raise ValueError(f"{rewards.numel()} rewards, {len(kl)} kl tensors and {len(loss_masks)} masks")
    out = []
    for reward, kl_i, mask_i in zip(rewards.tolist(), kl, loss_masks):
        mask_i = mask_i.to(kl_i.dtype)
        token_rewards = -kl_coef * kl_i.detach() * mask_i
        trainable = torch.nonzero(mask_i > 0).flatten()
        if trainable.numel():
            token_rewards[trainable[-1]] += reward
        out.append(token_rewards)
    return out


def _discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Backward discounted sum taken over trainable tokens in order; masked tokens return 0.

    An observation between two turns is the environment's transition, not a step of the policy: it
    is skipped, so it neither earns reward nor adds a discount factor between the turns around it.
    """
    returns = torch.zeros_like(token_rewards)
    running = 0.0
    for t in reversed(torch.nonzero(mask > 0).flatten().tolist()):
        running = float(token_rewards[t]) + gamma * running
        returns[t] = running
    return returns


def get_reinforce_plus_plus_returns(rewards, kl: Tensors, loss_masks: Tensors, kl_coef: float,
                                    gamma: float) -> Tensors:
    """REINFORCE++ returns (used as advantages; whiten them afterwards across the batch)."""
    token_rewards = compute_token_rewards(rewards, kl, loss_masks, kl_coef)
    return [_discounted_returns(r, m, gamma) for r, m in zip(token_rewards, loss_masks)]


def get_reinforce_plus_plus_baseline_advantages(rewards, kl: Tensors, loss_masks: Tensors, kl_coef: float,
                                                group_size: int) -> Tensors:
    """REINFORCE++-baseline: group-mean baseline on the scalar reward, then token KL, undiscounted sum."""
    centred = get_grpo_returns(rewards, group_size, std_normalization=False)
    return get_reinforce_plus_plus_returns(centred, kl, loss_masks, kl_coef, gamma=1.0)


def get_advantages_and_returns(values: torch.Tensor, rewards: torch.Tensor, loss_mask: torch.Tensor,
                               gamma: float, lambd: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE for one sample over its trainable tokens; returns ``(advantages, returns)``.

    ``rewards`` are the shaped token rewards (:func:`compute_token_rewards`). The successor of a
    trainable token is the next trainable token (observations are skipped as in
    :func:`_discounted_returns`); after the last one the value is 0. Masked tokens get 0 for both.
    """
    values = values.detach().float()
    advantages = torch.zeros_like(values)
    next_value, running = 0.0, 0.0
    for t in reversed(torch.nonzero(loss_mask > 0).flatten().tolist()):
        value = float(values[t])
        delta = float(rewards[t]) + gamma * next_value - value
        running = delta + gamma * lambd * running
        advantages[t] = running
        next_value = value
    returns = (advantages + values) * (loss_mask > 0).to(values.dtype)
    return advantages, returns


def get_advantages_and_returns_batch(values: Tensors, rewards: Tensors, loss_masks: Tensors, gamma: float,
                                     lambd: float) -> tuple[Tensors, Tensors]:
    """:func:`get_advantages_and_returns` applied per sample; returns two lists."""
    pairs = [get_advantages_and_returns(v, r, m, gamma, lambd) for v, r, m in zip(values, rewards, loss_masks)]
    return [a for a, _ in pairs], [r for _, r in pairs]


# ---------------------------------------------------------------------------- losses
def compute_policy_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                        eps_clip: float, eps_clip_high: float | None = None,
                        eps_clip_c: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Elementwise PPO-clip loss; returns ``(pg_loss, clipfrac)`` per token (unreduced).

    ``loss = max(-A * r, -A * clip(r, 1 - eps_clip, 1 + eps_clip_high))`` with ``r = exp(log_probs -
    old_log_probs)``. With ``eps_clip_c`` (> 1) the dual clip bounds the loss of negative-advantage
    tokens by ``-A * eps_clip_c``, so a huge ratio on a bad token cannot blow up the update.
    ``clipfrac`` is 1 where the clipped branch is the one in effect.
    """
    if eps_clip_high is None:
        eps_clip_high = eps_clip
    ratio = torch.exp(log_probs - old_log_probs)
    return _clipped_surrogate(ratio, advantages, eps_clip, eps_clip_high, eps_clip_c)


def _clipped_surrogate(ratio, advantages, eps_clip, eps_clip_high, eps_clip_c):
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipfrac = (loss_clipped > loss_unclipped).float()
    if eps_clip_c is not None:
        if eps_clip_c <= 1:
            raise ValueError(f"eps_clip_c (dual clip) must be > 1, got {eps_clip_c}")
        dual = -advantages * eps_clip_c
        use_dual = (advantages < 0) & (dual < loss)
        loss = torch.where(use_dual, dual, loss)
        clipfrac = torch.where(use_dual, torch.ones_like(clipfrac), clipfrac)
    return loss, clipfrac


def compute_gspo_policy_loss(log_probs: Tensors, old_log_probs: Tensors, advantages: Tensors, loss_masks: Tensors,
                             eps_clip: float, eps_clip_high: float | None = None) -> tuple[Tensors, Tensors]:
    """GSPO loss per sample; returns lists ``(pg_loss, clipfrac)`` shaped like the inputs.

    The ratio of sample ``i`` is ``s_i = exp(mean of (log_probs - old_log_probs) over its trainable
    tokens)``, clipped at the sequence level. It is written in GSPO's token form,
    ``s_i * pi_t / sg(pi_t)`` with ``s_i`` detached: the value is ``s_i`` on every token, and averaging
    the tokens of a sample gives the gradient of ``s_i`` itself, while per-token advantages (the OPD
    term) still apply token by token.
    """
    if eps_clip_high is None:
        eps_clip_high = eps_clip
    losses, clipfracs = [], []
    for lp, old, adv, mask in zip(log_probs, old_log_probs, advantages, loss_masks):
        mask = mask.to(lp.dtype)
        seq_log_ratio = ((lp - old) * mask).sum() / mask.sum().clamp_min(1.0)
        token_log_ratio = seq_log_ratio.detach() + lp - lp.detach()
        loss, clipfrac = _clipped_surrogate(torch.exp(token_log_ratio), adv, eps_clip, eps_clip_high, None)
        losses.append(loss)
        clipfracs.append(clipfrac)
    return losses, clipfracs


def compute_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       value_clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Elementwise clipped value loss ``0.5 * max((v - R)^2, (v_clip - R)^2)``; returns ``(loss, clipfrac)``.

    ``v_clip = old + clip(v - old, -value_clip, value_clip)``; ``value_clip=None`` turns clipping off.
    """
    loss_unclipped = (values - returns).square()
    if value_clip is None:
        return 0.5 * loss_unclipped, torch.zeros_like(loss_unclipped)
    clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
    loss_clipped = (clipped - returns).square()
    return 0.5 * torch.maximum(loss_unclipped, loss_clipped), (loss_clipped > loss_unclipped).float()


# ---------------------------------------------------------------------------- masked aggregation
def masked_sample_mean_sum(x: Tensors, masks: Tensors) -> torch.Tensor:
    """Sum over samples of each sample's mean over its masked tokens (a sample with none adds 0).

    Divide by the GLOBAL number of samples to get the data-parallel-consistent mean.
    """
    if len(x) != len(masks):
        raise ValueError(f"{len(x)} tensors for {len(masks)} masks")
    if not x:
        return torch.zeros(())
    return sum(((xi * mi).sum() / mi.sum().clamp_min(1)) for xi, mi in zip(x, masks))


def sum_of_sample_mean(x: Tensors, masks: Tensors, num_samples: int | None = None) -> torch.Tensor:
    """Mean over samples of the per-sample masked mean; ``num_samples`` overrides ``len(x)`` (global batch)."""
    denominator = len(x) if num_samples is None else num_samples
    if denominator <= 0:
        raise ValueError(f"num_samples must be > 0, got {denominator}")
    return masked_sample_mean_sum(x, masks) / denominator


def masked_token_sum(x: Tensors, masks: Tensors) -> torch.Tensor:
    """Sum of ``x`` over every masked token of every sample."""
    if len(x) != len(masks):
        raise ValueError(f"{len(x)} tensors for {len(masks)} masks")
    return sum(((xi * mi).sum() for xi, mi in zip(x, masks)), torch.zeros(()))


def per_token_mean(x: Tensors, masks: Tensors, num_tokens: int | float | None = None) -> torch.Tensor:
    """Sum over all masked tokens divided by their count, or by ``num_tokens`` (global token count)."""
    if num_tokens is None:
        num_tokens = float(sum(float(m.sum()) for m in masks))
        num_tokens = max(num_tokens, 1.0)  # no trainable token: the sum is 0 and so is the mean
    elif num_tokens <= 0:
        raise ValueError(f"num_tokens must be > 0, got {num_tokens}")
    return masked_token_sum(x, masks) / num_tokens


def whiten_advantages(advantages: Tensors, masks: Tensors, all_reduce_fn: Callable | None = None,
                      eps: float = 1e-8) -> Tensors:
    """Normalise advantages to mean 0 / std 1 over the masked tokens of the (global) batch.

    ``all_reduce_fn(t)`` sums a small tensor across data-parallel ranks; it may return the result or
    reduce in place and return None, so ``torch.distributed.all_reduce`` can be passed directly.
    The variance is the population one, taken in a second pass around the global mean for accuracy.
    Masked tokens come out as 0. With no masked token anywhere, the advantages are returned as is.
    """
    def reduce(t: torch.Tensor) -> torch.Tensor:
        if all_reduce_fn is None:
            return t
        out = all_reduce_fn(t)
        return out if isinstance(out, torch.Tensor) else t

    masks_f = [m.to(a.dtype) for a, m in zip(advantages, masks)]
    stats = reduce(torch.stack([masked_token_sum(advantages, masks_f).float(),
                                torch.tensor(float(sum(float(m.sum()) for m in masks_f)))]))
    total, count = float(stats[0]), float(stats[1])
    if count <= 0:
        return list(advantages)
    mean = total / count
    squared = reduce(masked_token_sum([(a - mean).square() for a in advantages], masks_f).float().reshape(1))
    inv_std = 1.0 / (float(squared[0]) / count + eps) ** 0.5
    return [(a - mean) * inv_std * m for a, m in zip(advantages, masks_f)]


# ---------------------------------------------------------------------------- on-policy distillation
def apply_opd_kl_to_advantages(args, rollout_data: dict, advantages: Tensors, student_log_probs: Tensors) -> Tensors:
    """Add the OPD term in place: ``advantages[i] -= args.opd_kl_coef * (student[i] - teacher[i])``.

    The function checks ``args.use_opd`` itself and returns ``advantages`` untouched when it is off.
    Teacher log-probs come from ``rollout_data["teacher_log_probs"]`` (tensors or lists, one per
    sample, each of response length). The per-token reverse-KL estimates ``student - teacher`` are
    stored, detached, in ``rollout_data["opd_reverse_kl"]`` for logging. Student log-probs are
    detached: the OPD term is a reward, not a path for gradients.
    Call it after the advantage estimator and before whitening.
    """
    if not getattr(args, "use_opd", False):
        return advantages
    teacher = rollout_data.get("teacher_log_probs")
    if teacher is None:
        raise ValueError("use_opd is set but rollout_data has no 'teacher_log_probs': the teacher did not score "
                         "this batch (check --opd-type and the teacher reward/post-process functions)")
    if not len(teacher) == len(advantages) == len(student_log_probs):
        raise ValueError(f"OPD: {len(teacher)} teacher_log_probs, {len(student_log_probs)} student log-prob "
                         f"tensors and {len(advantages)} advantage tensors; expected one per sample")
    coef = float(args.opd_kl_coef)
    reverse_kl = []
    for i, (teacher_i, student_i) in enumerate(zip(teacher, student_log_probs)):
        if teacher_i is None:
            raise ValueError(f"OPD: sample {i} has no teacher_log_probs")
        student_i = student_i.detach()
        teacher_i = torch.as_tensor(teacher_i, dtype=student_i.dtype, device=student_i.device).reshape(-1)
        if teacher_i.numel() != student_i.numel() or advantages[i].numel() != student_i.numel():
            raise ValueError(f"OPD: sample {i} has {teacher_i.numel()} teacher log-probs, {student_i.numel()} "
                             f"student log-probs and {advantages[i].numel()} advantages; all must equal its "
                             "response length")
        kl_i = student_i - teacher_i
        advantages[i] = advantages[i] - coef * kl_i
        reverse_kl.append(kl_i)
    rollout_data["opd_reverse_kl"] = reverse_kl
    return advantages
