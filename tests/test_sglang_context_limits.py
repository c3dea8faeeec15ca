"""SGLang's length rules, with the hf_engine made as strict as SGLang 0.5.23, and the rollouts that respect
them: the limits read from the servers carried into upstream's --rollout-max-context-len /
--eval-max-context-len, single-turn max_new_tokens cut to them, prompts that already fill the context, the
agent loop's turns, the B2F teacher-prefix turn and the trajectories a teacher server must score."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from _engine_helpers import start_hf_engine
from slime.backends.sglang_utils import engine_info
from slime.backends.sglang_utils.router import point_router_at_engines
from slime.ray.rollout import RolloutManager
from slime.rollout import on_policy_distillation as opd, sample_hooks, sglang_rollout, teacher_prefix
from slime.rollout.sglang_rollout import build_sampling_params, run_async, sampling_seed
from slime.rollout.trainable_samples import select_trainable
from slime.utils.misc import load_function
from slime.utils import http_utils
from slime.utils.arguments import get_parser, validate_args
from slime.utils.tiny_models import save_tiny_checkpoint
from slime.utils.types import Sample, Status

POLICY_CTX, TEACHER_CTX = 200, 180
PROMPT = 164  # tokens of a gridnav first observation (the tokenizer is character level)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("ctx")
    policy_path = save_tiny_checkpoint(root / "policy", hidden_size=32, num_layers=1, num_heads=2, seed=3,
                                       max_position_embeddings=POLICY_CTX)
    teacher_path = save_tiny_checkpoint(root / "teacher", hidden_size=32, num_layers=1, num_heads=2, seed=4,
                                        max_position_embeddings=TEACHER_CTX)
    policy, _ = start_hf_engine(policy_path, deterministic=True)
    teacher, runner = start_hf_engine(teacher_path)
    yield policy, teacher, str(policy_path), runner
    run_async(http_utils.close_session())
    policy.stop()
    teacher.stop()


def post(url, payload):
    return run_async(http_utils.post(f"{url}/generate", payload, max_retries=1, timeout=60))


def rejected(url, payload) -> str:
    with pytest.raises(http_utils.HTTPRequestError) as err:
        post(url, payload)
    assert err.value.status == 400
    return str(err.value)


def requests_served(url) -> int:
    return run_async(http_utils.get(f"{url}/get_server_info", max_retries=1))["generate_requests"]


# ---------------------------------------------------------------------------- the hf_engine, strict
def test_hf_engine_refuses_what_sglang_refuses(engines):
    url = engines[0].url
    ids = lambda n: [5 + i % 90 for i in range(n)]  # noqa: E731
    assert "The input (200 tokens) is longer than the model's context length (200 tokens)." in \
        rejected(url, {"input_ids": ids(200), "sampling_params": {"max_new_tokens": 0}})
    message = rejected(url, {"input_ids": ids(150), "sampling_params": {"max_new_tokens": 51}})
    assert ("Requested token count exceeds the model's maximum context length of 200 tokens. You requested a "
            "total of 201 tokens: 150 tokens from the input messages and 51 tokens for the completion.") in message
    # SGLang's scheduler: prompts of max_req_input_len = context - 6 tokens or more.
    assert "Input length (194 tokens) exceeds the maximum allowed length (194 tokens)." in \
        rejected(url, {"input_ids": ids(194), "sampling_params": {"max_new_tokens": 0}})
    assert post(url, {"input_ids": ids(193), "sampling_params": {"max_new_tokens": 0}})["meta_info"]["prompt_tokens"] == 193
    # Exactly the context: accepted; SGLang's scheduler stops it 2 tokens short (max_req_len - input - 1).
    out = post(url, {"input_ids": ids(150), "sampling_params": {"max_new_tokens": 50, "ignore_eos": True}})
    assert len(out["output_ids"]) == POLICY_CTX - 2 - 150
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 48}
    # No max_new_tokens in the request: SGLang does not check the total (and stops at the context).
    out = post(url, {"input_ids": ids(190), "sampling_params": {"ignore_eos": True}})
    assert len(out["output_ids"]) == POLICY_CTX - 2 - 190


def test_server_info_reports_sglangs_length_fields(engines):
    info = run_async(engine_info.get_server_info(engines[0].url))
    assert info["context_length"] is None  # the launch flag, as in SGLang; the model's own length is used
    assert info["max_req_input_len"] == POLICY_CTX - 6 and info["enable_deterministic_inference"] is True
    limits = engine_info.limits_from_server_info(info)
    assert (limits.context_len, limits.max_prompt_len, limits.deterministic) == (POLICY_CTX, POLICY_CTX - 7, True)


def test_limits_from_sglang_shaped_replies():
    # --context-length given; KV pool smaller than the context (max_req_input_len below context - 6).
    lim = engine_info.limits_from_server_info({"context_length": 32768, "max_req_input_len": 20000,
                                               "enable_deterministic_inference": False})
    assert (lim.context_len, lim.max_prompt_len, lim.deterministic) == (32768, 19999, False)
    # Nothing reported: the model's max_position_embeddings, no prompt bound beyond it.
    lim = engine_info.limits_from_server_info({}, model_context=40960)
    assert (lim.context_len, lim.max_prompt_len, lim.deterministic) == (40960, 40959, None)
    both = engine_info.combine([engine_info.EngineLimits(100, 93, True), engine_info.EngineLimits(80, 73, True)])
    assert (both.context_len, both.max_prompt_len, both.deterministic) == (80, 73, True)


# ---------------------------------------------------------------------------- rollouts
def make_args(engines, *extra, limits=True, **kwargs):
    policy, teacher, path, _ = engines
    args = get_parser().parse_args(["--hf-checkpoint", path, "--rollout-seed", "5", *extra])
    validate_args(args)
    point_router_at_engines(args, [policy.url])
    if limits:  # what RolloutManager.wait_engines does once the engines are up
        manager = RolloutManager.__new__(RolloutManager)
        manager.args = args
        run_async(manager._read_engine_limits())
    return args


def single(args, text, evaluation=False):
    sample = Sample(index=0, prompt=text)
    params = {**build_sampling_params(args, evaluation), "sampling_seed": sampling_seed(args, sample, evaluation)}
    params["ignore_eos"] = True  # a tiny random model must not stop early: the cut is what is tested
    return run_async(sglang_rollout.generate(args, sample, params, evaluation))


def test_single_turn_max_new_tokens_is_cut_to_the_context(engines):
    text = "x" * 170
    unclamped = make_args(engines, "--rollout-max-response-len", "64", limits=False)
    with pytest.raises(http_utils.HTTPRequestError, match="maximum context length of 200"):
        single(unclamped, text)  # what a real SGLang answers, and why the step used to die
    args = make_args(engines, "--rollout-max-response-len", "64")
    assert args.engine_limits["rollout"] == {"context_len": 200, "max_prompt_len": 193, "deterministic": True}
    # A request goes out for a prompt of at most 193 tokens: sequences stop at 194, within the context of 200.
    assert args.rollout_max_context_len == args.eval_max_context_len == POLICY_CTX - 6
    sample = single(args, text)
    assert 0 < sample.response_length <= POLICY_CTX - 170 and len(sample.tokens) <= POLICY_CTX


def test_prompt_that_fills_the_context_is_not_sent(engines):
    args = make_args(engines, "--rollout-max-response-len", "64")
    before = requests_served(engines[0].url)
    sample = single(args, "y" * 195)  # longer than the 193 tokens the engine accepts
    assert requests_served(engines[0].url) == before
    assert sample.status == Status.TRUNCATED and sample.remove_sample and sample.response_length == 0
    assert sample.metadata["outcome"] == "prompt_too_long" and "195 tokens" in sample.metadata["truncated_reason"]
    kept, stats = select_trainable(args, [[sample]])
    assert kept == [] and stats["rollout/dropped"] == 1
    assert run_async(opd.reward_func(args, sample)) == opd.SKIPPED_REPLY  # never reaches the teacher


def test_limits_become_upstreams_context_flags():
    args = get_parser().parse_args(["--use-opd", "--opd-type", "sglang", "--rm-url", "http://t/generate"])
    rollout = {"context_len": 200, "max_prompt_len": 193}
    changes = engine_info.clamp_context_flags(args, {"rollout": rollout, "teacher": {"max_prompt_len": 173}})
    assert (args.rollout_max_context_len, args.eval_max_context_len) == (173, 194)  # eval: no teacher
    assert len(changes) == 2 and "the teacher server" in changes[0] and "unset" in changes[0]
    # A user's smaller value stays; a larger one is lowered; nothing known changes nothing.
    args = get_parser().parse_args(["--rollout-max-context-len", "100", "--eval-max-context-len", "4096"])
    changes = engine_info.clamp_context_flags(args, {"rollout": rollout, "teacher": {"max_prompt_len": 50}})
    assert (args.rollout_max_context_len, args.eval_max_context_len) == (100, 194)  # no teacher server here
    assert changes == ["--eval-max-context-len 194 (lowered from 4096: the longest sequence the rollout engines "
                       "take(s))"]
    assert engine_info.clamp_context_flags(args, {}) == [] and args.rollout_max_context_len == 100
    # Only a context known (no max_req_input_len): the context bounds rollouts, a teacher scores one less.
    assert engine_info.sequence_limit({"context_len": 180, "max_prompt_len": None}) == 180
    assert engine_info.teacher_sequence_limit({"context_len": 180, "max_prompt_len": None}) == 179


def mt_args(engines, *extra, limits=True):
    return make_args(engines, "--max-turns", "6", "--rollout-interaction-env-path",
                     "examples.agent_envs", "--rollout-max-response-len", "400",
                     "--max-turn-response-len", "40", *extra, limits=limits)


def play(args, metas, rollout_id=0, evaluation=False):
    samples = [Sample(index=i, group_index=i, metadata={"env": "gridnav", "seed": i, **meta})
               for i, meta in enumerate(metas)]
    sample_hooks.set_current_rollout_id(rollout_id)
    fn = load_function(args.custom_generate_function_path or "examples.multi_turn_tcod.rollout.generate")

    async def run_all():
        params = build_sampling_params(args, evaluation)
        return await asyncio.gather(*(fn(args, s, {**params, "sampling_seed": sampling_seed(
            args, s, evaluation)}, evaluation) for s in samples))

    return run_async(run_all())


def test_agent_turns_fit_the_engine_context(engines):
    with pytest.raises(http_utils.HTTPRequestError, match="HTTP 400: .*context length"):
        play(mt_args(engines, limits=False), [{}])  # a turn past the engine's context
    for s in play(mt_args(engines), [{}, {}, {}]):
        assert s.metadata["outcome"] in ("done", "context_full") and s.metadata["num_turns"] >= 1
        assert len(s.tokens) <= POLICY_CTX - 6


OPD = ("--use-opd", "--opd-type", "sglang", "--custom-rm-path", "slime.rollout.on_policy_distillation.reward_func")


def test_trajectories_fit_what_the_teacher_server_scores(engines):
    args = mt_args(engines, *OPD, "--rm-url", engines[1].url + "/generate")
    assert args.engine_limits["teacher"]["max_prompt_len"] == TEACHER_CTX - 7
    assert args.rollout_max_context_len == TEACHER_CTX - 7 and args.eval_max_context_len == POLICY_CTX - 6
    samples = play(args, [{}, {}, {}])
    assert all(len(s.tokens) <= TEACHER_CTX - 7 for s in samples)
    replies = run_async(opd.reward_func(args, samples))
    assert all("meta_info" in r or r == opd.SKIPPED_REPLY for r in replies)  # a 400 here would end the step
    # Evaluation is not scored by the teacher: only the policy engine bounds it.
    assert sglang_rollout.token_room(args, 100) == TEACHER_CTX - 7 - 100
    assert sglang_rollout.token_room(args, 100, evaluation=True) == POLICY_CTX - 6 - 100


def test_a_turn_cut_at_the_limit_still_fits_the_teacher(engines):
    args = mt_args(engines, *OPD, "--rm-url", engines[1].url + "/generate")
    samples = play(args, [{}, {}, {}])
    assert all(len(s.tokens) <= args.rollout_max_context_len for s in samples)
    run_async(opd.reward_func(args, samples))


def b2f_args(engines, *extra, limits=True):
    return mt_args(engines, *OPD, "--rm-url", engines[1].url + "/generate", "--use-tcod", "--tcod-mode", "b2f",
                   "--tcod-eta", "1", "--tcod-prefix-source", "teacher", *extra, limits=limits)


def test_b2f_teacher_prefix_turn_checks_the_room_first(engines):
    with pytest.raises(http_utils.HTTPRequestError, match="maximum context length of 180"):
        play(b2f_args(engines, limits=False), [{"min_dist": 4}])  # the teacher asked for 40 after 164
    args = b2f_args(engines, limits=False)
    # Only the teacher's context known (as from a server that reports no max_req_input_len): the turn
    # itself is then what must stay within the teacher's context.
    engine_info.clamp_context_flags(args, {"teacher": {"context_len": TEACHER_CTX, "max_prompt_len": None}})
    assert args.rollout_max_context_len == TEACHER_CTX - 1
    teacher_prefix.CACHE.clear()
    before = requests_served(engines[1].url)
    [s] = play(args, [{"min_dist": 4}])
    served = requests_served(engines[1].url) - before
    # The teacher's own episode (teacher_prefix.py) stops where its context is full, without asking the
    # turn that has no room; an unfinished teacher episode seeds nothing: the task falls back to vanilla.
    [record] = teacher_prefix.CACHE.entries.values()
    assert served >= 1 and record["end"] == "context_full" and record["length"] == served
    assert s.metadata["prefix_fallback"] and s.metadata["prefix_turns"] == 0
    teacher_prefix.CACHE.clear()


def test_prompt_of_a_full_context_leaves_the_episode_out_of_training(engines):
    args = mt_args(engines, limits=False)
    engine_info.clamp_context_flags(args, {"rollout": {"context_len": 150, "max_prompt_len": 143}})
    assert args.rollout_max_context_len == 144
    before = requests_served(engines[0].url)
    [s] = play(args, [{}])
    assert requests_served(engines[0].url) == before
    assert s.metadata["outcome"] == "context_full" and s.remove_sample and s.loss_mask == [0]
    assert select_trainable(args, [[copy.deepcopy(s)]])[0] == []


def test_token_ids_logprob_reports_the_asked_ids_and_names_the_vocabulary(engines):
    url, runner = engines[1].url, engines[3]
    vocab = runner.vocab_size
    ids = [5, 9, 17, 33]
    out = post(url, {"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "temperature": 0},
                     "return_logprob": True, "logprob_start_len": 0, "token_ids_logprob": [vocab - 1, 7]})
    meta = out["meta_info"]
    assert meta["input_token_ids_logprobs"][0] is None and len(meta["input_token_ids_logprobs"]) == len(ids)
    assert len(meta["output_token_ids_logprobs"]) == 2
    with torch.no_grad():
        logp = torch.log_softmax(runner.model(torch.tensor([ids])).logits[0].float(), -1)
    for pos in range(1, len(ids)):
        got = meta["input_token_ids_logprobs"][pos]
        assert [e[1] for e in got] == [vocab - 1, 7]
        assert got[0][0] == pytest.approx(logp[pos - 1, vocab - 1].item(), abs=1e-4)
    assert f"token_ids_logprob contains out-of-vocabulary token id {vocab}; valid range is [0, {vocab})." in \
        rejected(url, {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "token_ids_logprob": [vocab]})
