"""Rollout function for ``--loss-type sft_loss`` on environment tasks: expert trajectories, no engine.

``--rollout-function-path slime.rollout.sft_rollout.generate_rollout`` with
``--rollout-interaction-env-path`` plays each task's expert actions (dataset field or the env's gold
path) and returns them as Samples in the agent loop's exact token layout (``expert_sft``): actions
trainable, observations masked. The demo makes its tiny teacher and student this way.

Evaluation (``--eval-prompt-data``) plays full episodes with the student instead: it goes through the
default rollout with ``--custom-generate-function-path examples.multi_turn_tcod.rollout.generate``.
"""

from __future__ import annotations

from examples.multi_turn_tcod.rollout import load_env_module

from slime.rollout import sglang_rollout
from slime.rollout.expert_sft import build_expert_sample
from slime.rollout.sglang_rollout import GenerateState


def generate_rollout(args, rollout_id: int, data_source, evaluation: bool = False):
    if evaluation:
        # Expert replays measure nothing about the policy: evaluate by letting it play the episodes.
        if not args.custom_generate_function_path:
            raise ValueError("evaluating an SFT run plays episodes: add --custom-generate-function-path "
                             "examples.multi_turn_tcod.rollout.generate")
        return sglang_rollout.generate_rollout(args, rollout_id, data_source, evaluation=True)
    if not args.rollout_interaction_env_path:
        raise ValueError("slime.rollout.sft_rollout needs --rollout-interaction-env-path to play expert actions")
    build_env = load_env_module(args.rollout_interaction_env_path).build_env
    sglang_rollout.LAST_TIMINGS.clear()  # an evaluation's generate time must not be reported as this step's
    tokenizer = GenerateState(args).tokenizer  # the agent loop's: the same ids for the same text
    groups = data_source.get_samples(args.rollout_batch_size)
    out = []
    for group in groups:
        built = []
        for sample in group:
            expert = build_expert_sample(build_env, args, sample, tokenizer)
            expert.rollout_id = rollout_id
            expert.metadata["task_reward"] = float(expert.reward or 0.0)
            built.append(expert)
        out.append(built)
    return out
