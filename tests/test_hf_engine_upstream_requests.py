"""The requests upstream slime (THUDM/slime) sends to its engines by default, against the hf_engine.

Each payload is built here from the field list of upstream's request builders (rollout
``GenerateState.sampling_params``, the eval additions, the OPD teacher's ``reward_func``, the abort path
``/workers`` -> ``/abort_request`` -> ``/v1/loads``), with this test's own values.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from slime.backends.hf_engine.protocol import GenerateRequest, ProtocolError, parse_sampling_params
from slime.backends.hf_engine.response import GenerateResult, build_response, finish_length
from slime.utils import http_utils
from slime.utils.tiny_models import IM_END, IM_START, build_tokenizer, save_tiny_checkpoint

from _engine_helpers import ThreadedApp, gen, run, start_hf_engine, token_logprobs, values

TOL = 1e-4


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("hf_engine_upstream") / "m", seed=0)


@pytest.fixture(scope="module")
def engine(ckpt):
    server, _ = start_hf_engine(ckpt, max_batch_size=16)
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def model(ckpt):
    return AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def get(url):
    return run(http_utils.get(url, max_retries=1, timeout=60))


def post(url, payload):
    return run(http_utils.post(url, payload, max_retries=1, timeout=60))


def rejected(url, payload) -> str:
    """The 400 message for ``payload`` (fails if the engine accepts it)."""
    with pytest.raises(http_utils.HTTPRequestError) as err:
        post(url, payload)
    assert err.value.status == 400
    return str(err.value)


def train_payload(prompt_ids, *, temperature=0.8, top_p=1.0, max_new_tokens=6, seed=None):
    """Upstream's default rollout request: its GenerateState.sampling_params, custom_params when
    top_p != 1, sampling_seed under deterministic inference, and return_logprob."""
    params = {"temperature": temperature, "top_p": top_p, "top_k": -1, "max_new_tokens": max_new_tokens,
              "stop": None, "stop_token_ids": None, "skip_special_tokens": False, "no_stop_trim": True,
              "spaces_between_special_tokens": False}
    if top_p != 1.0:
        params["custom_params"] = {"return_top_p_token_ids": True}
    if seed is not None:
        params["sampling_seed"] = seed
    return {"sampling_params": params, "return_logprob": True, "input_ids": list(prompt_ids)}


def teacher_payload(ids, temperature):
    """Upstream's OPD teacher request (``on_policy_distillation.reward_func``)."""
    return {"input_ids": list(ids),
            "sampling_params": {"temperature": temperature, "max_new_tokens": 0, "skip_special_tokens": False},
            "return_logprob": True, "logprob_start_len": 0}


def requests_in(load_reply) -> int:
    """Running + waiting requests as a /v1/loads reader counts them: per rank under ``loads``."""
    return sum(entry["num_running_reqs"] + entry["num_waiting_reqs"] for entry in load_reply["loads"])


# ---------------------------------------------------------------------------- /generate
@pytest.mark.parametrize("top_p, seed", [(1.0, None), (0.9, 1234)])
def test_upstream_default_train_payload(engine, model, tok, top_p, seed):
    ids = tok(f"{IM_START}user\nsay something{IM_END}\n{IM_START}assistant\n")["input_ids"]
    out = gen(engine, train_payload(ids, top_p=top_p, seed=seed))
    meta = out["meta_info"]
    n = len(out["output_ids"])
    assert 1 <= n <= 6 and meta["completion_tokens"] == n and meta["prompt_tokens"] == len(ids)
    assert meta["finish_reason"]["type"] in ("stop", "length")
    # What upstream reads back: token ids and log-probs from output_token_logprobs, the text as is.
    entries = meta["output_token_logprobs"]
    assert [e[1] for e in entries] == out["output_ids"] and all(isinstance(e[0], float) for e in entries)
    assert out["text"] == tok.decode(out["output_ids"], skip_special_tokens=False)  # no_stop_trim, no skip
    # Stock SGLang 0.5.23 does not know return_top_p_token_ids: no top-p replay data, as there.
    assert not any(key.startswith("top_p") for key in meta)
    if top_p == 1.0:
        ref = token_logprobs(model, ids + out["output_ids"], 0.8)[len(ids) - 1:]
        assert (values(entries) - ref).abs().max() <= TOL


def test_same_sampling_seed_same_tokens(engine, tok):
    ids = tok("seeded prompt")["input_ids"]
    first, second = (gen(engine, train_payload(ids, top_p=0.95, max_new_tokens=8, seed=7)) for _ in range(2))
    assert first["output_ids"] == second["output_ids"]


def test_upstream_eval_additions(engine, tok):
    ids = tok("eval prompt")["input_ids"]
    payload = train_payload(ids)
    # Upstream's eval adds these only when configured; hf_engine takes their neutral values only.
    payload["sampling_params"].update(repetition_penalty=1.0, min_new_tokens=0)
    assert gen(engine, payload)["output_ids"]
    for key, value in (("repetition_penalty", 1.1), ("min_new_tokens", 2)):
        bad = train_payload(ids)
        bad["sampling_params"][key] = value
        assert key in rejected(f"{engine}/generate", bad)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_opd_teacher_payload_scores_input_tokens(engine, model, tok, temperature):
    prompt = tok(f"{IM_START}user\nq{IM_END}\n{IM_START}assistant\n")["input_ids"]
    response = tok(f"an answer{IM_END}")["input_ids"]
    out = gen(engine, teacher_payload(prompt + response, temperature))
    entries = out["meta_info"]["input_token_logprobs"]
    assert out["output_ids"] == [] and out["meta_info"]["finish_reason"]["type"] == "length"
    assert [e[1] for e in entries] == prompt + response and entries[0][0] is None
    # Input log-probs are taken at temperature 1 whatever the request's temperature, as in SGLang.
    assert (values(entries[1:]) - token_logprobs(model, prompt + response)).abs().max() <= TOL
    # Upstream's post-processing: entries [1:], the last response_length of them.
    teacher = values(entries[1:])[-len(response):]
    assert teacher.shape[0] == len(response) and torch.isfinite(teacher).all()


# ---------------------------------------------------------------------------- spaces_between_special_tokens
def _reply_text(tokenizer, ids, spaces: bool) -> str:
    params = parse_sampling_params({"skip_special_tokens": False, "spaces_between_special_tokens": spaces,
                                    "no_stop_trim": True})
    req = GenerateRequest(rid="r", input_ids=[3], sampling=params)
    return build_response(req, GenerateResult(output_ids=list(ids), finish_reason=finish_length(len(ids))),
                          tokenizer)["text"]


def test_spaces_between_special_tokens_goes_to_the_tokenizer(tok):
    ids = tok(f"{IM_START}ab{IM_END}cd")["input_ids"]

    class Recording:
        def __init__(self):
            self.calls = []

        def decode(self, ids, **kwargs):
            self.calls.append(kwargs)
            return "x"

    recording = Recording()
    for spaces in (False, True):
        _reply_text(recording, ids, spaces)
    assert [c["spaces_between_special_tokens"] for c in recording.calls] == [False, True]
    assert all(c["skip_special_tokens"] is False for c in recording.calls)
    # transformers 5 tokenizers ignore the flag (SGLang 0.5.23 pins transformers 5): the same text.
    assert _reply_text(tok, ids, False) == _reply_text(tok, ids, True) == f"{IM_START}ab{IM_END}cd"


def test_spaces_between_special_tokens_both_values_served(engine, tok):
    ids = tok("spaces")["input_ids"]
    texts = []
    for spaces in (False, True):
        payload = train_payload(ids, max_new_tokens=5, seed=3)
        payload["sampling_params"]["spaces_between_special_tokens"] = spaces
        texts.append(gen(engine, payload)["text"])
    assert texts[0] == texts[1]
    bad = train_payload(ids)
    bad["sampling_params"]["spaces_between_special_tokens"] = "no"
    assert "spaces_between_special_tokens" in rejected(f"{engine}/generate", bad)


# ---------------------------------------------------------------------------- what is still rejected
@pytest.mark.parametrize("params, field", [
    ({"bogus_key": 1}, "bogus_key"),
    ({"custom_params": "return_top_p_token_ids"}, "custom_params"),
    ({"custom_params": {"deep": {"er": [1]}}}, "custom_params.deep"),
    ({"custom_params": {"__sglang_reasoning_end_token_ids": []}}, "__sglang_reasoning_end_token_ids"),
    ({"sampling_seed": 2**63}, "sampling_seed"),
    ({"logit_bias": {"5": 1.0}}, "logit_bias"),
    ({"min_new_tokens": False}, "min_new_tokens"),
])
def test_rejected_where_sglang_rejects(engine, params, field):
    assert field in rejected(f"{engine}/generate", {"input_ids": [5, 6], "sampling_params": params})


def test_sglang_neutral_spellings_accepted(engine):
    params = {"custom_params": {"anything": [1, "a", None], "flag": True, "nested": {"k": 1.5}},
              "logit_bias": {}, "json_schema": "", "stop_regex": [], "n": 1, "beam_width": None,
              "stream_interval": 4, "sampling_seed": -5, "max_new_tokens": 2}
    assert len(gen(engine, {"input_ids": [5, 6], "sampling_params": params})["output_ids"]) == 2
    with pytest.raises(ProtocolError, match="custom_params"):
        parse_sampling_params({"custom_params": [1]})


# ---------------------------------------------------------------------------- info and abort routes
def test_model_info_routes(engine, ckpt):
    info = get(f"{engine}/model_info")
    assert info["model_path"] == str(ckpt) and info["is_generation"] is True
    assert info["weight_version"] == "default" and info["vocab_size"] == 100
    assert get(f"{engine}/get_model_info") == info


def test_upstream_abort_path(engine, tok):
    """upstream's abort(): GET {router}/workers, then per worker POST /abort_request {"abort_all": true}
    and GET /v1/loads?include=core until it reports no requests. The engine stands in for the router."""
    long_job = {"input_ids": tok("abort me")["input_ids"], "rid": "long-one",
                "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}

    async def scenario():
        job = asyncio.ensure_future(http_utils.post(f"{engine}/generate", long_job, max_retries=1, timeout=120))
        deadline = time.monotonic() + 60
        while True:  # until the long request is decoding
            load = await http_utils.get(f"{engine}/v1/loads?include=core", max_retries=1)
            if load["loads"][0]["num_running_reqs"] == 1 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)
        running_before = requests_in(load)
        # A body with neither rid nor abort_all aborts nothing (SGLang ignores it too).
        await http_utils.post(f"{engine}/abort_request", {}, max_retries=1)
        await asyncio.sleep(0.1)
        still = requests_in(await http_utils.get(f"{engine}/v1/loads?include=core", max_retries=1))

        workers = await http_utils.get(f"{engine}/workers", max_retries=1)
        urls = [w["url"] for w in workers["workers"]]
        polls = 0
        for url in urls:
            while True:
                await http_utils.post(f"{url}/abort_request", {"abort_all": True}, max_retries=1)
                polls += 1
                if requests_in(await http_utils.get(f"{url}/v1/loads?include=core", max_retries=1)) <= 0:
                    break
                await asyncio.sleep(0.05)
                assert polls < 200, "the engine never reported idle after abort_all"
        return await job, running_before, still, workers, urls

    out, running_before, still, workers, urls = run(scenario())
    assert running_before == 1 and still == 1
    assert urls == [engine] and workers["total"] == 1 and workers["workers"][0]["is_healthy"] is True
    assert out["meta_info"]["finish_reason"]["type"] == "abort" and len(out["output_ids"]) < 3000
    idle = get(f"{engine}/v1/loads?include=core")
    assert requests_in(idle) == 0 and idle["loads"][0]["dp_rank"] == 0
    # No key that would take precedence over running + waiting for a reader of the reply.
    assert not {"num_reqs", "num_total_reqs", "total_reqs"} & set(idle["loads"][0])


def test_loads_query_checks(engine):
    assert get(f"{engine}/v1/loads")["loads"][0]["num_waiting_reqs"] == 0
    assert get(f"{engine}/v1/loads?dp_rank=3")["loads"] == []
    with pytest.raises(http_utils.HTTPRequestError, match="include"):
        get(f"{engine}/v1/loads?include=core,bogus")
    with pytest.raises(http_utils.HTTPRequestError, match="dp_rank"):
        get(f"{engine}/v1/loads?dp_rank=first")
    with pytest.raises(http_utils.HTTPRequestError, match="abort_all"):
        post(f"{engine}/abort_request", {"abort_all": "yes"})


def test_failed_forward_answers_and_leaves_no_load(tok):
    """A model error while scoring answers the request (500) and the load falls back to 0: upstream's abort
    loop polls until it does."""
    from slime.backends.hf_engine.scheduler import Scheduler
    from slime.backends.hf_engine.server import make_app

    class BrokenRunner:
        tokenizer, vocab_size, context_len, pad_id, eos_ids = tok, 100, 64, 0, {2}
        model_path = tokenizer_path = "broken"
        device = torch.device("cpu")

        def score(self, seqs, starts, top_ks=None):
            raise RuntimeError("model exploded")

    runner = BrokenRunner()
    scheduler = Scheduler(runner)
    scheduler.start()
    server = ThreadedApp(make_app(runner, scheduler))
    try:
        with pytest.raises(http_utils.HTTPRequestError, match="model exploded"):
            run(http_utils.post(f"{server.url}/generate", teacher_payload([5, 6, 7], 0.7), max_retries=1,
                                timeout=30))
        assert requests_in(get(f"{server.url}/v1/loads?include=core")) == 0
        assert scheduler.load() == (0, 0)
    finally:
        server.stop()


def test_load_counts_waiting_and_running_jobs():
    """Scheduler.load() without a model: submitted jobs wait until the worker takes them."""
    from slime.backends.hf_engine.scheduler import Scheduler

    scheduler = Scheduler(SimpleNamespace())  # worker thread never started: nothing is taken
    loop = asyncio.new_event_loop()
    try:
        params = parse_sampling_params(None)
        for i in range(3):
            scheduler.submit(GenerateRequest(rid=str(i), input_ids=[1, 2], sampling=params), loop,
                             loop.create_future())
        assert scheduler.load() == (0, 3)
    finally:
        loop.close()
