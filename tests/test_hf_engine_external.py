"""hf_engine as slime's external SGLang engine: the endpoints slime's disk weight sync and engine discovery call.

slime (``SGLangEngine`` for ``--rollout-external-engine-addrs``, ``RayTrainGroup._reload_rollout_weights_from_disk``
for ``--update-weight-transport disk``) asks an engine for ``/server_info``, then per weight update
``POST /pause_generation {}``, ``GET /flush_cache``, ``POST /update_weights_from_disk {model_path, weight_version}``,
``POST /continue_generation {}``, and under ``--ci-test`` ``GET /get_weight_version``. sglang-router, which slime
starts in front of external engines, forwards ``/generate`` with fields of its own.
"""

from __future__ import annotations

import asyncio
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from slime.utils import http_utils
from slime.utils.tiny_models import build_tokenizer, save_tiny_checkpoint

from _engine_helpers import gen, run, start_hf_engine, token_logprobs, values

TOL = 1e-4


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_engine_external")
    a, b = save_tiny_checkpoint(root / "a", seed=0), save_tiny_checkpoint(root / "b", seed=1)
    # What SGLang reads on a disk update is the weights alone: a folder with only the safetensors.
    weights_only = root / "b_weights_only"
    weights_only.mkdir()
    for f in b.glob("*.safetensors"):
        shutil.copy(f, weights_only / f.name)
    wider = save_tiny_checkpoint(root / "wider", seed=0, hidden_size=96)
    return {"a": a, "b": b, "weights_only": weights_only, "wider": wider}


@pytest.fixture(scope="module")
def engine(ckpts):
    server, _ = start_hf_engine(ckpts["a"])
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def models(ckpts):
    return {k: AutoModelForCausalLM.from_pretrained(ckpts[k], dtype=torch.float32).eval() for k in ("a", "b")}


@pytest.fixture(scope="module")
def ids():
    return build_tokenizer()("the quick brown fox")["input_ids"]


def post(url, payload):
    return http_utils.post(url, payload, max_retries=1, timeout=120)


def long_request(ids, n=400):
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "ignore_eos": True, "temperature": 0}}


def score(engine, ids):
    out = gen(engine, {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
                       "logprob_start_len": 0})
    return values(out["meta_info"]["input_token_logprobs"][1:]), out["meta_info"]["weight_version"]


async def running_rows(engine):
    loads = await http_utils.get(f"{engine}/v1/loads", max_retries=1)
    return loads["loads"][0]["num_running_reqs"]


async def until_running(engine):
    for _ in range(500):
        if await running_rows(engine):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the request never started decoding")


def test_server_info_passes_slimes_external_engine_check(engine):
    info = run(http_utils.get(f"{engine}/server_info", max_retries=1))
    # SGLangEngine._init_external compares these with what it would launch (enable_memory_saver is
    # --offload-rollout, False unless offloading); discovery reads the parallel sizes and the worker type.
    assert info["enable_memory_saver"] is False
    assert (info["tp_size"], info["pp_size"], info["dp_size"]) == (1, 1, 1)
    assert info["disaggregation_mode"] not in ("prefill", "decode")
    assert info["weight_version"] == "default"


def test_slimes_disk_weight_sync_sequence(engine, ckpts, models, ids):
    """pause -> flush_cache (GET) -> update_weights_from_disk -> continue, as slime sends them."""
    before, version = score(engine, ids)
    assert version == "default" and (before - token_logprobs(models["a"], ids)).abs().max() <= TOL

    async def sync(path, version):
        await post(f"{engine}/pause_generation", {})
        await http_utils.get(f"{engine}/flush_cache", max_retries=1)
        reply = await post(f"{engine}/update_weights_from_disk", {"model_path": str(path), "weight_version": version})
        await post(f"{engine}/continue_generation", {})
        got = await http_utils.get(f"{engine}/get_weight_version", max_retries=1)
        also = await http_utils.get(f"{engine}/weight_version", max_retries=1)
        info = await http_utils.get(f"{engine}/model_info", max_retries=1)
        return reply, got, also, info

    try:
        reply, got, also, info = run(sync(ckpts["weights_only"], "1"))
        assert reply == {"success": True, "num_paused_requests": 0,
                         "message": "Succeeded to update model weights. Weight version updated to 1."}
        assert got == also == {"weight_version": "1"} and info["weight_version"] == "1"
        after, version = score(engine, ids)
        assert version == "1"  # every reply carries the version that answered it
        assert (after - token_logprobs(models["b"], ids)).abs().max() <= TOL
        assert (after - before).abs().max() > 1e-2
    finally:
        run(sync(ckpts["a"], "default"))
    assert (score(engine, ids)[0] - before).abs().max() <= TOL


def test_failed_update_keeps_weights_and_version(engine, ckpts, ids):
    before, _ = score(engine, ids)
    with pytest.raises(http_utils.HTTPRequestError, match="weights do not match|shape"):
        run(post(f"{engine}/update_weights_from_disk", {"model_path": str(ckpts["wider"]), "weight_version": "9"}))
    with pytest.raises(http_utils.HTTPRequestError, match="load_format"):
        run(post(f"{engine}/update_weights_from_disk", {"model_path": str(ckpts["b"]), "load_format": "gguf"}))
    after, version = score(engine, ids)
    assert version == "default" and torch.equal(after, before)


def test_pause_abort_mode_aborts_running_and_holds_new_requests(engine, ids):
    async def scenario():
        running = asyncio.ensure_future(post(f"{engine}/generate", long_request(ids, 3000)))
        await until_running(engine)
        await post(f"{engine}/pause_generation", {})
        aborted = await asyncio.wait_for(running, 30)
        assert await running_rows(engine) == 0
        late = asyncio.ensure_future(post(f"{engine}/generate", long_request(ids, 3)))
        await asyncio.sleep(0.5)
        held = not late.done()
        await post(f"{engine}/continue_generation", {})
        return aborted, held, await asyncio.wait_for(late, 30)

    aborted, held, late = run(scenario())
    assert aborted["meta_info"]["finish_reason"]["type"] == "abort" and len(aborted["output_ids"]) < 3000
    assert held, "a /generate sent while paused was answered before /continue_generation"
    assert late["meta_info"]["finish_reason"]["type"] == "length" and len(late["output_ids"]) == 3


def test_pause_in_place_keeps_running_requests_and_updates_at_once(engine, ckpts, ids):
    async def scenario():
        running = asyncio.ensure_future(post(f"{engine}/generate", long_request(ids)))
        await until_running(engine)
        await post(f"{engine}/pause_generation", {"mode": "in_place"})
        # SGLang updates a paused engine without waiting for its requests: the row is still there.
        reply = await post(f"{engine}/update_weights_from_disk", {"model_path": str(ckpts["a"])})
        still_running = not running.done() and await running_rows(engine) == 1
        await post(f"{engine}/continue_generation", {})
        return reply, still_running, await asyncio.wait_for(running, 120)

    reply, still_running, out = run(scenario())
    assert reply["success"] is True and still_running
    assert out["meta_info"]["finish_reason"]["type"] == "length" and len(out["output_ids"]) == 400


def test_pause_refuses_unknown_modes(engine):
    with pytest.raises(http_utils.HTTPRequestError, match="mode"):
        run(post(f"{engine}/pause_generation", {"mode": "retract"}))
    assert gen(engine, long_request([5, 6], 2))["meta_info"]["finish_reason"]["type"] == "length"


def test_update_weight_version_relabels_only(engine, ids):
    before, _ = score(engine, ids)
    try:
        reply = run(post(f"{engine}/update_weight_version", {"new_version": "v7"}))
        assert reply["success"] is True and reply["new_version"] == "v7"
        after, version = score(engine, ids)
        assert version == "v7" and torch.equal(after, before)
    finally:
        run(post(f"{engine}/update_weight_version", {"new_version": "default"}))


def test_generate_takes_the_fields_sglang_router_adds(engine, ids):
    # The body sglang-router 0.3.2 forwards for slime's {"input_ids", "sampling_params", "return_logprob"}.
    routed = {"model": None, "input_ids": ids, "sampling_params": {"temperature": 1.0, "max_new_tokens": 4},
              "return_logprob": True, "return_text_in_logprobs": False, "stream": False, "log_metrics": True,
              "return_hidden_states": False, "background": False, "no_logs": False, "return_bytes": False,
              "return_entropy": False}
    out = gen(engine, routed)
    assert len(out["meta_info"]["output_token_logprobs"]) == 4
    for key in ("return_hidden_states", "return_entropy", "return_routed_experts"):
        with pytest.raises(http_utils.HTTPRequestError, match=key):
            gen(engine, {**routed, key: True})
    with pytest.raises(http_utils.HTTPRequestError, match="log_metrics"):
        gen(engine, {**routed, "log_metrics": "yes"})
