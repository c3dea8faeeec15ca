"""``top_logprobs_num`` in the hf_engine, against a direct ``log_softmax`` + ``topk`` on the same tiny model.

SGLang 0.5.23's reply: with ``return_logprob`` and k > 0, ``meta_info`` has ``input_top_logprobs`` (one
entry per position of ``input_ids[logprob_start_len:]``, the first null) and ``output_top_logprobs`` (one
entry per output token), each entry k ``[logprob, token_id, text_or_null]`` in descending order.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch
from transformers import AutoModelForCausalLM

from slime.backends.hf_engine.protocol import GenerateRequest, parse_sampling_params
from slime.backends.hf_engine.response import GenerateResult, build_response, finish_length
from slime.utils import http_utils
from slime.utils.tiny_models import build_tokenizer, save_tiny_checkpoint

from _engine_helpers import gen, gen_many, start_hf_engine

TOL = 1e-5


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("hf_engine_top") / "m", seed=0)


@pytest.fixture(scope="module")
def engine(ckpt):
    # With the prefix cache on, so that the cache's limit is exercised by the requests below too.
    server, _ = start_hf_engine(ckpt, max_batch_size=16, prefix_cache_bytes=64 << 20)
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def model(ckpt):
    return AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@torch.no_grad()
def ref_top(model, ids, k, temperature=1.0):
    """Per position j of ``ids``: the top-k (log-probs, token ids) of the next token, from one forward."""
    logp = torch.log_softmax(model(torch.tensor([ids])).logits[0] / temperature, dim=-1)
    return logp.topk(k, dim=-1)


@torch.no_grad()
def greedy(model, ids, n):
    ids = list(ids)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[-n:]


def check_entries(entries, ref_values, ref_ids, k):
    """Entries (one per position) against reference rows [positions, >= k]."""
    assert len(entries) == ref_values.shape[0]
    for entry, want_v, want_i in zip(entries, ref_values, ref_ids):
        assert len(entry) == k and all(len(e) == 3 for e in entry)
        got_v = torch.tensor([e[0] for e in entry], dtype=torch.float32)
        assert [e[1] for e in entry] == want_i[:k].tolist()
        assert (got_v - want_v[:k]).abs().max() <= TOL
        assert all(a >= b for a, b in zip(got_v, got_v[1:]))  # descending


def check_top1_matches_chosen(token_entries, top_entries):
    """Where the scored token is among the top-k, its value there is the one input/output_token_logprobs
    holds (both come from the same log-probs); returns how often it was the argmax."""
    hits = 0
    for (value, token, _), top in zip(token_entries, top_entries):
        if top is None:
            assert value is None
            continue
        for v, t, _ in top:
            if t == token:
                assert v == value
        hits += top[0][1] == token
    return hits


# ---------------------------------------------------------------------------- score-only (the OPD teacher)
def test_score_only_matches_direct_topk(engine, model, tok):
    prompts = [tok("a short one")["input_ids"], tok("q: abcabcabc and a longer prompt")["input_ids"]]
    # Greedy continuations: at those positions the scored token is the argmax, so top-1 is its log-prob.
    seqs = [p + greedy(model, p, 6) for p in prompts]
    reply = gen(engine, {"input_ids": seqs, "sampling_params": {"max_new_tokens": 0, "temperature": 0.7},
                         "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 5})
    for ids, prompt, out in zip(seqs, prompts, reply):
        meta = out["meta_info"]
        top, tokens = meta["input_top_logprobs"], meta["input_token_logprobs"]
        assert len(top) == len(tokens) == len(ids) and top[0] is None
        assert meta["output_top_logprobs"] == [] and meta["output_token_logprobs"] == []
        # Input log-probs are at temperature 1 whatever the request says, as input_token_logprobs are.
        values, indices = ref_top(model, ids, 5)
        check_entries(top[1:], values[:-1], indices[:-1], 5)
        assert all(e[2] is None for entry in top[1:] for e in entry)  # no return_text_in_logprobs
        hits = check_top1_matches_chosen(tokens, top)
        assert hits >= 6
        for j in range(len(prompt), len(ids)):
            assert top[j][0][1] == ids[j] and top[j][0][0] == tokens[j][0]


def test_reply_shape_is_sglangs():
    """The exact JSON: entries are [logprob, token_id, text]; input list starts with null."""
    tok = build_tokenizer()
    ids = tok("abc")["input_ids"]
    req = GenerateRequest(rid="r", input_ids=ids, sampling=parse_sampling_params({"max_new_tokens": 1}),
                          return_logprob=True, logprob_start_len=1, return_text_in_logprobs=True,
                          top_logprobs_num=2)
    result = GenerateResult(output_ids=[ids[0]], output_logprobs=[-0.5], input_logprobs=[-1.0],
                            input_top_logprobs=[([-0.25, -1.0], [ids[0], ids[2]])],
                            output_top_logprobs=[([-0.5, -2.0], [ids[0], ids[1]])],
                            finish_reason=finish_length(1))
    meta = json.loads(json.dumps(build_response(req, result, tok)))["meta_info"]
    a, b, c = (tok.decode([t]) for t in ids)
    assert meta["input_token_logprobs"] == [[None, ids[1], b], [-1.0, ids[2], c]]
    assert meta["input_top_logprobs"] == [None, [[-0.25, ids[0], a], [-1.0, ids[2], c]]]
    assert meta["output_top_logprobs"] == [[[-0.5, ids[0], a], [-2.0, ids[1], b]]]
    # k = 0, or no return_logprob: no top-k keys at all, as in SGLang.
    for k, want_lp in ((0, True), (2, False)):
        req.top_logprobs_num, req.return_logprob = k, want_lp
        assert not {"input_top_logprobs", "output_top_logprobs"} & set(build_response(req, result, tok)["meta_info"])


def test_batch_with_per_item_k_and_start(engine, model, tok):
    seqs = [tok(f"item {i}: " + "xyz" * (i + 1))["input_ids"] for i in range(4)]
    ks, starts = [0, 1, 3, 7], [0, 2, 4, -1]
    reply = gen(engine, {"input_ids": seqs, "sampling_params": {"max_new_tokens": 0},
                         "return_logprob": True, "logprob_start_len": starts, "top_logprobs_num": ks})
    for ids, k, start, out in zip(seqs, ks, starts, reply):
        meta = out["meta_info"]
        if k == 0:
            assert "input_top_logprobs" not in meta and "output_top_logprobs" not in meta
            continue
        start = len(ids) - 1 if start == -1 else start
        top = meta["input_top_logprobs"]
        # Aligned with input_token_logprobs: positions start .. end, the first null.
        assert len(top) == len(meta["input_token_logprobs"]) == len(ids) - start and top[0] is None
        values, indices = ref_top(model, ids, k)
        check_entries(top[1:], values[start:-1], indices[start:-1], k)
        check_top1_matches_chosen(meta["input_token_logprobs"], top)


# ---------------------------------------------------------------------------- generation
@pytest.mark.parametrize("temperature", [0.7, 0.0])
def test_generation_output_top_logprobs(engine, model, tok, temperature):
    ids = tok("generate from here, please")["input_ids"]
    out = gen(engine, {"input_ids": ids, "return_logprob": True, "logprob_start_len": 3, "top_logprobs_num": 4,
                       "return_text_in_logprobs": True,
                       "sampling_params": {"max_new_tokens": 6, "temperature": temperature, "seed": 11,
                                           "ignore_eos": True}})
    meta, out_ids = out["meta_info"], out["output_ids"]
    assert len(meta["output_top_logprobs"]) == len(meta["output_token_logprobs"]) == len(out_ids) == 6
    # Output top-k at the request's temperature (temperature 1 when greedy), like output_token_logprobs.
    values, indices = ref_top(model, ids + out_ids, 4, temperature or 1.0)
    check_entries(meta["output_top_logprobs"], values[len(ids) - 1:-1], indices[len(ids) - 1:-1], 4)
    hits = check_top1_matches_chosen(meta["output_token_logprobs"], meta["output_top_logprobs"])
    if temperature == 0.0:
        assert hits == 6
    # Input top-k at temperature 1, from logprob_start_len on.
    values, indices = ref_top(model, ids, 4)
    assert meta["input_top_logprobs"][0] is None and len(meta["input_top_logprobs"]) == len(ids) - 3
    check_entries(meta["input_top_logprobs"][1:], values[3:-1], indices[3:-1], 4)
    for entry in meta["input_top_logprobs"][1:] + meta["output_top_logprobs"]:
        assert all(text == tok.decode([t]) for _, t, text in entry)


def test_mixed_concurrent_rows(engine, model, tok):
    """Rows with and without top-k (and different k) decoded together each get their own."""
    prompts = [tok(f"row {i} " + "pq" * i)["input_ids"] for i in range(6)]
    payloads = [{"input_ids": p, "return_logprob": i % 3 != 2, "top_logprobs_num": i % 3 + i // 3,
                 "sampling_params": {"max_new_tokens": 3 + i, "temperature": 1.0, "seed": i, "ignore_eos": True}}
                for i, p in enumerate(prompts)]
    for p, out in zip(payloads, gen_many(engine, payloads)):
        meta, k = out["meta_info"], p["top_logprobs_num"] if p["return_logprob"] else 0
        if k == 0:
            assert "output_top_logprobs" not in meta
            continue
        ids = p["input_ids"]
        values, indices = ref_top(model, ids + out["output_ids"], k)
        check_entries(meta["output_top_logprobs"], values[len(ids) - 1:-1], indices[len(ids) - 1:-1], k)
        assert meta["input_top_logprobs"] == [None]  # default logprob_start_len: the last prompt token


def test_cached_prefix_never_drops_asked_positions(engine, model, tok):
    def cache_stats():
        with urllib.request.urlopen(f"{engine}/get_server_info", timeout=30) as reply:
            return json.loads(reply.read())["prefix_cache"]

    first = tok("a prompt long enough to be cached by the engine")["input_ids"]
    out = gen(engine, {"input_ids": first, "sampling_params": {"max_new_tokens": 4, "seed": 1}})
    ids = first + out["output_ids"] + tok(" and then more")["input_ids"]
    before = cache_stats()
    reply = gen(engine, {"input_ids": ids, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 3,
                         "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    top = reply["meta_info"]["input_top_logprobs"]
    assert len(top) == len(ids) and top[0] is None
    values, indices = ref_top(model, ids, 3)
    check_entries(top[1:], values[:-1], indices[:-1], 3)
    # Top-k only from the last prompt token on: the cached history is reused.
    middle = gen(engine, {"input_ids": ids, "return_logprob": True, "top_logprobs_num": 3,
                          "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    after = cache_stats()
    assert middle["meta_info"]["input_top_logprobs"] == [None]
    assert after["hits"] > before["hits"]
    assert middle["output_ids"] == reply["output_ids"]
    assert (torch.tensor([e[0] for e in middle["meta_info"]["output_top_logprobs"][0]])
            - values[-1]).abs().max() <= TOL


# ---------------------------------------------------------------------------- validation
@pytest.mark.parametrize("extra, field", [
    ({"top_logprobs_num": -1}, "top_logprobs_num"),
    ({"top_logprobs_num": "3"}, "top_logprobs_num"),
    ({"top_logprobs_num": 2.5}, "top_logprobs_num"),
    ({"top_logprobs_num": True}, "top_logprobs_num"),
    ({"top_logprobs_num": [2]}, "top_logprobs_num"),  # a list only for a batch
    ({"top_logprobs_num": 101}, "vocabulary"),  # the tiny model has 100 tokens
    ({"input_ids": [[5, 6], [7, 8]], "top_logprobs_num": [1, 2, 3]}, "top_logprobs_num"),
    ({"input_ids": [[5, 6], [7, 8]], "top_logprobs_num": [1, -2]}, "top_logprobs_num[1]"),
])
def test_bad_k_is_400(engine, extra, field):
    body = {"input_ids": [5, 6, 7], "return_logprob": True, "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 1}, **extra}
    with pytest.raises(http_utils.HTTPRequestError) as err:
        gen(engine, body)
    assert err.value.status == 400 and field in str(err.value)


def test_null_and_whole_vocabulary_k_accepted(engine):
    body = {"input_ids": [5, 6, 7], "return_logprob": True, "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 0}}
    assert "input_top_logprobs" not in gen(engine, {**body, "top_logprobs_num": None})["meta_info"]
    top = gen(engine, {**body, "top_logprobs_num": 100})["meta_info"]["input_top_logprobs"]
    assert len(top) == 3 and all(sorted(e[1] for e in entry) == list(range(100)) for entry in top[1:])
