"""The aiohttp application: SGLang's HTTP routes in front of the scheduler.

Request handlers only parse, validate and wait on futures; the model runs on the scheduler's worker
thread, so health checks and aborts are answered while a batch is decoding. Errors use SGLang's shape
``{"error": {"message": ...}}``: 400 for a bad request (the message names the field), 500 otherwise.

Besides SGLang's engine routes, ``GET /workers`` is a *router* route (sglang-router / SGLang Model
Gateway), served so that one engine can act as a one-worker router: upstream slime's rollout asks its
router for ``/workers`` and then sends ``/abort_request`` and ``/v1/loads`` to every listed worker
itself, so pointing its router address at an hf_engine works. The engine lists itself, at the address
the caller reached it by.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from datetime import datetime, timezone

from aiohttp import web

from slime.backends.hf_engine.protocol import (GenerateRequest, ProtocolError, SamplingParams, max_req_input_len,
                                               parse_generate)
from slime.backends.hf_engine.response import build_response

logger = logging.getLogger(__name__)

RUNNER = web.AppKey("runner", object)
SCHEDULER = web.AppKey("scheduler", object)
# /generate requests accepted so far, by prompt (a batch of n counts n); reported by /get_server_info
# so a test can count how often a teacher was asked.
GENERATE_COUNT = web.AppKey("generate_count", list)
ENGINE_ID = web.AppKey("engine_id", str)
# Set while generation runs; cleared by /pause_generation. New /generate requests wait on it (SGLang holds
# them in its tokenizer manager the same way) and go on after /continue_generation.
UNPAUSED = web.AppKey("unpaused", asyncio.Event)
SERVER_FLAGS = web.AppKey("server_flags", dict)  # launch flags /server_info reports (dtype, random_seed)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


async def _json_body(request: web.Request):
    try:
        return await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ProtocolError(f"request body is not valid JSON: {err}") from None


async def _run(app, reqs: list[GenerateRequest]):
    loop = asyncio.get_running_loop()
    futures = []
    for req in reqs:
        fut = loop.create_future()
        app[SCHEDULER].submit(req, loop, fut)
        futures.append(fut)
    try:
        return await asyncio.gather(*futures)
    except asyncio.CancelledError:
        # The client disconnected: cancelled futures make the worker drop their rows.
        for fut in futures:
            fut.cancel()
        raise


async def generate(request: web.Request) -> web.Response:
    app, runner = request.app, request.app[RUNNER]
    try:
        body = await _json_body(request)
        reqs, batched = parse_generate(body, runner.tokenizer, runner.vocab_size, runner.context_len)
    except ProtocolError as err:
        return _error(400, str(err))
    app[GENERATE_COUNT][0] += len(reqs)
    await app[UNPAUSED].wait()
    results = await _run(app, reqs)
    out = [build_response(r, res, runner.tokenizer) for r, res in zip(reqs, results)]
    return web.json_response(out if batched else out[0])


async def health(request: web.Request) -> web.Response:
    if not request.app[SCHEDULER].alive:
        return _error(503, "engine worker thread is not running")
    return web.Response(text="")


async def health_generate(request: web.Request) -> web.Response:
    """Healthy only if one token can actually be generated (as SGLang checks)."""
    runner = request.app[RUNNER]
    probe = GenerateRequest(rid=f"health-{id(request)}", input_ids=[runner.pad_id],
                            sampling=SamplingParams(temperature=0.0, max_new_tokens=1))
    try:
        await asyncio.wait_for(_run(request.app, [probe]), timeout=60)
    except Exception as err:  # noqa: BLE001 - any failure means unhealthy
        return _error(503, f"health generation failed: {err!r}")
    return web.Response(text="")


async def model_info(request: web.Request) -> web.Response:
    """SGLang's ``/model_info`` (``/get_model_info`` is its older name for the same reply)."""
    runner = request.app[RUNNER]
    config = runner.model.config
    return web.json_response({
        "model_path": runner.model_path,
        "served_model_name": runner.model_path,  # SGLang's default when --served-model-name is unset
        "tokenizer_path": runner.tokenizer_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": request.app[SCHEDULER].weight_version,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": getattr(config, "model_type", None),
        "architectures": getattr(config, "architectures", None),
        # Not in SGLang's reply: the OPD start-up check compares the teacher's vocabulary with the student's.
        "vocab_size": len(runner.tokenizer),
        "model_vocab_size": runner.vocab_size,
    })


async def flush_cache(request: web.Request) -> web.Response:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    request.app[SCHEDULER].submit_flush_cache(loop, fut)
    await fut
    return web.Response(text="Cache flushed.")


async def get_server_info(request: web.Request) -> web.Response:
    """A subset of SGLang's reply (``/server_info``; ``/get_server_info`` is its older name), plus the prefix
    cache's counters (hits, reused tokens, memory).

    As in SGLang, ``context_length`` is the launch flag (null when the model's own length is used) and
    ``max_req_input_len`` the scheduler's prompt limit (prompts this long or longer are refused);
    ``enable_deterministic_inference`` the launch flag: with it a request's result does not depend on its
    batch (without it seeds are honoured too, but batched float rounding can tip a token)."""
    runner, scheduler = request.app[RUNNER], request.app[SCHEDULER]
    return web.json_response({"model_path": runner.model_path, "tokenizer_path": runner.tokenizer_path,
                              "context_length": getattr(runner, "context_length_arg", None),
                              "max_req_input_len": max_req_input_len(runner.context_len),
                              "enable_deterministic_inference": bool(getattr(scheduler, "deterministic", False)),
                              "tp_size": 1, "dp_size": 1, "pp_size": 1, "ep_size": 1,
                              # SGLang's server arguments slime's external-engine check compares with its
                              # own (an engine with a memory saver would have to be offloaded by slime).
                              "enable_memory_saver": False,
                              "disaggregation_mode": "null",
                              "weight_version": scheduler.weight_version,
                              **request.app[SERVER_FLAGS],
                              "max_batch_size": scheduler.max_batch_size,
                              "max_prefill_tokens": scheduler.max_prefill_tokens,
                              "disable_radix_cache": not scheduler.prefix_cache.enabled,
                              "prefix_cache": scheduler.prefix_cache.stats(),
                              "generate_requests": request.app[GENERATE_COUNT][0]})


def _weights_error(message: str) -> web.Response:
    return web.json_response({"success": False, "message": message, "num_paused_requests": 0}, status=400)


# load_format values that read what hf_engine reads (HF safetensors); SGLang's others (dummy, gguf,
# remote, ...) have no loader here.
_LOAD_FORMATS = (None, "auto", "safetensors")


async def update_weights_from_disk(request: web.Request) -> web.Response:
    """SGLang's ``/update_weights_from_disk``: ``model_path`` (an HF folder with the same architecture),
    optional ``weight_version`` (the version replies carry from then on), ``load_format``,
    ``abort_all_requests``. Requests already running finish on the old weights first, unless generation
    is paused (then the update happens at once, as in SGLang). The prefix cache is always flushed: KV of
    the old weights is wrong for the new ones, whatever ``flush_cache`` says."""
    try:
        body = await _json_body(request)
    except ProtocolError as err:
        return _weights_error(str(err))
    if not isinstance(body, dict):
        return _weights_error("request body must be a JSON object")
    path = body.get("model_path")
    if not isinstance(path, str) or not path:
        return _weights_error("model_path (a folder) is required")
    if not os.path.isdir(path):
        return _weights_error(f"model_path {path!r} is not a folder")
    version = body.get("weight_version")
    if version is not None and not isinstance(version, str):
        return _weights_error(f"weight_version must be a string, got {version!r}")
    if body.get("load_format") not in _LOAD_FORMATS:
        return _weights_error(f"load_format {body['load_format']!r} is not supported by hf_engine "
                              f"(auto or safetensors)")
    scheduler = request.app[SCHEDULER]
    if body.get("abort_all_requests"):
        scheduler.abort(None)
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    scheduler.submit_update_weights(path, loop, fut, weight_version=version)
    reply = await fut
    return web.json_response(reply, status=200 if reply["success"] else 400)


async def update_weight_version(request: web.Request) -> web.Response:
    """SGLang's ``/update_weight_version``: ``new_version`` (required), ``abort_all_requests`` (default
    true). Only the label changes, not the weights."""
    try:
        body = await _json_body(request)
    except ProtocolError as err:
        return _error(400, str(err))
    version = body.get("new_version") if isinstance(body, dict) else None
    if not isinstance(version, str):
        return _error(400, "new_version (a string) is required")
    if body.get("abort_all_requests", True):
        request.app[SCHEDULER].abort(None)
    request.app[SCHEDULER].weight_version = version
    return web.json_response({"success": True, "message": f"Weight version updated to {version}",
                              "new_version": version})


async def weight_version(request: web.Request) -> web.Response:
    """``GET /weight_version`` (and ``/get_weight_version``) of the SGLang build slime runs (its patch
    answers ``{"weight_version": ...}``; stock SGLang 0.5.23 moved the value to ``/model_info``)."""
    return web.json_response({"weight_version": request.app[SCHEDULER].weight_version})


# SGLang's pause modes; "retract" (running requests sent back to the queue and recomputed later) would
# need a re-prefill of their output so far, which hf_engine's scheduler does not do.
_PAUSE_MODES = ("abort", "in_place")


async def pause_generation(request: web.Request) -> web.Response:
    """SGLang's ``/pause_generation``. Either way new ``/generate`` requests wait until
    ``/continue_generation``. ``mode: "abort"`` (the default, what slime sends before a weight update)
    aborts every request in the engine and answers once none is left; ``"in_place"`` stops the forwards,
    keeping running requests and their KV to resume after ``/continue_generation``."""
    try:
        body = await _json_body(request) if request.can_read_body else {}
    except ProtocolError as err:
        return _error(400, str(err))
    mode = (body or {}).get("mode", "abort") if isinstance(body, dict) else None
    if mode not in _PAUSE_MODES:
        return _error(400, f"mode must be one of {list(_PAUSE_MODES)} for hf_engine, got {mode!r}")
    app, scheduler = request.app, request.app[SCHEDULER]
    app[UNPAUSED].clear()
    if mode == "in_place":
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        scheduler.hold(loop, fut)
        await fut
    else:
        # Requests past the pause gate are in the scheduler's count until answered: abort until none is.
        while True:
            scheduler.abort(None)
            if scheduler.load() == (0, 0):
                break
            await asyncio.sleep(0.02)
    return web.json_response({"message": "Generation paused successfully.", "status": "ok"})


async def continue_generation(request: web.Request) -> web.Response:
    request.app[SCHEDULER].release()
    request.app[UNPAUSED].set()
    return web.json_response({"message": "Generation continued successfully.", "status": "ok"})


async def abort_request(request: web.Request) -> web.Response:
    """SGLang's rules: ``abort_all: true`` aborts every request, ``rid`` the one with that id; a body
    with neither (or an empty rid) aborts nothing, since an empty rid would otherwise match them all."""
    try:
        body = await _json_body(request)
    except ProtocolError as err:
        return _error(400, str(err))
    if not isinstance(body, dict):
        return _error(400, "request body must be a JSON object")
    rid, abort_all = body.get("rid"), body.get("abort_all", False)
    if not isinstance(abort_all, bool):
        return _error(400, f"abort_all must be true or false, got {abort_all!r}")
    if rid is not None and not isinstance(rid, str):
        return _error(400, "rid must be a string")
    if abort_all:
        request.app[SCHEDULER].abort(None)
    elif rid:
        request.app[SCHEDULER].abort(rid)
    else:
        logger.warning("abort_request with neither a rid nor abort_all: nothing aborted")
    return web.Response(text="")


# SGLang's /v1/loads sections. hf_engine has none of the optional ones (memory, speculative decoding,
# LoRA, disaggregation, queue breakdown), so every include answers the core fields only, as SGLang
# does for a section it has no data for. An unknown section is refused (SGLang raises on it too, though
# there it surfaces as a 500).
_LOAD_SECTIONS = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}


async def loads(request: web.Request) -> web.Response:
    """SGLang's ``GET /v1/loads``: one entry per data-parallel rank (here, one) under ``loads``, with
    ``num_running_reqs`` and ``num_waiting_reqs`` (the numbers upstream slime's abort loop polls)."""
    query = request.query
    include = [s.strip() for s in query["include"].split(",")] if query.get("include") else []
    unknown = sorted(set(include) - _LOAD_SECTIONS)
    if unknown:
        return _error(400, f"include has unknown section(s) {unknown}; valid: {sorted(_LOAD_SECTIONS)}")
    if query.get("format") == "prometheus":  # SGLang answers JSON to any other format value
        return _error(400, "format=prometheus is not supported by hf_engine (JSON only)")
    try:
        dp_rank = int(query["dp_rank"]) if "dp_rank" in query else None
    except ValueError:
        return _error(400, f"dp_rank must be an integer, got {query['dp_rank']!r}")
    scheduler = request.app[SCHEDULER]
    running, waiting = scheduler.load()
    core = {"timestamp": time.time(), "dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting,
            "max_running_requests": scheduler.max_batch_size}
    runner = request.app[RUNNER]
    return web.json_response({
        "timestamp": datetime.now(timezone.utc).isoformat(),
        "version": "hf_engine",
        "accelerator": None,
        "num_accelerators": 0 if runner.device.type == "cpu" else 1,
        # SGLang answers an out-of-range dp_rank with no entries.
        "loads": [core] if dp_rank in (None, 0) else [],
    })


async def workers(request: web.Request) -> web.Response:
    """A router's ``GET /workers`` listing this engine alone (see the module docstring). The fields are
    sglang-router's worker entry; callers such as upstream slime read ``url``."""
    # The address the caller used reaches this engine from where the caller is, whatever --host says
    # (0.0.0.0 would not do as a URL).
    url = f"{request.scheme}://{request.host}"
    scheduler = request.app[SCHEDULER]
    running, waiting = scheduler.load()
    healthy = scheduler.alive
    worker = {"id": request.app[ENGINE_ID], "url": url, "model_id": request.app[RUNNER].model_path,
              "priority": 50, "cost": 1.0, "worker_type": "regular", "is_healthy": healthy,
              "load": running + waiting, "connection_mode": "http"}
    return web.json_response({
        "workers": [worker],
        "total": 1,
        "stats": {"total_workers": 1, "healthy_workers": int(healthy), "total_models": 1,
                  "total_load": running + waiting, "by_type": {"regular": 1, "prefill": 0, "decode": 0}},
    })


@web.middleware
async def _errors(request, handler):
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except asyncio.CancelledError:
        raise
    except Exception as err:  # noqa: BLE001 - reported to the client, server keeps serving
        logger.exception("request %s failed", request.path)
        return _error(500, f"{type(err).__name__}: {err}")


def make_app(runner, scheduler, server_flags: dict | None = None) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=256 * 1024 * 1024)
    app[RUNNER] = runner
    app[SCHEDULER] = scheduler
    app[GENERATE_COUNT] = [0]
    app[ENGINE_ID] = uuid.uuid4().hex  # this engine's worker id in the /workers listing
    app[UNPAUSED] = asyncio.Event()
    app[UNPAUSED].set()
    app[SERVER_FLAGS] = dict(server_flags or {})
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health_generate)
    app.router.add_get("/model_info", model_info)
    app.router.add_get("/get_model_info", model_info)
    app.router.add_get("/server_info", get_server_info)
    app.router.add_get("/get_server_info", get_server_info)
    app.router.add_post("/flush_cache", flush_cache)
    app.router.add_get("/flush_cache", flush_cache)
    app.router.add_post("/update_weights_from_disk", update_weights_from_disk)
    app.router.add_post("/update_weight_version", update_weight_version)
    app.router.add_get("/weight_version", weight_version)
    app.router.add_get("/get_weight_version", weight_version)
    app.router.add_post("/pause_generation", pause_generation)
    app.router.add_post("/continue_generation", continue_generation)
    app.router.add_post("/abort_request", abort_request)
    app.router.add_get("/v1/loads", loads)
    app.router.add_get("/workers", workers)  # a router route: see the module docstring

    async def on_cleanup(_app):
        scheduler.stop()

    app.on_cleanup.append(on_cleanup)
    return app
