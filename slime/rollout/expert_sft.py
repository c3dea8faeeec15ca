"""Expert trajectories -> SFT samples, in exactly the token layout the multi-turn agent loop produces.

A tiny teacher is made by SFT (``--loss-type sft_loss``) on these samples: the expert's actions are the
trainable tokens, observations are masked, and the sequence is byte-for-byte what the agent loop would
build had the student played the expert's actions (see ``examples.multi_turn_tcod.chat_layout``).

Command line (one Sample per line, ``Sample.to_dict()``)::

    python -m slime.rollout.expert_sft --data train.jsonl --out sft.jsonl \\
        --env-path examples.agent_envs.make_env --tokenizer tiny|HF_PATH [--system TEXT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from examples.multi_turn_tcod.chat_layout import encode_action, encode_observation, encode_prompt
from examples.multi_turn_tcod.env_adapter import expert_actions_for
from slime.utils.types import Sample


def build_expert_sample(make_env, args, sample: Sample, tokenizer, system: str | None = None,
                        require_success: bool = True) -> Sample:
    """Play the expert actions of ``sample``'s task and return the trajectory as a trainable Sample.

    Raises ValueError when the task has no expert actions, or (with ``require_success``) when they do
    not solve it: training a teacher on a failing path would teach it to fail.
    """
    env = make_env(args, sample)
    try:
        first_observation = env.reset()
        actions = expert_actions_for(env, sample)
        if not actions:
            raise ValueError(f"sample {sample.index}: no expert actions (neither metadata['expert_actions'] "
                             "nor env.expert_actions())")
        out = Sample(index=sample.index, group_index=sample.group_index, prompt=sample.prompt or first_observation,
                     label=sample.label, metadata=dict(sample.metadata or {}))
        out.tokens = encode_prompt(tokenizer, first_observation, system)
        spans, rewards, success, done = [], [], False, False
        for turn, action in enumerate(actions):
            ids = encode_action(tokenizer, action)
            start = out.response_length
            out.append_response_tokens(tokens=ids, log_probs=[0.0] * len(ids), trainable=True)
            spans.append([start, out.response_length])
            observation, reward, done, info = env.step(action)
            rewards.append(float(reward))
            success = success or bool(info.get("success", False))
            if done:
                if turn + 1 < len(actions):
                    raise ValueError(f"sample {sample.index}: the episode ended after {turn + 1} of "
                                     f"{len(actions)} expert actions")
                break
            if turn + 1 < len(actions):  # nothing follows the final action
                out.append_response_tokens(tokens=encode_observation(tokenizer, observation), trainable=False)
        if require_success and not success:
            raise ValueError(f"sample {sample.index}: the {len(actions)} expert actions did not solve the task "
                             f"(done={done}, metadata={sample.metadata})")
    finally:
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
    parser.add_argument("--env-path", default="examples.agent_envs.make_env",
                        help="as --rollout-interaction-env-path: a module with build_env(sample, args) "
                             "or a factory make_env(args, sample)")
    parser.add_argument("--tokenizer", default="tiny", help="'tiny' (the local char-level one) or an HF path")
    parser.add_argument("--system", default=None, help="optional system message")
    parser.add_argument("--allow-failures", action="store_true", help="skip tasks the expert does not solve")
    args = parser.parse_args(argv)

    from examples.multi_turn_tcod.env_adapter import build_interaction_env

    env_args = argparse.Namespace(rollout_interaction_env_path=args.env_path)

    def make_env(_args, sample):
        return build_interaction_env(env_args, sample)

    tokenizer = load_tokenizer(args.tokenizer)
    tasks = read_task_samples(args.data)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    written, skipped, tokens = 0, 0, 0
    with open(tmp, "w") as handle:
        for task in tasks:
            try:
                sample = build_expert_sample(make_env, args, task, tokenizer, system=args.system)
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
