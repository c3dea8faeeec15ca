"""``rollout_interaction_env_path`` through the agent loop: upstream's ``build_env(sample, args)`` module (dotted or a
``.py`` file), the reset fallback to ``sample.prompt``, thinking replies, and step returns the loop refuses."""

from __future__ import annotations

import asyncio
import re
import textwrap
from argparse import Namespace

import pytest

from examples.multi_turn_tcod import rollout
from examples.multi_turn_tcod.chat_layout import encode_action, encode_observation, encode_prompt
from slime.utils.tiny_models import build_tokenizer
from slime.utils.types import Sample

TOKENIZER = build_tokenizer()


class State:
    """Stands in for ``slime.rollout.sglang_rollout.GenerateState``: the tokenizer and the abort flag."""

    aborted = False

    def __init__(self, args):
        self.tokenizer = TOKENIZER


class Policy:
    """A fake engine for ``slime.utils.http_utils.post``: replies with ``replies`` in turn (the last repeats)."""

    def __init__(self, replies):
        self.replies, self.payloads = list(replies), []

    async def __call__(self, url, payload, max_retries=60, headers=None):
        self.payloads.append(payload)
        text = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        ids = encode_action(TOKENIZER, text)
        logprobs = [[-0.5, i, None] for i in ids]
        return {"text": text, "meta_info": {"finish_reason": {"type": "stop"}, "output_token_logprobs": logprobs}}


@pytest.fixture
def loop(monkeypatch):
    """``play(env_path, samples, replies, **args)`` -> the finished samples, one engine reply list for all."""
    monkeypatch.setattr(rollout, "GenerateState", State)
    rollout.load_env_module.cache_clear()  # env paths are cached per process; each test names its own

    def play(env_path, samples, replies=("up",), **overrides):
        policy = Policy(replies)
        monkeypatch.setattr(rollout, "post", policy)
        args = make_args(env_path, **overrides)

        async def run():
            return await asyncio.gather(*(rollout.generate(args, s, {"max_new_tokens": 400}) for s in samples))

        return asyncio.run(run())

    return play


def make_args(env_path, **overrides):
    values = dict(
        hf_checkpoint="tiny",
        sglang_router_ip="127.0.0.1",
        sglang_router_port=1,
        max_turns=4,
        max_turn_response_len=60,
        rollout_interaction_env_path=env_path,
        env_step_timeout=30,
        rollout_max_context_len=None,
        eval_max_context_len=None,
        partial_rollout=False,
        use_opd=False,
        opd_type=None,
        use_tcod=False,
        apply_chat_template=False,
        apply_chat_template_kwargs={},
    )
    return Namespace(**{**values, **overrides})


def prompt_ids(sample):
    return sample.tokens[: len(sample.tokens) - sample.response_length]


def write_module(tmp_path, name, source):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return str(path)


# Shaped like upstream's examples/geo3k_vlm_multi_turn: reset() gives no observation, the task is the prompt.
QUIZ = """
class QuizEnv:
    def __init__(self, answer, first):
        self.answer, self.first = answer, first
    def reset(self):
        return self.first, {}
    def step(self, response_text):
        right = response_text.strip() == self.answer
        return {"obs_str": "correct" if right else "try again"}, right, {"reward": float(right), "success": right}
    def format_observation(self, observation):
        return {"role": "user", "content": observation["obs_str"]}
    def close(self):
        CLOSED.append(True)

CLOSED = []
FIRST = {"none": None, "empty_dict": {}, "empty_text": "", "dict": {"obs_str": "what is 2 + 2 ?"}}

def build_env(sample=None, args=None):
    return QuizEnv(sample.label, FIRST[sample.metadata["first"]])
"""


@pytest.mark.parametrize("first", ["none", "empty_dict", "empty_text"])
def test_a_py_file_env_whose_reset_gives_no_observation_plays_the_sample_prompt(loop, tmp_path, first):
    path = write_module(tmp_path, f"quiz_env_{first}", QUIZ)
    sample = Sample(index=0, prompt="2 + 2 ?", label="4", metadata={"first": first})
    [done] = loop(path, [sample], replies=["5", "4"])
    assert prompt_ids(done) == encode_prompt(TOKENIZER, "2 + 2 ?")
    assert done.metadata["outcome"] == "done" and done.metadata["success"] and done.metadata["num_turns"] == 2
    assert done.metadata["turn_rewards"] == [0.0, 1.0] and done.reward == 1.0
    [_, second] = done.metadata["turn_spans"]
    response = done.tokens[len(prompt_ids(done)) :]
    assert response[done.metadata["turn_spans"][0][1] : second[0]] == encode_observation(TOKENIZER, "try again")
    assert rollout.load_env_module(path).CLOSED == [True]


def test_a_structured_first_observation_goes_through_format_observation(loop, tmp_path):
    path = write_module(tmp_path, "quiz_env_dict", QUIZ)
    [done] = loop(path, [Sample(index=0, prompt="ignored", label="4", metadata={"first": "dict"})], replies=["4"])
    assert prompt_ids(done) == encode_prompt(TOKENIZER, "what is 2 + 2 ?")
    assert done.metadata["outcome"] == "done"


def test_thinking_replies_play_the_action_after_the_thought(loop):
    from examples.agent_envs import build_env

    metadata = {"env": "hanoi", "seed": 1, "disks": 3}
    env = build_env(Sample(metadata=metadata))
    first, _ = env.reset()
    replies = [f"<think>\nmove A B? no.\n</think>\n\n{a}" for a in env.expert_actions()]
    [done] = loop("examples.agent_envs", [Sample(index=0, metadata=metadata)], replies=replies, max_turns=10)
    assert prompt_ids(done) == encode_prompt(TOKENIZER, first)
    assert done.metadata["outcome"] == "done" and done.metadata["success"] and done.metadata["task_reward"] == 1.0
    assert done.metadata["num_turns"] == len(replies) and not done.remove_sample
    # A reply cut inside its thought reaches the env as an invalid step; the episode goes on.
    [cut] = loop("examples.agent_envs", [Sample(index=1, metadata=metadata)], replies=["<think>\nmove"], max_turns=2)
    assert cut.metadata["outcome"] == "max_turns" and not cut.metadata["success"]
    assert "ended inside <think>" in cut.response


@pytest.mark.parametrize(
    "step_return,match",
    [
        ("('obs', 0.0, False, {})", r"must return \(observation, done, info\), got tuple"),
        ("'obs'", r"must return \(observation, done, info\), got str"),
        ("('obs', False, ['x'])", r"must return \(observation, done, info\)"),
        ("('obs', False, {'reward': 'lots'})", r"info\['reward'\] = 'lots'; it must be a finite number"),
        ("('obs', False, {'reward': float('nan')})", r"info\['reward'\] = nan"),
    ],
)
def test_a_malformed_step_fails_its_episode_and_the_run_goes_on(loop, tmp_path, step_return, match):
    path = write_module(
        tmp_path,
        f"bad_env_{abs(hash(step_return))}",
        f"""
        CLOSED = []
        class Env:
            def __init__(self, index):
                self.index = index
            def reset(self):
                return "start", {{}}
            def step(self, response_text):
                if self.index == 0:
                    return {step_return}
                return "fine", True, {{"reward": 1.0, "success": True}}
            def format_observation(self, observation):
                return {{"role": "user", "content": observation}}
            def close(self):
                CLOSED.append(self.index)
        def build_env(sample, args):
            return Env(sample.index)
        """,
    )
    bad, good = loop(path, [Sample(index=0, prompt="p"), Sample(index=1, prompt="p")])
    assert bad.metadata["outcome"] == "env_error" and bad.status == Sample.Status.FAILED and bad.remove_sample
    assert bad.metadata["task_reward"] == 0.0  # nothing of the broken step reached the bookkeeping
    assert re.search(match, bad.metadata["error"]), bad.metadata["error"]
    assert good.metadata["outcome"] == "done" and good.status == Sample.Status.COMPLETED and not good.remove_sample
    assert sorted(rollout.load_env_module(path).CLOSED) == [0, 1]  # the failed episode's env is closed too


@pytest.mark.parametrize(
    "first,formatted,match",
    [
        ("{'obs': 'start'}", "observation['obs']", r"must return a text message, got 'start'"),
        ("{'obs': 'start'}", "{'role': 'user', 'content': ['start']}", r"must return a text message, got \{'role'"),
        ("'start'", "{'role': 'user', 'content': observation['missing']}", r"format_observation\(\): KeyError"),
    ],
)
def test_a_malformed_formatted_observation_fails_its_episode(loop, tmp_path, first, formatted, match):
    path = write_module(
        tmp_path,
        f"bad_format_{abs(hash(first + formatted))}",
        f"""
        class Env:
            def reset(self):
                return {first}, {{}}
            def step(self, response_text):
                return {{"other": 1}}, False, {{}}
            def format_observation(self, observation):
                return {formatted}
        def build_env(sample, args):
            return Env()
        """,
    )
    [bad] = loop(path, [Sample(index=0, prompt="p")])
    assert bad.metadata["outcome"] == "env_error" and bad.status == Sample.Status.FAILED and bad.remove_sample
    assert re.search(match, bad.metadata["error"]), bad.metadata["error"]


def test_env_paths_are_checked(loop, tmp_path):
    with pytest.raises(ValueError, match="has no callable build_env"):
        loop("examples.agent_envs.puzzle", [Sample(index=0, metadata={"env": "gridnav", "seed": 0})])
    with pytest.raises(ModuleNotFoundError):
        loop("examples.agent_envs.make_env", [Sample(index=0, metadata={"env": "gridnav", "seed": 0})])
    [failed] = loop("examples.agent_envs", [Sample(index=0, prompt="p", metadata={"seed": 0})])
    assert failed.metadata["outcome"] == "env_error" and "no 'env'" in failed.metadata["error"]
