"""Expert trajectories -> SFT samples, in exactly the token layout the multi-turn agent loop produces.

A tiny teacher is made by SFT (``--loss-type sft_loss``) on these samples: the expert's actions are the
trainable tokens, observations are masked, and the sequence is token for token what the agent loop
(``examples.multi_turn_tcod.rollout``) would build had the student played the expert's actions: the same
environment contract (``build_env(sample, args)``, ``reset() -> (observation, info)``, ``step(text) ->
(observation, done, info)``, ``format_observation``), the same first-observation handling and the same
``chat_layout`` encoders with ``apply_chat_template_kwargs``.

Command line (one Sample per line, ``Sample.to_dict()``)::

    python -m slime.rollout.expert_sft --data train.jsonl --out sft.jsonl \\
        --env-path examples.agent_envs --tokenizer tiny|HF_PATH [--system TEXT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from examples.multi_turn_tcod.chat_layout import encode_action, encode_observation, encode_prompt
from examples.multi_turn_tcod.rollout import load_env_module
from slime.utils.types import Sample


def first_observation(env, sample: Sample, observation):
    """The text the agent loop makes its prompt from (``rollout._play``): ``reset()``'s observation, the
    task's prompt when it is empty (upstream's geo3k env resets to ``({}, info)``), else the formatted one."""
    observation = observation[0] if isinstance(observation, tuple) else observation
    if not observation:
        return sample.prompt
    if not isinstance(observation, str):
        return env.format_observation(observation)["content"]
    return observation


def expert_actions_of(env, sample: Sample) -> list[str] | None:
    """As B2F's replay: ``metadata["expert_actions"]``, else ``env.expert_actions()``."""
    actions = (sample.metadata or {}).get("expert_actions")
    if actions is None and hasattr(env, "expert_actions"):
        actions = env.expert_actions()
    return list(actions) if actions else None


def build_expert_sample(build_env, args, sample: Sample, tokenizer, system: str | None = None,
                        require_success: bool = True) -> Sample:
    """Play the expert actions of ``sample``'s task and return the trajectory as a trainable Sample.

    ``build_env(sample, args)`` is the environment module's builder. ``system`` adds a system message
    before the first observation (the agent loop has none: a teacher trained with it sees another prompt).
    Raises ValueError when the task has no expert actions, or (with ``require_success``) when they do
    not solve it: training a teacher on a failing path would teach it to fail.
    """
    kwargs = getattr(args, "apply_chat_template_kwargs", None) or {}
    env = build_env(sample, args)
    try:
        observation = first_observation(env, sample, env.reset())
        actions = expert_actions_of(env, sample)
        if not actions:
            raise ValueError(f"sample {sample.index}: no expert actions (neither metadata['expert_actions'] "
                             "nor env.expert_actions())")
        out = Sample(index=sample.index, group_index=sample.group_index, prompt=sample.prompt or observation,
                     label=sample.label, metadata=dict(sample.metadata or {}))
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": observation}]
        out.tokens = encode_prompt(tokenizer, messages if system else observation, kwargs)
        spans, rewards, success, done = [], [], False, False
        for turn, action in enumerate(actions):
            ids = encode_action(tokenizer, action)
            start = out.response_length
            out.append_response_tokens(tokens=ids, log_probs=[0.0] * len(ids), trainable=True)
            spans.append([start, out.response_length])
            observation, done, info = env.step(action)
            info = info or {}
            rewards.append(float(info.get("reward", 0.0)))
            success = success or bool(info.get("success", False))
            if done:
                if turn + 1 < len(actions):
                    raise ValueError(f"sample {sample.index}: the episode ended after {turn + 1} of "
                                     f"{len(actions)} expert actions")
                break
            if turn + 1 < len(actions):  # nothing follows the final action
                message = env.format_observation(observation)
                out.append_response_tokens(tokens=encode_observation(tokenizer, message, kwargs), trainable=False)
        if require_success and not success:
            raise ValueError(f"sample {sample.index}: the {len(actions)} expert actions did not solve the task "
                             f"(done={done}, metadata={sample.metadata})")
    finally:
        if hasattr(env, "close"):
            env.close()
    out.response = tokenizer.decode(out.tokens[len(out.tokens) - out.response_length:], skip_special_tokens=False)
    out.reward = sum(rewards)
    out.status = Sample.Status.COMPLETED
    out.metadata.update(turn_spans=spans, turn_rewards=rewards, num_turns=len(spans), success=success,
                        expert_actions=list(actions), source="expert")
    return out


def read_task_samples(path) -> list[Sample]:
    """Tasks from a jsonl file (as the env data generators write them), numbered in file order.

    Read here rather than through a Dataset class, whose signature differs between upstream slime and
    this project's runtime.
    """
    samples = []
    with open(path) as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}: not JSON ({err})") from None
            if not isinstance(row, dict) or not isinstance(row.get("metadata", {}), dict):
                raise ValueError(f"{path}:{line_no}: each row must be an object with an object 'metadata'")
            metadata = dict(row.get("metadata") or {})
            if "expert_actions" in row:
                metadata["expert_actions"] = list(row["expert_actions"])
            samples.append(Sample(index=len(samples), prompt=row.get("input", ""), label=row.get("label"),
                                  metadata=metadata))
    if not samples:
        raise ValueError(f"{path} holds no tasks")
    return samples


def load_tokenizer(name: str):
    if name == "tiny":
        try:
            from slime.utils.tiny_models import build_tokenizer
        except ImportError:
            raise ValueError("--tokenizer tiny is the local test tokenizer of slime-tcod's runtime; "
                             "pass the student's HF tokenizer path") from None
        return build_tokenizer()
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(name)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write SFT samples from the expert trajectories of env tasks.")
    parser.add_argument("--data", required=True, help="jsonl of tasks (input, label, metadata, expert_actions)")
    parser.add_argument("--out", required=True, help="jsonl of Sample.to_dict() rows")
    parser.add_argument("--env-path", default="examples.agent_envs",
                        help="as --rollout-interaction-env-path: a module with build_env(sample, args)")
    parser.add_argument("--tokenizer", default="tiny", help="'tiny' (the local char-level one) or an HF path")
    parser.add_argument("--system", default=None, help="optional system message")
    parser.add_argument("--apply-chat-template-kwargs", type=json.loads, default=None,
                        help="JSON keyword arguments of every chat-template render, as the agent loop's "
                             "apply_chat_template_kwargs (e.g. '{\"enable_thinking\": false}')")
    parser.add_argument("--allow-failures", action="store_true", help="skip tasks the expert does not solve")
    args = parser.parse_args(argv)

    build_env = load_env_module(args.env_path).build_env
    # What the environment and the encoders read of the run's arguments.
    env_args = argparse.Namespace(rollout_interaction_env_path=args.env_path,
                                  apply_chat_template_kwargs=args.apply_chat_template_kwargs or {})
    tokenizer = load_tokenizer(args.tokenizer)
    tasks = read_task_samples(args.data)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    written, skipped, tokens = 0, 0, 0
    with open(tmp, "w") as handle:
        for task in tasks:
            try:
                sample = build_expert_sample(build_env, env_args, task, tokenizer, system=args.system)
            except ValueError as err:
                if not args.allow_failures:
                    raise
                print(f"skipped: {err}", file=sys.stderr)
                skipped += 1
                continue
            handle.write(json.dumps(sample.to_dict()) + "\n")
            written += 1
            tokens += len(sample.tokens)
    tmp.replace(out_path)  # write then rename: a crash never leaves a half file behind
    mean = tokens / written if written else 0.0
    print(f"wrote {written} SFT samples to {out_path} ({skipped} skipped, {mean:.1f} tokens each on average)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
