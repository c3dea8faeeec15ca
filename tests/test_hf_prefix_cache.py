"""The hf_engine's prefix cache: reused KV gives the numbers a fresh prefill gives, and is never stale."""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch
from transformers import AutoModelForCausalLM

from slime.backends.hf_engine.prefix_cache import MIN_REUSE_TOKENS, PrefixCache, common_prefix_len
from slime.utils.tiny_models import build_tokenizer, save_tiny_checkpoint

from _engine_helpers import gen, gen_many, start_hf_engine, token_logprobs, values

TOL = 1e-4


# ---------------------------------------------------------------------------- the cache alone
def _kv(n, fill=0.0):
    return [(torch.full((2, n, 4), fill), torch.full((2, n, 4), fill))]


def test_lookup_finds_longest_common_prefix_within_limit():
    cache = PrefixCache(max_bytes=1 << 20)
    a, b = list(range(100, 130)), list(range(100, 120)) + [7] * 10
    cache.insert(a, _kv(len(a), 1.0))
    cache.insert(b, _kv(len(b), 2.0))
    n, entry = cache.lookup(list(range(100, 125)) + [9], limit=25)
    assert n == 25 and entry.layers[0][0][0, 0, 0] == 1.0  # a shares 25 tokens, b only 20
    n, _ = cache.lookup(list(range(100, 125)) + [9], limit=12)
    assert n == 12  # input log-probs from token 12 on: the rest must be fed
    assert cache.lookup([5] * 30, limit=29) == (0, None)
    assert cache.lookup(a[:MIN_REUSE_TOKENS - 1] + [1] * 5, limit=10) == (0, None)  # too short to pay off
    assert cache.hits == 2 and cache.reused_tokens == 37


def test_insert_replaces_prefixes_and_evicts_least_recently_used():
    one = _kv(10)[0][0].numel() * 4 * 2  # bytes of a 10-token entry
    cache = PrefixCache(max_bytes=3 * one)
    cache.insert(list(range(10)), _kv(10))
    cache.insert(list(range(20)), _kv(20))  # extends the first: the first is dropped
    assert len(cache) == 1 and cache.nbytes == 2 * one
    cache.insert(list(range(50, 60)), _kv(10))
    cache.lookup(list(range(20)) + [1], limit=20)  # touch the long entry
    cache.insert(list(range(70, 80)), _kv(10))  # over budget: the untouched 50.. entry goes
    assert cache.lookup(list(range(50, 60)) + [1], limit=10) == (0, None)
    assert cache.lookup(list(range(20)) + [1], limit=20)[0] == 20
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0
    assert common_prefix_len(torch.arange(5).numpy(), torch.arange(3).numpy()) == 3


def test_disabled_cache_stores_nothing():
    cache = PrefixCache(0)
    cache.insert(list(range(20)), _kv(20))
    assert not cache.enabled and len(cache) == 0


# ---------------------------------------------------------------------------- in the engine
@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefix_cache")
    a, b = save_tiny_checkpoint(root / "a", seed=0), save_tiny_checkpoint(root / "b", seed=1)
    cached, _ = start_hf_engine(a, prefix_cache_bytes=64 << 20)
    plain, _ = start_hf_engine(a)
    yield {"cached": cached.url, "plain": plain.url, "a": a, "b": b,
           "model_a": AutoModelForCausalLM.from_pretrained(a).eval(),
           "model_b": AutoModelForCausalLM.from_pretrained(b).eval()}
    cached.stop()
    plain.stop()


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def info(url):
    with urllib.request.urlopen(f"{url}/get_server_info", timeout=30) as reply:
        return json.loads(reply.read())["prefix_cache"]


def episode(url, tok, seed, turns=3, observation="obs: fine\n"):
    """An agent-like exchange: each turn sends the whole history; returns the turns' replies."""
    ids = tok(f"<|im_start|>user\ntask {seed}: walk<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    replies = []
    for _ in range(turns):
        out = gen(url, {"input_ids": ids, "return_logprob": True,
                        "sampling_params": {"max_new_tokens": 5, "temperature": 1.0, "seed": seed}})
        replies.append((list(ids), out))
        ids = ids + out["output_ids"] + tok(observation)["input_ids"]
    return replies


def test_multi_turn_reuses_history_and_matches_a_fresh_prefill(setup, tok):
    before = info(setup["cached"])
    cached, plain = episode(setup["cached"], tok, seed=1), episode(setup["plain"], tok, seed=1)
    after = info(setup["cached"])
    for (ids, got), (_, want) in zip(cached, plain):
        assert got["output_ids"] == want["output_ids"]
        ref = token_logprobs(setup["model_a"], ids + got["output_ids"])[len(ids) - 1:]
        assert (values(got["meta_info"]["output_token_logprobs"]) - ref).abs().max() <= TOL
    # Turns 2 and 3 found the previous turn's input and output in the cache.
    assert after["hits"] - before["hits"] >= 2
    assert after["reused_tokens"] - before["reused_tokens"] >= len(cached[1][0]) - 10


def test_samples_of_one_prompt_share_it_under_concurrency(setup, tok):
    prompt = tok("<|im_start|>user\nthe same long prompt for every sample<|im_end|>\n")["input_ids"]
    gen(setup["cached"], {"input_ids": prompt + [5], "sampling_params": {"max_new_tokens": 2, "seed": 0}})
    payloads = [{"input_ids": prompt + [5 + i % 3] * (1 + i % 4), "return_logprob": True,
                 "sampling_params": {"max_new_tokens": 4 + i % 3, "temperature": 0.8, "seed": i}} for i in range(8)]
    for p, got, want in zip(payloads, gen_many(setup["cached"], payloads), gen_many(setup["plain"], payloads)):
        assert got["output_ids"] == want["output_ids"]
        ids = p["input_ids"]
        ref = token_logprobs(setup["model_a"], ids + got["output_ids"], 0.8)[len(ids) - 1:]
        assert (values(got["meta_info"]["output_token_logprobs"]) - ref).abs().max() <= TOL


def test_input_logprobs_inside_a_cached_prefix_are_computed(setup, tok):
    replies = episode(setup["cached"], tok, seed=2, turns=2)
    ids = replies[1][0]  # its first turn is cached
    out = gen(setup["cached"], {"input_ids": ids, "return_logprob": True, "logprob_start_len": 0,
                                "sampling_params": {"max_new_tokens": 1}})
    entries = out["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in entries] == ids
    assert (values(entries[1:]) - token_logprobs(setup["model_a"], ids)).abs().max() <= TOL


def test_weight_update_and_flush_empty_the_cache(setup, tok):
    url = setup["cached"]
    episode(url, tok, seed=3, turns=2)
    assert info(url)["entries"] > 0
    urllib.request.urlopen(urllib.request.Request(f"{url}/flush_cache", method="POST"), timeout=30).read()
    assert info(url)["entries"] == 0
    history = episode(url, tok, seed=4, turns=2)[1][0]  # cached under model a
    body = json.dumps({"model_path": str(setup["b"])}).encode()
    request = urllib.request.Request(f"{url}/update_weights_from_disk", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        assert json.loads(urllib.request.urlopen(request, timeout=60).read())["success"]
        assert info(url)["entries"] == 0
        out = gen(url, {"input_ids": history, "return_logprob": True,
                        "sampling_params": {"max_new_tokens": 4, "temperature": 1.0, "seed": 9}})
        ref = token_logprobs(setup["model_b"], history + out["output_ids"])[len(history) - 1:]
        assert (values(out["meta_info"]["output_token_logprobs"]) - ref).abs().max() <= TOL
    finally:
        request.data = json.dumps({"model_path": str(setup["a"])}).encode()
        urllib.request.urlopen(request, timeout=60).read()
