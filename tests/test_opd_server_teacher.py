"""Server-teacher OPD: slime's payload through reward_func / post_process_rewards against the hf_engine."""

from __future__ import annotations

import asyncio
from argparse import Namespace

import pytest
import torch
from aiohttp import web
from transformers import AutoModelForCausalLM

from slime.backends.fsdp_utils.guards import NonFiniteError
from slime.backends.sglang_utils.launcher import find_free_port
from slime.backends.teacher_vocab import check_teacher_vocab
from slime.ray.failures import describe_failure
from slime.rollout import on_policy_distillation as opd
from slime.utils import http_utils
from slime.utils.tiny_models import build_tokenizer, save_tiny_checkpoint
from slime.utils.types import Sample

from _engine_helpers import ThreadedApp, start_hf_engine


@pytest.fixture(scope="module")
def teacher_ckpt(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("teacher"), seed=7)


@pytest.fixture(scope="module")
def teacher(teacher_ckpt):
    server, _ = start_hf_engine(teacher_ckpt)
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def teacher_model(teacher_ckpt):
    return AutoModelForCausalLM.from_pretrained(teacher_ckpt, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def run(coro_fn):
    async def wrapped():
        try:
            return await asyncio.wait_for(coro_fn(), timeout=60)  # guard against a hang, not a measurement
        finally:
            await http_utils.close_session()

    return asyncio.run(wrapped())


@torch.no_grad()
def response_logprobs(model, sample):
    ids = torch.tensor([sample.tokens])
    logp = torch.log_softmax(model(ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    return logp[len(sample.tokens) - 1 - sample.response_length:]


def single_turn(tok, index, text="What is 2+2?", answer="4, surely.<|im_end|>"):
    prompt = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    s = Sample(index=index, prompt=prompt, tokens=tok(prompt)["input_ids"], metadata={"task_reward": 0.0})
    ids = tok(answer)["input_ids"]
    s.append_response_tokens(tokens=ids, log_probs=[-1.0] * len(ids), trainable=True)
    return s


def trajectory(tok, index):
    """Two student turns with an environment observation between them (masked)."""
    s = single_turn(tok, index, "Open the door.", "go north<|im_end|>")
    obs = tok("\n<|im_start|>user\nYou see a door.<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    s.append_response_tokens(tokens=obs, trainable=False)
    act = tok("open door<|im_end|>")["input_ids"]
    s.append_response_tokens(tokens=act, log_probs=[-0.5] * len(act), trainable=True)
    s.metadata["task_reward"] = 1.0
    return s


def test_teacher_log_probs_equal_a_direct_forward(teacher, teacher_model, tok):
    args = Namespace(rm_url=f"{teacher}/generate", rollout_temperature=1.0)
    samples = [single_turn(tok, 0), trajectory(tok, 1)]
    assert 0 in samples[1].loss_mask  # the trajectory really carries masked observation tokens

    async def score():
        return await asyncio.gather(*(opd.reward_func(args, s) for s in samples))

    for s, reply in zip(samples, run(score)):
        s.reward = reply
    raw, rewards = opd.post_process_rewards(args, samples)
    # Pure OPD, as upstream's hook: every reward is 0 (the raw reward keeps the task's return for logging);
    # the teacher term enters the advantages in the trainer.
    assert raw == [0.0, 1.0] and rewards == [0.0, 0.0]
    for s in samples:
        s.validate()
        assert len(s.teacher_log_probs) == s.response_length
        diff = (torch.tensor(s.teacher_log_probs) - response_logprobs(teacher_model, s)).abs().max()
        assert diff <= 1e-4


def test_list_of_samples_from_a_generate_function(teacher, teacher_model, tok):
    args = Namespace(rm_url=f"{teacher}/generate", rollout_temperature=1.0)
    group = [single_turn(tok, 2, "hi", "hello<|im_end|>"), trajectory(tok, 3)]
    replies = run(lambda: opd.reward_func(args, group))
    assert isinstance(replies, list) and len(replies) == 2 and group[0].reward is replies[0]
    raw, rewards = opd.post_process_rewards(args, [group])
    assert raw == [0.0, 1.0] and rewards == [0.0, 0.0]
    for s in group:
        assert (torch.tensor(s.teacher_log_probs) - response_logprobs(teacher_model, s)).abs().max() <= 1e-4


def test_teacher_top_k_is_asked_and_kept_per_response_position(teacher, teacher_model, tok):
    args = Namespace(rm_url=f"{teacher}/generate", rollout_temperature=1.0, opd_teacher_top_k=4)
    samples = [single_turn(tok, 4), trajectory(tok, 5)]
    assert opd.teacher_payload(args, samples[0])["top_logprobs_num"] == 4
    run(lambda: opd.reward_func(args, samples))
    opd.post_process_rewards(args, samples)
    for s in samples:
        topk = s.metadata["teacher_topk"]
        assert len(topk["ids"]) == len(topk["logprobs"]) == s.response_length
        with torch.no_grad():
            logp = torch.log_softmax(teacher_model(torch.tensor([s.tokens])).logits[0, :-1], -1)
        want_lp, want_ids = logp[len(s.tokens) - 1 - s.response_length:].topk(4, dim=-1)
        assert torch.allclose(torch.tensor(topk["logprobs"]), want_lp, atol=1e-4)
        assert topk["ids"] == want_ids.tolist()


def test_exact_slime_payload_is_sent():
    seen = []

    async def record(request):
        seen.append(await request.json())
        return web.json_response({"text": "", "output_ids": [], "meta_info": {
            "input_token_logprobs": [[None, 1, None], [-0.5, 2, None], [-0.25, 3, None]]}})

    app = web.Application()
    app.router.add_post("/generate", record)
    stub = ThreadedApp(app)
    try:
        s = Sample(index=0, tokens=[1, 2, 3], response_length=1, loss_mask=[1])
        s.reward = run(lambda: opd.reward_func(Namespace(rm_url=f"{stub.url}/generate", rollout_temperature=0.8), s))
    finally:
        stub.stop()
    # Upstream's payload since PR #2085: the teacher is asked at the rollout temperature.
    assert seen == [{"input_ids": [1, 2, 3], "return_logprob": True, "logprob_start_len": 0,
                     "sampling_params": {"temperature": 0.8, "max_new_tokens": 0, "skip_special_tokens": False}}]
    opd.post_process_rewards(None, [s])
    assert s.teacher_log_probs == [-0.25]


def test_teacher_down_or_slow_fails_clearly_after_bounded_retries(monkeypatch, tok):
    monkeypatch.setattr(opd, "TEACHER_MAX_RETRIES", 3)
    monkeypatch.setattr(http_utils, "DEFAULT_BACKOFF", 0.01)
    dead = f"http://127.0.0.1:{find_free_port()}/generate"
    with pytest.raises(RuntimeError, match="OPD teacher request") as err:
        run(lambda: opd.reward_func(Namespace(rm_url=dead, rollout_temperature=1.0), single_turn(tok, 0)))
    assert dead in str(err.value) and "3 attempt" in str(err.value)

    async def slow(request):
        await asyncio.sleep(10)
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/generate", slow)
    stub = ThreadedApp(app)
    monkeypatch.setattr(http_utils, "DEFAULT_TIMEOUT", 0.2)  # what SLIME_HTTP_TIMEOUT sets
    try:
        with pytest.raises(RuntimeError, match="no reply within 0.2s"):
            run(lambda: opd.reward_func(Namespace(rm_url=f"{stub.url}/generate", rollout_temperature=1.0),
                                        single_turn(tok, 0)))
    finally:
        stub.stop()


def test_post_process_without_teacher_reply_is_an_error(tok):
    s = single_turn(tok, 0)
    s.reward = 0.0
    with pytest.raises(ValueError, match="reward_func"):
        opd.post_process_rewards(None, [s])


def test_vocab_check(teacher, tok):
    args = Namespace(rm_url=f"{teacher}/generate")
    info = run(lambda: check_teacher_vocab(args, tok))
    assert info["vocab_size"] == len(tok)
    assert run(lambda: check_teacher_vocab(args, 100))["is_generation"]
    with pytest.raises(ValueError, match="vocabulary of 100 tokens but the student has 151669"):
        run(lambda: check_teacher_vocab(args, 151669))


def _reply(response_lps, top=None):
    """A score-only reply for a sequence whose response is the last len(response_lps) of 4 tokens."""
    lps = [None] + [-0.1] * (3 - len(response_lps)) + list(response_lps)
    meta = {"input_token_logprobs": [[lp, i, None] for i, lp in enumerate(lps)]}
    if top is not None:
        meta["input_top_logprobs"] = [None] + [[[-0.1, 0, None], [-0.2, 1, None]]] * (3 - len(top)) + top
    return {"meta_info": meta}


@pytest.mark.parametrize("bad", [float("nan"), float("-inf"), float("inf")])
def test_non_finite_teacher_log_probs_are_refused_naming_sample_and_teacher(bad):
    s = Sample(index=7, tokens=[1, 2, 3, 4], response_length=2, loss_mask=[1, 1])
    s.reward = _reply([-0.3, bad])
    args = Namespace(rm_url="http://teacher:1/generate")
    with pytest.raises(NonFiniteError, match=r"non-finite log-prob .* sample 7 at response position 1") as err:
        opd.post_process_rewards(args, [s])
    assert "http://teacher:1/generate" in str(err.value)
    assert s.teacher_log_probs is None  # nothing poisoned is left on the sample


@pytest.mark.parametrize("bad", [float("nan"), float("-inf")])
def test_non_finite_teacher_top_k_is_refused(bad):
    s = Sample(index=3, tokens=[1, 2, 3, 4], response_length=2, loss_mask=[1, 1])
    s.reward = _reply([-0.3, -0.4], top=[[[-0.3, 5, None], [-0.9, 6, None]], [[-0.4, 7, None], [bad, 8, None]]])
    args = Namespace(rm_url="http://teacher:2/generate", opd_teacher_top_k=2)
    with pytest.raises(NonFiniteError, match=r"non-finite top-k log-prob .* sample 3 at response position 1"):
        opd.post_process_rewards(args, [s])
    s.reward = _reply([-0.3, -0.4], top=[[[-0.3, 5, None], [-0.9, 6, None]], [[-0.4, 7, None], [-2.0, 8, None]]])
    opd.post_process_rewards(args, [s])  # the same reply with finite values is accepted
    assert s.metadata["teacher_topk"]["logprobs"] == [[-0.3, -0.9], [-0.4, -2.0]]


def test_a_nan_teacher_server_stops_before_anything_trains():
    async def nan_teacher(request):  # json.dumps writes NaN, as SGLang's reply would carry it
        body = await request.json()
        n = len(body["input_ids"])
        return web.json_response({"meta_info": {"input_token_logprobs": [[None, 0, None]] +
                                                [[float("nan"), 0, None]] * (n - 1)}})

    app = web.Application()
    app.router.add_post("/generate", nan_teacher)
    stub = ThreadedApp(app)
    try:
        args = Namespace(rm_url=f"{stub.url}/generate", rollout_temperature=1.0)
        s = Sample(index=11, tokens=[1, 2, 3], response_length=1, loss_mask=[1])
        s.reward = run(lambda: opd.reward_func(args, s))
    finally:
        stub.stop()
    with pytest.raises(NonFiniteError, match=f"teacher at {stub.url}/generate returned a non-finite log-prob") as err:
        opd.post_process_rewards(args, [s])
    # train.py reports it in one paragraph naming the teacher, without a traceback.
    assert f"teacher at {stub.url}/generate" in describe_failure(args, err.value)
