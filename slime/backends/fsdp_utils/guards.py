"""Non-finite guards of the trainer: a NaN or infinity stops the step before any optimizer update.

A NaN teacher log-prob or reward otherwise flows into the advantages, the loss and every weight: the
run exits 0 and saves a checkpoint of NaN tensors. The trainer checks each input and intermediate once
per rollout or step and raises :class:`NonFiniteError` naming the source and the sample or step. The
error reaches ``train.py`` before its checkpoint save, so nothing of that step is saved.

Every check runs on values that are identical on all ranks (gathered per-sample tensors, all-reduced
step sums, the global gradient norm), so all ranks raise together and none waits in a collective.
Cost: one ``torch.isfinite(...).all()`` per tensor list; the culprit is looked up only on failure.
"""

from __future__ import annotations

import math

import torch


class NonFiniteError(FloatingPointError):
    """A NaN or infinity reached the trainer; the message names where it came from."""


def _first_bad(tensors: list) -> int | None:
    """Position of the first tensor holding a non-finite value (None entries are skipped), or None."""
    present = [(i, t) for i, t in enumerate(tensors) if t is not None and t.numel()]
    if not present or bool(torch.isfinite(torch.cat([t.reshape(-1) for _, t in present])).all()):
        return None
    return next(i for i, t in present if not bool(torch.isfinite(t).all()))


def check_per_sample(tensors: list | None, source: str, samples, rollout_id: int) -> None:
    """Per-token values of the batch (one tensor per sample, response span) must all be finite."""
    if tensors is None:
        return
    pos = _first_bad(tensors)
    if pos is None:
        return
    bad = tensors[pos].reshape(-1)
    token = int((~torch.isfinite(bad)).nonzero()[0])
    raise NonFiniteError(f"rollout {rollout_id}: {source} of sample {samples[pos].index} (batch position {pos}) "
                         f"is {float(bad[token])} at response token {token}; the step stopped before any "
                         "optimizer update, nothing of it is saved")


def _reward_source(sample) -> str:
    task = (sample.metadata or {}).get("task_reward")
    if isinstance(task, (int, float)) and not math.isfinite(task):
        return "environment / task reward (metadata['task_reward'])"
    return "reward (reward model --custom-rm-path, its post-processing, or the rule reward)"


def check_rewards(rewards: list[float], samples, rollout_id: int) -> None:
    for pos, reward in enumerate(rewards):
        if not math.isfinite(reward):
            raise NonFiniteError(f"rollout {rollout_id}: {_reward_source(samples[pos])} of sample "
                                 f"{samples[pos].index} (batch position {pos}) is {reward}; the step stopped "
                                 "before any optimizer update, nothing of it is saved")


def check_step(values: dict[str, float], rollout_id: int, step: int, what: str) -> None:
    """Step-level scalars (all-reduced loss terms, global gradient norms) must be finite."""
    bad = {k: v for k, v in values.items() if not math.isfinite(v)}
    if bad:
        raise NonFiniteError(f"rollout {rollout_id}, optimizer step {step}: {what} not finite ({bad}); stopped "
                             "before optimizer.step(), the weights are unchanged and nothing of this step is saved")
