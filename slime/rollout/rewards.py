"""Rewards for generated samples: task reward first, then the custom reward model, then post-processing.

Order, as in slime: the reward model runs only for samples whose generate function left
``sample.reward`` as ``None``; it is ``--custom-rm-path`` (``async reward_func(args, sample, **kwargs)``,
e.g. the OPD teacher) when given. Then ``--custom-reward-post-process-path``
(``post_process_rewards(args, samples, **kwargs) -> (raw, rewards)``) sees every sample.
This runtime adds one thing: a built-in rule (``--rm-type``) scores the task and its score is kept in
``metadata["task_reward"]`` next to the reward model's reply, so OPD can add its term on top of it (the
agent loop keeps an episode's return there too). After this step ``sample.reward`` is the float the
trainer uses.
"""

from __future__ import annotations

import asyncio

from slime.utils.misc import load_function
from slime.utils.types import Sample


def _exact_match(sample: Sample) -> float:
    return float(sample.label is not None and sample.response.replace("<|im_end|>", "").strip()
                 == str(sample.label).strip())


RULES = {"exact_match": _exact_match}


def rule_reward(args, sample: Sample) -> float:
    rule = RULES.get(args.rm_type)
    if rule is None:
        raise ValueError(f"--rm-type {args.rm_type!r} is not a built-in rule; choose from {sorted(RULES)}")
    return rule(sample)


async def assign_rewards(args, samples: list[Sample], evaluation: bool = False) -> None:
    if not samples:
        return
    # As upstream's generate_and_rm: the reward model runs only where the generate function left
    # ``sample.reward`` unset (the agent loop sets it in evaluation and when no reward model is given).
    pending = [s for s in samples if s.reward is None]
    for sample in samples:
        if isinstance(sample.reward, (int, float)):
            sample.metadata["task_reward"] = float(sample.reward)
    if args.rm_type:
        for sample in pending:
            sample.metadata["task_reward"] = rule_reward(args, sample)
    for sample in samples:
        sample.metadata.setdefault("task_reward", 0.0)

    if evaluation or not args.custom_rm_path:
        # Evaluation reports the task reward; the reward model (e.g. the OPD teacher) is not needed.
        for sample in pending:
            sample.reward = sample.metadata["task_reward"]
    else:
        reward_func = load_function(args.custom_rm_path)
        results = await asyncio.gather(*(reward_func(args, s) for s in pending))
        for sample, result in zip(pending, results):
            sample.reward = result
    if evaluation:
        return

    if args.custom_reward_post_process_path:
        post_process = load_function(args.custom_reward_post_process_path)
        raw, rewards = post_process(args, samples)
        for sample, raw_value, value in zip(samples, raw, rewards):
            sample.metadata["raw_reward"] = raw_value if isinstance(raw_value, (int, float)) else None
            sample.reward = float(value)
    else:
        for sample in samples:
            sample.reward = sample.get_reward_value(args)
