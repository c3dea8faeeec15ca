"""The multi-turn TCOD agent loop on a fake engine, and the example environments' contract (CPU)."""

import argparse
import asyncio
import string

import pytest
from examples.multi_turn_tcod import metrics, rollout
from examples.multi_turn_tcod.envs import build_env
from examples.multi_turn_tcod.envs.make_data import task_rows
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from slime.rollout.tcod import episode_plan
from slime.utils.types import Sample

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    """A character-level ChatML tokenizer built here: nothing is downloaded."""
    chars = [c for c in string.printable if c not in "\r\x0b\x0c"]
    vocab = {t: i for i, t in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>", *chars])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


class FakeEngine:
    """Answers /generate with a scripted action per request, with a log-prob per token."""

    def __init__(self, tokenizer, policy):
        self.tokenizer, self.policy, self.requests = tokenizer, policy, []

    async def post(self, url, payload, max_retries=60, headers=None):
        self.requests.append(payload)
        text = self.policy(len(self.requests) - 1)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [
            self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        ]
        ids = ids[: payload["sampling_params"]["max_new_tokens"]]
        return {"output_ids": ids, "meta_info": {"output_token_logprobs": [[-0.5, i, None] for i in ids]}}


def make_args(**overrides):
    args = argparse.Namespace(
        hf_checkpoint="unused",
        max_turns=8,
        max_turn_response_len=16,
        rollout_max_response_len=2000,
        rollout_interaction_env_path="examples.multi_turn_tcod.envs",
        env_step_timeout=30,
        sglang_router_ip="127.0.0.1",
        sglang_router_port=1,
        custom_rm_path="slime.rollout.on_policy_distillation.reward_func",
        use_tcod=True,
        tcod_mode="f2b",
        tcod_k_start=1,
        tcod_eta=2,
        tcod_k_max=8,
    )
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


@pytest.fixture(scope="module")
def tasks():
    return list(task_rows("gridnav", 3, seed=0, params={"size": 5}, min_len=4, max_len=8))


def play(monkeypatch, tokenizer, args, row, step, policy, evaluation=False):
    engine = FakeEngine(tokenizer, policy)
    monkeypatch.setattr(rollout, "post", engine.post)
    monkeypatch.setattr(rollout, "get_tokenizer", lambda args: tokenizer)
    sample = Sample(index=0, prompt=row["input"], label=row["label"], metadata=dict(row["metadata"]))
    plan = episode_plan(args, step, evaluation)
    if plan is not None and not evaluation:
        sample.metadata["episode_plan"] = plan
    return asyncio.run(rollout.generate(args, sample, {"temperature": 1.0}, evaluation)), engine


def trained_text(tokenizer, sample):
    ids = sample.tokens[len(sample.tokens) - sample.response_length :]
    return tokenizer.decode([t for t, m in zip(ids, sample.loss_mask, strict=True) if m])


def test_f2b_plays_exactly_the_step_depth(monkeypatch, tokenizer, tasks):
    args = make_args(tcod_mode="f2b")
    sample, engine = play(monkeypatch, tokenizer, args, tasks[0], step=4, policy=lambda i: "noop")
    assert len(engine.requests) == 3 and sample.metadata["num_turns"] == 3  # k(4) = 1 + 4 // 2
    assert sample.metadata["outcome"] == "cut" and sample.status == Sample.Status.COMPLETED
    assert trained_text(tokenizer, sample) == "noop<|im_end|>" * 3  # observations are masked
    assert len(sample.rollout_log_probs) == len(sample.loss_mask) == sample.response_length
    assert sample.reward is None  # the reward model (the OPD teacher) runs next, as upstream expects


def test_b2f_replays_the_expert_prefix_untrained(monkeypatch, tokenizer, tasks):
    row = tasks[1]
    expert = row["metadata"]["expert_actions"]
    args = make_args(tcod_mode="b2f")
    nxt = iter(expert[len(expert) - 2 :])  # the student finishes the path from where the replay left it
    sample, engine = play(monkeypatch, tokenizer, args, row, step=2, policy=lambda i: next(nxt))
    assert sample.metadata["prefix_turns"] == len(expert) - 2  # L - k(2)
    assert sample.metadata["outcome"] == "done" and sample.metadata["success"]
    assert trained_text(tokenizer, sample) == "".join(a + "<|im_end|>" for a in expert[-2:])
    assert all(a in tokenizer.decode(engine.requests[0]["input_ids"]) for a in expert[:-2])


def test_b2f_replay_that_finishes_the_task_is_not_trained(monkeypatch, tokenizer, tasks):
    args = make_args(tcod_mode="b2f", tcod_k_start=1, tcod_eta=100)
    row = dict(
        tasks[2], metadata={**tasks[2]["metadata"], "expert_actions": tasks[2]["metadata"]["expert_actions"] * 2}
    )
    sample, engine = play(monkeypatch, tokenizer, args, row, step=0, policy=lambda i: "noop")
    assert sample.metadata["outcome"] == "replay_finished" and not engine.requests
    assert sample.remove_sample and sample.response_length == 1 and sample.loss_mask == [0]


def test_evaluation_plays_the_full_episode_and_keeps_the_return(monkeypatch, tokenizer, tasks):
    row = tasks[0]
    moves = iter(row["metadata"]["expert_actions"])
    sample, _ = play(monkeypatch, tokenizer, make_args(), row, step=0, policy=lambda i: next(moves), evaluation=True)
    assert sample.metadata["success"] and sample.reward == sample.metadata["task_reward"] > 0


def test_missing_plan_with_tcod_is_an_error(monkeypatch, tokenizer, tasks):
    args = make_args()
    monkeypatch.setattr(rollout, "get_tokenizer", lambda args: tokenizer)
    with pytest.raises(ValueError, match="--rollout-function-path slime.rollout.tcod.generate_rollout"):
        asyncio.run(rollout.generate(args, Sample(index=0, metadata=dict(tasks[0]["metadata"])), {}))


def test_an_environment_fault_fails_only_its_episode(monkeypatch, tokenizer, tasks):
    broken = dict(tasks[0], metadata={**tasks[0]["metadata"], "env": "no-such-env"})
    sample, engine = play(monkeypatch, tokenizer, make_args(), broken, step=0, policy=lambda i: "noop")
    assert sample.status == Sample.Status.FAILED and "no-such-env" in sample.metadata["error"]
    assert sample.remove_sample and not engine.requests


def test_environment_contract(tasks):
    row = tasks[0]
    sample = Sample(metadata=dict(row["metadata"]))
    env = build_env(sample=sample, args=None)
    observation, _ = env.reset()
    assert observation == row["input"]
    assert env.format_observation("x") == {"role": "user", "content": "x"}
    done, info = False, {}
    for action in env.expert_actions():
        observation, done, info = env.step(action)
        assert isinstance(observation, str) and isinstance(info["reward"], float)
    assert done and info["success"]
    env.close()


def test_rollout_log_hook_metrics_and_ci_checks(monkeypatch, tokenizer, tasks):
    args = make_args(tcod_mode="f2b", use_opd=True, opd_type="sglang", ci_test=True)
    sample, _ = play(monkeypatch, tokenizer, args, tasks[0], step=2, policy=lambda i: "noop")  # depth 2
    teacher = [-0.25] * sample.response_length  # the teacher's reply, as upstream logs it before post-processing
    sample.reward = {"meta_info": {"input_token_logprobs": [[None, 0, None]] + [[t, 0, None] for t in teacher]}}
    extra = {}
    assert metrics.log_rollout_data(2, args, [[sample]], extra, 0.0) is False
    trained = sum(sample.loss_mask)
    assert extra["tcod/depth"] == 2 and extra["tcod/turns"] == 2 and extra["tcod/teacher_scored"] == 1.0
    assert extra["tcod/kl_mean"] == pytest.approx(-0.25) and extra["tcod/kl_turn_2"] == pytest.approx(-0.25)
    assert extra["tcod/kl_trajectory_mean"] == pytest.approx(-0.25 * trained)
    with pytest.raises(AssertionError, match="expected depth 3"):
        metrics.log_rollout_data(4, args, [sample], {}, 0.0)  # k(4) = 3: this sample was planned at 2
    sample.reward = None
    with pytest.raises(AssertionError, match="unscored"):
        metrics.log_rollout_data(2, args, [sample], {}, 0.0)
