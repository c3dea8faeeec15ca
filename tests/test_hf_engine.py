"""The hf_engine against direct transformers computations on the same tiny checkpoint."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
import torch
from transformers import AutoModelForCausalLM

from slime.utils import http_utils
from slime.utils.tiny_models import build_tokenizer, save_tiny_checkpoint

from _engine_helpers import gen, gen_many, run, start_hf_engine, token_logprobs, values

TOL = 1e-4


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_engine")
    return save_tiny_checkpoint(root / "a", seed=0), save_tiny_checkpoint(root / "b", seed=1)


@pytest.fixture(scope="module")
def engine(ckpts):
    server, runner = start_hf_engine(ckpts[0], max_batch_size=64)
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def model(ckpts):
    return AutoModelForCausalLM.from_pretrained(ckpts[0], dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@torch.no_grad()
def greedy(model, ids, n):
    ids = list(ids)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[-n:]


def prompts(tok, n):
    return [tok(f"q{i}: " + "abcdefghij"[: 1 + i % 9] * (1 + i % 3))["input_ids"] for i in range(n)]


# ---------------------------------------------------------------------------- log-prob correctness
def test_input_logprobs_match_direct_forward(engine, model, tok):
    seqs = prompts(tok, 5)
    reply = gen(engine, {"input_ids": seqs, "sampling_params": {"max_new_tokens": 0},
                         "return_logprob": True, "logprob_start_len": 0})
    assert isinstance(reply, list) and len(reply) == len(seqs)
    for ids, out in zip(seqs, reply):
        entries = out["meta_info"]["input_token_logprobs"]
        assert entries[0][0] is None and [e[1] for e in entries] == ids
        assert (values(entries[1:]) - token_logprobs(model, ids)).abs().max() <= TOL
        assert out["output_ids"] == [] and out["meta_info"]["finish_reason"]["type"] == "length"


def test_logprob_start_len_and_generation_prefill(engine, model, tok):
    ids = prompts(tok, 3)[2]
    out = gen(engine, {"input_ids": ids, "sampling_params": {"max_new_tokens": 3, "temperature": 0},
                       "return_logprob": True, "logprob_start_len": 4})
    entries = out["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in entries] == ids[4:] and entries[0][0] is None
    assert (values(entries[1:]) - token_logprobs(model, ids)[4:]).abs().max() <= TOL


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_output_logprobs_equal_rescoring_under_concurrency(engine, model, tok, temperature):
    seqs = prompts(tok, 8)
    payloads = [{"input_ids": ids, "return_logprob": True,
                 "sampling_params": {"max_new_tokens": 6 + 3 * i, "temperature": temperature, "seed": i,
                                     "ignore_eos": True}} for i, ids in enumerate(seqs)]
    for ids, p, out in zip(seqs, payloads, gen_many(engine, payloads)):
        got = out["meta_info"]["output_token_logprobs"]
        assert [e[1] for e in got] == out["output_ids"]
        assert len(got) == p["sampling_params"]["max_new_tokens"]
        ref = token_logprobs(model, ids + out["output_ids"], temperature)[len(ids) - 1:]
        assert (values(got) - ref).abs().max() <= TOL


# ---------------------------------------------------------------------------- sampling controls
def test_tiny_temperature_is_argmax(engine, model, tok):
    ids = prompts(tok, 2)[1]
    out = gen(engine, {"input_ids": ids, "sampling_params": {"max_new_tokens": 8, "temperature": 1e-5,
                                                             "seed": 3, "ignore_eos": True}})
    assert out["output_ids"] == greedy(model, ids, 8)


def test_top_p_and_top_k_are_honoured(engine, model, tok):
    ids = prompts(tok, 3)[0]
    want = greedy(model, ids, 6)
    for seed in range(3):
        out = gen(engine, {"input_ids": ids, "sampling_params": {"max_new_tokens": 6, "top_p": 1e-3,
                                                                 "seed": seed, "ignore_eos": True}})
        assert out["output_ids"] == want  # only the most likely token survives a tiny top_p
    out = gen(engine, {"input_ids": ids, "sampling_params": {"max_new_tokens": 12, "top_k": 3, "temperature": 2.0,
                                                             "seed": 5, "ignore_eos": True}})
    full = ids + out["output_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([full])).logits[0]
    for j, token in enumerate(out["output_ids"]):
        assert token in logits[len(ids) - 1 + j].topk(3).indices.tolist()


def test_stop_strings_and_stop_ids(engine, model, tok):
    ids = prompts(tok, 4)[3]
    base = greedy(model, ids, 12)
    text = tok.decode(base)
    stop = text[4:6]
    cut = text.find(stop)
    out = gen(engine, {"input_ids": ids, "sampling_params": {"max_new_tokens": 12, "temperature": 0,
                                                             "stop": [stop], "ignore_eos": True}})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == text[:cut]
    assert out["output_ids"] == base[:cut + len(stop)]  # char-level tokenizer: one token per char
    kept = gen(engine, {"input_ids": ids, "sampling_params": {"max_new_tokens": 12, "temperature": 0,
                                                              "stop": stop, "no_stop_trim": True, "ignore_eos": True}})
    assert kept["text"] == text[:cut + len(stop)]

    pos = next(i for i in range(2, 12) if base[i] not in base[:i])
    out = gen(engine, {"input_ids": ids, "sampling_params": {"max_new_tokens": 12, "temperature": 0,
                                                             "stop_token_ids": [base[pos]], "ignore_eos": True}})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": base[pos]}
    assert out["output_ids"] == base[:pos + 1]
    assert out["text"] == tok.decode(base[:pos])


def test_same_seed_same_output_whatever_the_batch(engine, tok):
    ids = prompts(tok, 6)[5]
    payload = {"input_ids": ids, "sampling_params": {"max_new_tokens": 10, "seed": 42, "ignore_eos": True}}
    alone = gen(engine, payload)["output_ids"]
    others = [{"input_ids": p, "sampling_params": {"max_new_tokens": 7 + i, "ignore_eos": True}}
              for i, p in enumerate(prompts(tok, 6))]
    together = gen_many(engine, others[:3] + [payload] + others[3:])[3]["output_ids"]
    assert together == alone
    other_seed = gen(engine, {**payload, "sampling_params": {**payload["sampling_params"], "seed": 43}})
    assert other_seed["output_ids"] != alone


def test_64_concurrent_requests_all_correct(engine, model, tok):
    seqs = prompts(tok, 64)
    payloads = [{"input_ids": ids, "return_logprob": True, "rid": f"r{i}",
                 "sampling_params": {"max_new_tokens": 4 + i % 5, "temperature": 0 if i % 2 else 1.0,
                                     "seed": i, "ignore_eos": True}} for i, ids in enumerate(seqs)]
    replies = gen_many(engine, payloads)
    for i, (ids, out) in enumerate(zip(seqs, replies)):
        assert out["meta_info"]["id"] == f"r{i}"
        n = 4 + i % 5
        assert len(out["output_ids"]) == n and out["meta_info"]["completion_tokens"] == n
        if i % 2:
            assert out["output_ids"] == greedy(model, ids, n)
        ref = token_logprobs(model, ids + out["output_ids"])[len(ids) - 1:]
        assert (values(out["meta_info"]["output_token_logprobs"]) - ref).abs().max() <= TOL


# ---------------------------------------------------------------------------- robustness and routes
@pytest.mark.parametrize("body, field", [
    ({"input_ids": [1, 2, "x"]}, "input_ids"),
    ({"input_ids": [1, 2], "sampling_params": {"temperature": -1}}, "temperature"),
    ({"input_ids": [1, 2], "sampling_params": {"top_p": 0}}, "top_p"),
    ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": "5"}}, "max_new_tokens"),
    ({"input_ids": [1, 2], "sampling_params": {"bogus": 1}}, "bogus"),
    ({"input_ids": [1, 2], "text": "hi"}, "text or input_ids"),
    ({"input_ids": [], "sampling_params": {}}, "input_ids"),
    ({"input_ids": [1, 2], "logprob_start_len": 5, "return_logprob": True}, "logprob_start_len"),
])
def test_malformed_request_is_400_naming_the_field(engine, body, field):
    with pytest.raises(http_utils.HTTPRequestError) as err:
        gen(engine, body)
    assert err.value.status == 400 and field in str(err.value)
    assert gen(engine, {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 1}})["output_ids"]


def test_invalid_json_is_400_and_server_keeps_serving(engine):
    req = urllib.request.Request(f"{engine}/generate", data=b"{not json", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    assert err.value.code == 400 and "JSON" in err.value.read().decode()
    assert gen(engine, {"text": "ok", "sampling_params": {"max_new_tokens": 2}})["meta_info"]["prompt_tokens"] == 2


def test_info_health_flush_routes(engine, ckpts):
    info = run(http_utils.get(f"{engine}/get_model_info", max_retries=1))
    assert info["model_path"] == str(ckpts[0]) and info["is_generation"] is True and info["vocab_size"] == 100
    for route in ("/health", "/health_generate"):
        with urllib.request.urlopen(engine + route, timeout=30) as resp:
            assert resp.status == 200
    assert "flushed" in run(http_utils.post(f"{engine}/flush_cache", None, max_retries=1))


def test_abort_request_ends_a_running_generation(engine, tok):
    async def scenario():
        long = asyncio.ensure_future(http_utils.post(f"{engine}/generate", {
            "input_ids": prompts(tok, 1)[0], "rid": "to-abort",
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}, max_retries=1))
        await asyncio.sleep(0.3)
        await http_utils.post(f"{engine}/abort_request", {"rid": "to-abort"}, max_retries=1)
        return await long

    out = run(scenario())
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(out["output_ids"]) < 3000


def test_update_weights_from_disk(engine, ckpts, model, tok):
    other = AutoModelForCausalLM.from_pretrained(ckpts[1], dtype=torch.float32).eval()
    ids = prompts(tok, 3)[1]
    score = {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
             "logprob_start_len": 0}

    async def scenario():
        # Submitted before the update: must finish on the old weights.
        before = asyncio.ensure_future(http_utils.post(f"{engine}/generate", {
            "input_ids": ids, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}}, max_retries=1))
        await asyncio.sleep(0.05)
        reply = await http_utils.post(f"{engine}/update_weights_from_disk", {"model_path": str(ckpts[1])},
                                      max_retries=1)
        after = await http_utils.post(f"{engine}/generate", score, max_retries=1)
        return await before, reply, after

    try:
        before, reply, after = run(scenario())
        assert reply["success"] is True
        ref_old = token_logprobs(model, ids + before["output_ids"])[len(ids) - 1:]
        assert (values(before["meta_info"]["output_token_logprobs"]) - ref_old).abs().max() <= TOL
        new = values(after["meta_info"]["input_token_logprobs"][1:])
        assert (new - token_logprobs(other, ids)).abs().max() <= TOL
        assert (new - token_logprobs(model, ids)).abs().max() > 1e-2
        with pytest.raises(http_utils.HTTPRequestError, match="model_path"):
            run(http_utils.post(f"{engine}/update_weights_from_disk", {"model_path": "/no/such/dir"}, max_retries=1))
    finally:
        run(http_utils.post(f"{engine}/update_weights_from_disk", {"model_path": str(ckpts[0])}, max_retries=1))
    restored = gen(engine, score)
    assert (values(restored["meta_info"]["input_token_logprobs"][1:]) - token_logprobs(model, ids)).abs().max() <= TOL


def test_score_only_burst_is_grouped_by_length():
    """Waiting score-only requests are batched shortest first, so mixed lengths pad little."""
    from types import SimpleNamespace

    from slime.backends.hf_engine.model_runner import Span
    from slime.backends.hf_engine.scheduler import Scheduler

    class Runner:
        def __init__(self):
            self.groups = []

        def score(self, seqs, starts, top_ks=None):
            self.groups.append([len(s) for s in seqs])
            return [Span(torch.zeros(len(s) - 1)) for s in seqs]

    runner = Runner()
    scheduler = Scheduler(runner, max_prefill_tokens=220)
    scheduler._reply = lambda job: None
    jobs = [SimpleNamespace(req=SimpleNamespace(input_ids=[3] * n, logprob_start_len=0, return_logprob=True,
                                                top_k_logprobs=0),
                            result=SimpleNamespace()) for n in (5, 100, 6, 101)]
    scheduler._waiting.extend(jobs)
    scheduler._run_scoring(list(jobs))
    # Arrival order would have padded 5 and 6 up to 100 and 101.
    assert runner.groups == [[5, 6], [100, 101]]
    assert not scheduler._waiting


def test_cli_threads_default_to_one_unless_told(monkeypatch):
    from slime.backends.hf_engine.__main__ import parse_args

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert parse_args(["--model-path", "m"]).threads == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert parse_args(["--model-path", "m"]).threads == 3
    assert parse_args(["--model-path", "m", "--threads", "0"]).threads == 0  # 0: torch's own default
