"""Engines behind slime's router: found through its worker list and given every weight update (a router
that lists none stops the run); seeds honoured only where the engines say so."""

from __future__ import annotations

import logging

import pytest
from aiohttp import web

from _engine_helpers import ThreadedApp, start_hf_engine
from slime.backends.sglang_utils import build_engine_command
from slime.backends.sglang_utils.engine_info import NoEnginesError
from slime.ray.rollout import RolloutManager
from slime.rollout.sglang_rollout import run_async
from slime.utils import http_utils
from slime.utils.arguments import parse_args
from slime.utils.tiny_models import save_tiny_checkpoint


class StubEngine:
    """Answers /server_info like SGLang 0.5.23 and records weight updates."""

    def __init__(self, deterministic=True, context_length=None, max_req_input_len=4090):
        self.loaded = []
        self.info = {"context_length": context_length, "max_req_input_len": max_req_input_len,
                     "enable_deterministic_inference": deterministic}

        async def server_info(request):
            return web.json_response(self.info)

        async def update(request):
            self.loaded.append((await request.json())["model_path"])
            return web.json_response({"success": True, "message": "ok"})

        app = web.Application()
        app.router.add_get("/server_info", server_info)
        app.router.add_post("/update_weights_from_disk", update)
        self.server = ThreadedApp(app)
        self.url = self.server.url


class StubRouter:
    """sglang-router's GET /workers (or, ``old=True``, the older GET /list_workers)."""

    def __init__(self, urls, old=False):
        self.urls = list(urls)

        async def workers(request):
            return web.json_response({"workers": [{"id": str(i), "url": u, "worker_type": "regular",
                                                   "is_healthy": True} for i, u in enumerate(self.urls)],
                                      "total": len(self.urls)})

        async def list_workers(request):
            return web.json_response({"urls": self.urls})

        app = web.Application()
        app.router.add_get("/list_workers" if old else "/workers", list_workers if old else workers)
        self.server = ThreadedApp(app)


def manager_for(router_port, *extra):
    args = parse_args(argv=["--hf-checkpoint", "/models/none", "--sglang-router-ip", "127.0.0.1",
                            "--sglang-router-port", str(router_port), *extra])
    manager = RolloutManager.__new__(RolloutManager)
    manager.args, manager.engines, manager.needs_engines = args, [], True
    return manager


@pytest.fixture
def stubs():
    made = []
    yield made
    run_async(http_utils.close_session())
    for stub in made:
        stub.server.stop()


@pytest.mark.parametrize("old_router", [False, True])
def test_weights_reach_every_worker_behind_the_router(stubs, old_router):
    engines = [StubEngine(), StubEngine()]
    router = StubRouter([e.url for e in engines], old=old_router)
    stubs += [*engines, router]
    manager = manager_for(router.server.port)
    manager.wait_engines()
    assert manager.args.engine_limits["rollout"]["context_len"] == 4096
    # Carried into upstream's flags: a prompt of at most max_req_input_len - 1 = 4089 tokens gets a request.
    assert manager.args.rollout_max_context_len == manager.args.eval_max_context_len == 4090
    manager.update_weights("/ckpt/step1")
    assert [e.loaded for e in engines] == [["/ckpt/step1"], ["/ckpt/step1"]]
    engines.append(StubEngine())  # a worker registered later gets the next update too
    stubs.append(engines[-1])
    router.urls.append(engines[-1].url)
    manager.update_weights("/ckpt/step2")
    assert [e.loaded[-1] for e in engines] == ["/ckpt/step2"] * 3


def test_a_router_without_workers_stops_the_run(stubs):
    router = StubRouter([])
    stubs.append(router)
    manager = manager_for(router.server.port)
    with pytest.raises(NoEnginesError, match="lists no workers"):
        manager.wait_engines()
    with pytest.raises(NoEnginesError, match="silently go off-policy"):
        manager.update_weights("/ckpt/step1")


def test_hf_engine_standing_in_for_the_router_gets_the_weights(tmp_path):
    a = save_tiny_checkpoint(tmp_path / "a", hidden_size=16, num_layers=1, num_heads=2, seed=0)
    b = save_tiny_checkpoint(tmp_path / "b", hidden_size=16, num_layers=1, num_heads=2, seed=1)
    server, runner = start_hf_engine(a, deterministic=True)
    try:
        manager = manager_for(server.port)
        manager.wait_engines()
        assert manager.args.engine_limits["rollout"]["deterministic"] is True
        manager.update_weights(str(b))
        assert runner.model_path == str(b)
    finally:
        run_async(http_utils.close_session())
        server.stop()


def test_engines_that_ignore_seeds_are_reported(stubs, caplog):
    engines = [StubEngine(deterministic=True), StubEngine(deterministic=False)]
    router = StubRouter([e.url for e in engines])
    stubs += [*engines, router]
    manager = manager_for(router.server.port)
    with caplog.at_level(logging.WARNING, logger="slime.backends.sglang_utils.engine_info"):
        manager.wait_engines()
    assert manager.args.engine_limits["rollout"]["deterministic"] is False
    assert any("--enable-deterministic-inference" in r.getMessage() for r in caplog.records)


def test_launched_sglang_servers_honour_sampling_seeds():
    args = parse_args(argv=["--hf-checkpoint", "/models/qwen", "--rollout-backend", "sglang",
                            "--sglang-enable-deterministic-inference"])
    assert "--enable-deterministic-inference" in build_engine_command(args, port=1, cpu=False)  # a GPU's command


def test_both_engines_get_the_context_length():
    from slime.backends.hf_engine.__main__ import parse_args as engine_args

    for backend in ("sglang", "hf_engine"):
        args = parse_args(argv=["--hf-checkpoint", "/m", "--rollout-backend", backend, "--rollout-max-context-len", "96"])
        cmd = build_engine_command(args, port=1)
        assert cmd[cmd.index("--context-length") + 1] == "96"
    assert engine_args(["--model-path", "/m", "--context-length", "96"]).context_length == 96
