"""TCOD's curriculum and the multi-turn agent loop on a scripted engine, with Qwen3-style thinking replies (CPU)."""

import argparse
import asyncio
import base64
import string
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # `examples` is not an installed package
    sys.path.insert(0, str(REPO_ROOT))

from examples.multi_turn_tcod import metrics, rollout  # noqa: E402
from examples.multi_turn_tcod.envs import gridnav as gridnav_module  # noqa: E402
from examples.multi_turn_tcod.envs.make_data import task_rows  # noqa: E402

from slime.rollout import sample_hooks  # noqa: E402
from slime.rollout.tcod import b2f_prefix_length, check_episode_planned, curriculum_depth, episode_plan  # noqa: E402
from slime.utils.types import Sample  # noqa: E402

NUM_GPUS = 0
pytestmark = pytest.mark.unit

# Qwen3's generation prompt: with enable_thinking=False an empty think block opens the assistant turn.
QWEN3_LIKE_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}"
)
THINK = "<think>\nThe goal is further along; one step closer.\n</think>\n\n"


def test_depth_grows_every_eta_steps_up_to_k_max():
    assert [curriculum_depth(n, 1, 3, 4) for n in range(14)] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 4, 4]
    assert curriculum_depth(0, 2, 5, 9) == 2


def test_b2f_prefix_is_expert_length_minus_depth():
    assert [b2f_prefix_length(5, curriculum_depth(n, 1, 2, 10)) for n in range(10)] == [4, 4, 3, 3, 2, 2, 1, 1, 0, 0]
    assert b2f_prefix_length(None, 2) == 0  # no expert actions: the whole episode


@pytest.mark.parametrize("step,k_start,eta,k_max", [(-1, 1, 1, 1), (0, 0, 1, 1), (0, 1, 0, 1), (0, 3, 1, 2)])
def test_schedule_rejects_bad_parameters(step, k_start, eta, k_max):
    with pytest.raises(ValueError):
        curriculum_depth(step, k_start, eta, k_max)


def test_evaluation_and_vanilla_opd_play_full_episodes():
    full = {"mode": "full", "max_turns": 10, "step": 5}
    assert episode_plan(make_args(), 5, 10, evaluation=True) == full
    assert episode_plan(make_args(use_tcod=False), 5, 10) == full


def test_plan_needs_the_rollout_id_and_a_k_max_within_max_turns():
    with pytest.raises(RuntimeError, match="rollout id"):
        episode_plan(make_args(), None, 10)
    with pytest.raises(ValueError, match=r"--tcod-k-max \(8\) must be <= the episode's max_turns \(3\)"):
        episode_plan(make_args(), 0, 3)
    assert episode_plan(make_args(tcod_k_max=None), 100, 6)["depth"] == 6  # unset: the generate function's limit


def test_an_unset_environment_path_is_refused():
    with pytest.raises(ValueError, match="rollout_interaction_env_path is not set"):
        rollout.load_env_module(None)


def test_a_sample_the_curriculum_did_not_plan_fails_the_hook():
    args = SimpleNamespace(custom_generate_function_path="examples.geo3k_vlm_multi_turn.rollout.generate")
    with pytest.raises(RuntimeError, match="multi_turn.rollout.generate did not play TCOD's curriculum for rollout 3"):
        check_episode_planned(args, Sample(metadata={"episode_plan": {"step": 2}}), rollout_id=3)
    per_sample = Sample()
    per_sample.generate_function_path = "my_eval.generate"  # an eval dataset's own generate function ran
    with pytest.raises(RuntimeError, match="--use-tcod: my_eval.generate did not play"):
        check_episode_planned(args, per_sample, rollout_id=3)
    check_episode_planned(args, Sample(metadata={"episode_plan": {"step": 3}}), rollout_id=3)
    check_episode_planned(args, Sample(), rollout_id=3, evaluation=True)


def qwen3_like_tokenizer():
    """Character-level ChatML tokenizer built here; ``<think>`` is an added, non-special token as in Qwen3."""
    with pytest.MonkeyPatch.context() as mp:  # past another test's transformers stub, if one is installed
        if "transformers" in sys.modules and getattr(sys.modules["transformers"], "__file__", None) is None:
            mp.delitem(sys.modules, "transformers")
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast
    chars = [c for c in string.printable if c not in "\r\x0b\x0c"]
    vocab = {t: i for i, t in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>", *chars])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "additional_special_tokens": ["<|im_start|>"]}
    tok = PreTrainedTokenizerFast(tokenizer_object=core, **special)
    tok.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    tok.chat_template = QWEN3_LIKE_TEMPLATE
    return tok


@pytest.fixture(scope="module")
def tokenizer():
    return qwen3_like_tokenizer()


def FakeState(tokenizer):  # noqa: N802 - GenerateState's stand-in: the tokenizer and abort()'s flag
    return SimpleNamespace(tokenizer=tokenizer, aborted=False)


class ScriptedEngine:
    """Answers /generate with scripted replies, cut at ``max_new_tokens`` as SGLang cuts them."""

    routing = True  # routed experts when the payload asks for them

    def __init__(self, tokenizer, policy):
        self.tokenizer, self.policy, self.requests, self.headers = tokenizer, policy, [], []

    async def post(self, url, payload, max_retries=60, headers=None):
        self.requests.append(dict(payload, input_ids=list(payload["input_ids"])))  # the loop grows its list
        self.headers.append(headers)
        limit = payload["sampling_params"]["max_new_tokens"]
        reply = self.policy(len(self.requests) - 1) if limit else ""  # max_new_tokens 0: a prefill, no reply
        if reply is None:
            return {"text": "", "meta_info": {"finish_reason": {"type": "abort"}, "output_token_logprobs": []}}
        ids = self.tokenizer.encode(reply, add_special_tokens=False)
        if limit and not reply.endswith(self.tokenizer.pad_token):  # a reply may also stop on <|endoftext|>
            ids.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        finish = {"type": "stop", "matched": ids[-1]} if ids and len(ids) <= limit else {"type": "length"}
        ids = ids[:limit]
        meta = {"finish_reason": finish, "output_token_logprobs": [[-0.5, i, None] for i in ids]}
        if payload.get("return_routed_experts") and self.routing:  # as SGLang: int32 rows for all tokens but the last
            rows = [[t % 8, (t + 1) % 8] * 2 for t in (payload["input_ids"] + ids)[:-1]]
            meta["routed_experts"] = base64.b64encode(np.asarray(rows, dtype=np.int32).tobytes()).decode()
        return {"text": self.tokenizer.decode(ids), "meta_info": meta}


def make_args(**overrides):
    args = argparse.Namespace(
        hf_checkpoint="unused",
        max_turns=8,
        max_turn_response_len=128,
        rollout_max_context_len=None,
        eval_max_context_len=None,
        rollout_interaction_env_path="examples.multi_turn_tcod.envs.gridnav",
        env_step_timeout=30,
        sglang_router_ip="127.0.0.1",
        sglang_router_port=1,
        partial_rollout=False,
        apply_chat_template=False,
        apply_chat_template_kwargs={},
        use_opd=True,
        opd_type="sglang",
        custom_rm_path="slime.rollout.on_policy_distillation.reward_func",
        use_tcod=True,
        tcod_mode="f2b",
        tcod_k_start=1,
        tcod_eta=2,
        tcod_k_max=8,
        n_samples_per_prompt=1,
    )
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


@pytest.fixture(scope="module")
def tasks():
    return list(task_rows(3, seed=0, params={"size": 5}, min_len=4, max_len=8))


@pytest.fixture(scope="module")
def moves(tasks):
    """The first task's expert actions: a policy that plays them solves it."""
    return tasks[0]["metadata"]["expert_actions"]


def play(monkeypatch, tokenizer, args, row, step, policy, evaluation=False, max_new_tokens=4000, state=None, **fields):
    engine = ScriptedEngine(tokenizer, policy)
    params = {"temperature": 1.0, "max_new_tokens": max_new_tokens, **fields.pop("sampling", {})}
    state = state or FakeState(tokenizer)
    monkeypatch.setattr(rollout, "post", engine.post)
    monkeypatch.setattr(rollout, "GenerateState", lambda args: state)
    monkeypatch.setattr(sample_hooks, "_current_rollout_id", step)
    sample = Sample(index=0, prompt=row["input"], label=row["label"], metadata=dict(row["metadata"]), **fields)
    return asyncio.run(rollout.generate(args, sample, params, evaluation)), engine


def trained_text(tokenizer, sample):
    ids = sample.tokens[len(sample.tokens) - sample.response_length :]
    return tokenizer.decode([t for t, m in zip(ids, sample.loss_mask, strict=True) if m])


def test_thinking_reply_acts_on_what_follows_think(monkeypatch, tokenizer, tasks, moves):
    args = make_args(use_tcod=False)
    sample, engine = play(monkeypatch, tokenizer, args, tasks[0], step=0, policy=lambda i: THINK + moves[i])
    assert sample.metadata["outcome"] == "done" and sample.metadata["success"]
    assert sample.metadata["num_turns"] == len(moves) and sample.metadata["turns_without_stop"] == 0
    assert trained_text(tokenizer, sample) == "".join(THINK + m + "<|im_end|>" for m in moves)
    assert "Invalid" not in tokenizer.decode(sample.tokens)
    assert len(tokenizer.encode("<think>", add_special_tokens=False)) == 1  # as Qwen3's: one added, non-special


def test_turn_cut_mid_thought_is_closed_masked_and_keeps_routed_experts(monkeypatch, tokenizer, tasks):
    args = make_args(use_tcod=False, max_turns=2, max_turn_response_len=20, use_rollout_routing_replay=True)
    args.num_layers, args.moe_router_topk = 2, 2
    sample, engine = play(monkeypatch, tokenizer, args, tasks[0], step=0, policy=lambda i: THINK + "right")
    assert len(engine.requests) == 2 and sample.metadata["num_turns"] == 2
    assert sample.metadata["turns_without_stop"] == 2 and sample.metadata["outcome"] == "max_turns"
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    response = sample.tokens[len(sample.tokens) - sample.response_length :]
    first_end = sample.metadata["turn_spans"][0][1]
    assert response[first_end] == stop and sample.loss_mask[first_end] == 0  # the closing <|im_end|> is masked
    assert sum(sample.loss_mask) == 40  # two 20-token turns, nothing else trained
    assert "the reply ended inside <think>" in tokenizer.decode(engine.requests[1]["input_ids"])
    expected = [[[t % 8, (t + 1) % 8]] * 2 for t in sample.tokens[:-1]]  # the cut last turn is left open
    assert all(r["return_routed_experts"] for r in engine.requests)
    assert torch.as_tensor(sample.rollout_routed_experts).tolist() == expected


def test_non_thinking_mode_goes_through_the_chat_template_kwargs(monkeypatch, tokenizer, tasks):
    args = make_args(use_tcod=False, max_turns=2, apply_chat_template_kwargs={"enable_thinking": False})
    sample, engine = play(monkeypatch, tokenizer, args, tasks[0], step=0, policy=lambda i: "noop")
    for request in engine.requests:  # the prompt and every later assistant turn open with an empty think block
        assert tokenizer.decode(request["input_ids"]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_f2b_plays_exactly_the_step_depth(monkeypatch, tokenizer, tasks):
    sample, engine = play(monkeypatch, tokenizer, make_args(), tasks[0], step=4, policy=lambda i: THINK + "noop")
    assert len(engine.requests) == 3 and sample.metadata["num_turns"] == 3  # k(4) = 1 + 4 // 2
    assert sample.metadata["outcome"] == "cut" and sample.status == Sample.Status.COMPLETED
    assert sample.metadata["episode_plan"] == {"mode": "f2b", "depth": 3, "max_turns": 3, "step": 4}
    assert trained_text(tokenizer, sample) == (THINK + "noop<|im_end|>") * 3  # observations are masked
    assert len(sample.rollout_log_probs) == len(sample.loss_mask) == sample.response_length
    assert sample.reward is None  # the teacher's reward_func runs next, as the OPD reward hooks expect


def test_b2f_replays_the_expert_prefix_untrained(monkeypatch, tokenizer, tasks):
    row = tasks[1]
    expert = row["metadata"]["expert_actions"]
    nxt = iter(expert[len(expert) - 2 :])  # the student finishes the path from where the replay left it
    args = make_args(tcod_mode="b2f")
    sample, engine = play(monkeypatch, tokenizer, args, row, step=2, policy=lambda i: THINK + next(nxt))
    assert sample.metadata["prefix_turns"] == len(expert) - 2  # L - k(2)
    assert sample.metadata["outcome"] == "done" and sample.metadata["success"]
    assert trained_text(tokenizer, sample) == "".join(THINK + a + "<|im_end|>" for a in expert[-2:])
    assert all(a in tokenizer.decode(engine.requests[0]["input_ids"]) for a in expert[:-2])


@pytest.mark.parametrize("max_turns", [5, 3])  # the official range(start_step, max_env_steps): the prefix counts
def test_b2f_replayed_and_student_turns_share_max_turns(monkeypatch, tokenizer, tasks, max_turns):
    args = make_args(tcod_mode="b2f", tcod_eta=100, max_turns=max_turns, tcod_k_max=None)  # k(0) = 1
    expert = tasks[1]["metadata"]["expert_actions"]  # 5 actions: 4 replayed
    sample, engine = play(monkeypatch, tokenizer, args, tasks[1], step=0, policy=lambda i: "noop")
    assert len(expert) == 5 and sample.metadata["prefix_turns"] == min(4, max_turns)  # 3: nothing left to train
    assert len(engine.requests) == sample.metadata["num_turns"] == max_turns - min(4, max_turns)
    assert sample.metadata["outcome"] == "max_turns" and sample.remove_sample == (max_turns < 5)


def test_b2f_replay_that_finishes_the_task_is_not_trained(monkeypatch, tokenizer, tasks):
    args = make_args(tcod_mode="b2f", tcod_eta=100)
    expert = tasks[2]["metadata"]["expert_actions"]
    row = dict(tasks[2], metadata={**tasks[2]["metadata"], "expert_actions": expert * 2})
    sample, engine = play(monkeypatch, tokenizer, args, row, step=0, policy=lambda i: "noop")
    assert sample.metadata["outcome"] == "replay_finished" and not engine.requests
    assert sample.remove_sample and not any(sample.loss_mask)  # the replay is all masked


def test_evaluation_plays_the_full_episode_on_its_own_budget(monkeypatch, tokenizer, tasks, moves):
    row = tasks[0]
    sample, engine = play(
        monkeypatch, tokenizer, make_args(), row, 6, lambda i: THINK + moves[i], evaluation=True, max_new_tokens=5000
    )
    assert sample.metadata["success"] and sample.reward == sample.metadata["task_reward"] > 0
    assert sample.metadata["episode_plan"]["mode"] == "full"
    assert engine.requests[0]["sampling_params"]["max_new_tokens"] == 128  # the turn limit, within eval's 5000
    sample, engine = play(
        monkeypatch, tokenizer, make_args(), row, 6, lambda i: "noop", evaluation=True, max_new_tokens=60
    )
    assert engine.requests[0]["sampling_params"]["max_new_tokens"] == 60  # eval's own budget
    assert sample.response_length <= 60 and sample.metadata["outcome"] == "context_full"
    prompt = len(engine.requests[0]["input_ids"])
    for evaluation, budget in ((True, 50), (False, 70)):  # --eval-max-context-len in evaluation only
        args = make_args(rollout_max_context_len=prompt + 70, eval_max_context_len=prompt + 50)
        _, engine = play(monkeypatch, tokenizer, args, row, 6, lambda i: "noop", evaluation=evaluation)
        assert engine.requests[0]["sampling_params"]["max_new_tokens"] == budget


def test_b2f_replay_that_outgrows_the_budget_ends_the_episode(monkeypatch, tokenizer, tasks):
    args = make_args(tcod_mode="b2f", tcod_eta=100)
    sample, engine = play(monkeypatch, tokenizer, args, tasks[1], 0, lambda i: "noop", max_new_tokens=40)
    assert sample.metadata["outcome"] == "context_full" and sample.status == Sample.Status.TRUNCATED
    assert not engine.requests and sample.remove_sample and sample.response_length <= 40


def test_no_request_once_the_rollout_is_aborted_during_an_env_step(monkeypatch, tokenizer, tasks):
    state = FakeState(tokenizer)
    real_step = gridnav_module.GridNavEnv.step

    def step_then_abort(self, response_text):  # abort() lands while the env is stepping
        state.aborted = True
        return real_step(self, response_text)

    monkeypatch.setattr(gridnav_module.GridNavEnv, "step", step_then_abort)
    sample, engine = play(monkeypatch, tokenizer, make_args(use_tcod=False), tasks[0], 0, lambda i: "up", state=state)
    assert len(engine.requests) == 1 and sample.status == Sample.Status.ABORTED
    assert sample.metadata["outcome"] == "aborted"


def test_megatron_teacher_trains_pure_opd(monkeypatch, tokenizer, tasks, moves):
    args = make_args(use_tcod=False, opd_type="megatron", custom_rm_path=None)
    sample, _ = play(monkeypatch, tokenizer, args, tasks[0], step=0, policy=lambda i: moves[i])
    assert sample.metadata["success"] and sample.metadata["num_turns"] == len(moves)  # no think block: acts
    assert sample.reward == 0.0 and sample.metadata["task_reward"] == 1.0  # logged, not trained


@pytest.mark.parametrize("by_abort", [True, False])  # slime's abort(), or the engine on its own (not trained)
def test_an_aborted_reply_ends_the_episode_at_once(monkeypatch, tokenizer, tasks, by_abort):
    state = FakeState(tokenizer)
    policy = lambda i: "noop" if i == 0 else setattr(state, "aborted", by_abort)  # noqa: E731 - None: aborted
    sample, engine = play(monkeypatch, tokenizer, make_args(use_tcod=False), tasks[0], 0, policy, state=state)
    outcome, status = ("aborted", Sample.Status.ABORTED) if by_abort else ("engine_abort", Sample.Status.FAILED)
    assert len(engine.requests) == 2 and sample.status == status and any(sample.loss_mask)  # after a trained turn
    assert sample.metadata["outcome"] == outcome and sample.metadata["num_turns"] == 1
    assert sample.remove_sample or by_abort  # a failed episode never trains


def test_an_environment_fault_fails_only_its_episode(monkeypatch, tokenizer, tasks):
    broken = dict(tasks[0], metadata={**tasks[0]["metadata"], "size": 99})
    sample, engine = play(monkeypatch, tokenizer, make_args(), broken, step=0, policy=lambda i: "noop")
    assert sample.status == Sample.Status.FAILED and "size" in sample.metadata["error"]
    assert sample.remove_sample and not engine.requests


def test_an_environment_step_past_env_step_timeout_fails_its_episode(monkeypatch, tokenizer, tasks):
    released = threading.Event()
    real_step = gridnav_module.GridNavEnv.step
    monkeypatch.setattr(gridnav_module.GridNavEnv, "blocking", True)  # called in a thread, bounded by the timeout
    monkeypatch.setattr(
        gridnav_module.GridNavEnv, "step", lambda env, text: (released.wait(10), real_step(env, text))[1]
    )
    monkeypatch.setattr(gridnav_module.GridNavEnv, "close", lambda env: released.set())  # lets the thread end
    args = make_args(use_tcod=False, max_turns=1, env_step_timeout=0.5)
    sample, engine = play(monkeypatch, tokenizer, args, tasks[0], step=0, policy=lambda i: "up")
    assert sample.metadata["outcome"] == "env_error" and sample.status == Sample.Status.FAILED
    assert "within 0.5 s (env_step_timeout)" in sample.metadata["error"] and sample.remove_sample


@pytest.mark.parametrize("tcod_mode", ["f2b", "b2f"])
def test_a_turn_limit_completes_the_episode_in_either_mode(monkeypatch, tokenizer, tasks, tcod_mode):
    sample, _ = play(monkeypatch, tokenizer, make_args(tcod_mode=tcod_mode), tasks[0], 0, lambda i: "noop")
    assert sample.metadata["outcome"] == {"f2b": "cut", "b2f": "max_turns"}[tcod_mode]
    assert sample.status == Sample.Status.COMPLETED  # truncated_ratio counts only the token budgets


def turn_seeds(engine):
    return [r["sampling_params"]["sampling_seed"] for r in engine.requests]


def test_each_turn_draws_with_its_own_sampling_seed(monkeypatch, tokenizer, tasks):
    args = make_args(use_tcod=False, max_turns=3, n_samples_per_prompt=4)
    _, engine = play(monkeypatch, tokenizer, args, tasks[0], 0, lambda i: "noop", sampling={"sampling_seed": 7})
    assert turn_seeds(engine) == [11, 15, 19]  # seed + (1 + turn) * n_samples_per_prompt


def test_b2f_student_turns_draw_past_the_seeds_of_the_replayed_turns(monkeypatch, tokenizer, tasks, moves):
    args = make_args(tcod_mode="b2f", n_samples_per_prompt=4)  # step 0: depth 1, the first L - 1 moves replayed
    seeded = {"sampling_seed": 7}
    sample, engine = play(monkeypatch, tokenizer, args, tasks[0], 0, lambda i: moves[-1], sampling=seeded)
    assert sample.metadata["prefix_turns"] == len(moves) - 1 and sample.metadata["outcome"] == "done"
    assert turn_seeds(engine) == [7 + len(moves) * 4]  # the episode's turn L - 1, not its first


def test_no_two_samples_of_a_group_draw_a_turn_with_the_same_seed(monkeypatch, tokenizer, tasks):
    group = 4
    args = make_args(use_tcod=False, max_turns=3, n_samples_per_prompt=group)
    seeds = []
    for i in range(group):  # under deterministic inference sample i of a group samples with rollout_seed + i
        sampling = {"sampling_seed": 7 + i}
        _, engine = play(monkeypatch, tokenizer, args, tasks[0], 0, lambda t: "noop", sampling=sampling)
        seeds += turn_seeds(engine)
    assert len(seeds) == group * 3 and len(set(seeds)) == len(seeds)


@pytest.mark.parametrize("apply_chat_template", [False, True])
def test_a_reset_without_observation_starts_from_the_sample_prompt(monkeypatch, tokenizer, tasks, apply_chat_template):
    real_reset = gridnav_module.GridNavEnv.reset
    monkeypatch.setattr(gridnav_module.GridNavEnv, "reset", lambda self: (real_reset(self), ({}, {}))[1])  # as geo3k
    rendered = "<|im_start|>user\nWalk to the goal.<|im_end|>\n<|im_start|>assistant\n"
    # With --apply-chat-template the dataset holds the rendered prompt: it is not templated a second time.
    row = dict(tasks[0], input=rendered if apply_chat_template else "Walk to the goal.")
    args = make_args(use_tcod=False, max_turns=1, apply_chat_template=apply_chat_template)
    sample, engine = play(monkeypatch, tokenizer, args, row, 0, lambda i: "up")
    assert tokenizer.decode(engine.requests[0]["input_ids"]) == rendered
    assert sample.metadata["outcome"] != "env_error"


def test_episode_turns_carry_the_session_routing_key(monkeypatch, tokenizer, tasks, moves):
    args = make_args(use_tcod=False, router_policy="consistent_hashing")
    _, engine = play(monkeypatch, tokenizer, args, tasks[0], 0, lambda i: moves[i], session_id="episode-7")
    assert engine.headers == [{"X-SMG-Routing-Key": "episode-7"}] * len(moves)
    _, engine = play(monkeypatch, tokenizer, make_args(use_tcod=False), tasks[0], 0, lambda i: moves[i])
    assert engine.headers == [None] * len(moves)  # other router policies route by load


def test_a_reply_ending_on_another_eos_is_a_finished_turn(monkeypatch, tokenizer, tasks, moves):
    args = make_args(use_tcod=False)
    sample, engine = play(monkeypatch, tokenizer, args, tasks[0], 0, lambda i: THINK + moves[i] + "<|endoftext|>")
    assert sample.metadata["success"] and sample.metadata["turns_without_stop"] == 0
    eos, stop = tokenizer.pad_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")
    response = sample.tokens[len(sample.tokens) - sample.response_length :]
    end = sample.metadata["turn_spans"][0][1]
    assert response[end - 1 : end + 1] == [eos, stop] and sample.loss_mask[end - 1 : end + 1] == [1, 0]


def test_a_removed_episode_replays_the_engine_s_own_routing(monkeypatch, tokenizer, tasks):
    """Removed samples stay in the batch: what the engine never routed gets its routing from a prefill request."""
    broken = dict(tasks[0], metadata={**tasks[0]["metadata"], "size": 99})
    args = make_args(use_rollout_routing_replay=True, num_layers=2, moe_router_topk=2)
    args.router_policy = "consistent_hashing"  # the prefill lands on the engine that holds the episode's prefix
    sample, engine = play(monkeypatch, tokenizer, args, broken, step=0, policy=lambda i: "noop", session_id="ep-7")
    assert sample.remove_sample and [r["sampling_params"]["max_new_tokens"] for r in engine.requests] == [0]
    assert engine.headers == [{"X-SMG-Routing-Key": "ep-7"}]
    assert engine.requests[0]["input_ids"] == sample.tokens and engine.requests[0]["return_routed_experts"]
    expected = [[[t % 8, (t + 1) % 8]] * 2 for t in sample.tokens[:-1]]  # what the engine routed, not made up
    assert torch.as_tensor(sample.rollout_routed_experts).tolist() == expected
    monkeypatch.setattr(ScriptedEngine, "routing", False)  # no episode is ever given made-up routing
    with pytest.raises(RuntimeError, match="the engine routed 0 of"):
        play(monkeypatch, tokenizer, args, broken, step=0, policy=lambda i: "noop")


def test_rollout_log_hook_metrics_and_ci_checks(monkeypatch, tokenizer, tasks):
    args = make_args(ci_test=True)
    sample, _ = play(monkeypatch, tokenizer, args, tasks[0], step=2, policy=lambda i: "noop")  # depth 2
    teacher = [-0.25] * sample.response_length  # the teacher's reply, as logged before post-processing
    sample.reward = {"meta_info": {"input_token_logprobs": [[None, 0, None]] + [[t, 0, None] for t in teacher]}}
    extra = {}
    assert metrics.log_rollout_data(2, args, [[sample]], extra, 0.0) is False
    trained = sum(sample.loss_mask)
    assert extra["tcod/depth"] == 2 and extra["tcod/turns"] == 2 and extra["tcod/teacher_scored"] == 1.0
    assert extra["tcod/kl_mean"] == pytest.approx(-0.25) and extra["tcod/kl_turn_2"] == pytest.approx(-0.25)
    assert extra["tcod/kl_trajectory_mean"] == pytest.approx(-0.25 * trained)
    assert extra["tcod/return"] == 0.0 and extra["tcod/turns_cut"] == 0.0
    with pytest.raises(AssertionError, match="expected depth 3"):
        metrics.log_rollout_data(4, args, [sample], {}, 0.0)  # k(4) = 3: this sample was planned at 2
    sample.reward = None
    with pytest.raises(AssertionError, match="unscored"):
        metrics.log_rollout_data(2, args, [sample], {}, 0.0)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__]))
