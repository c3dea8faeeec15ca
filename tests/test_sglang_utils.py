"""Engine launching: SGLang command line from the args, and a real hf_engine process started, health-waited,
updated and stopped."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from aiohttp import web

from _engine_helpers import ThreadedApp
from slime.backends.sglang_utils import (EngineLaunchError, EngineProcess, build_engine_command, find_free_port,
                                         launch_engine, update_weights_from_disk)
from slime.backends.sglang_utils import engine_info
from slime.backends.sglang_utils.launcher import cuda_present, engine_env
from slime.backends.sglang_utils.router import SGLangRouter, point_router_at_engines, uses_external_router
from slime.utils import http_utils
from slime.utils.arguments import parse_args
from slime.utils.tiny_models import save_tiny_checkpoint


def _args(*extra):
    return parse_args(argv=["--hf-checkpoint", "/models/qwen", *extra])


def _flags(cmd):
    start = cmd.index("sglang.launch_server") + 1
    return dict(zip(cmd[start:], cmd[start + 1:]))


def test_sglang_command_from_args():
    args = _args("--rollout-backend", "sglang", "--rollout-num-gpus-per-engine", "4",
                 "--sglang-mem-fraction-static", "0.7", "--seed", "9", "--engine-host", "0.0.0.0")
    cmd = build_engine_command(args, port=30001, base_gpu_id=4, cpu=False)
    # Under the watchdog (SGLang has no --parent-pid), run by this interpreter unless --sglang-python says.
    assert cmd[0] == sys.executable and cmd[1].endswith("child_watchdog.py")
    assert cmd[cmd.index("--") + 1:cmd.index("--") + 3] == ["-m", "sglang.launch_server"]
    assert cmd[cmd.index("--parent-pid") + 1] == str(os.getpid())
    flags = _flags(cmd)
    assert flags["--model-path"] == "/models/qwen" and flags["--tp-size"] == "4"
    assert flags["--port"] == "30001" and flags["--host"] == "0.0.0.0"
    assert flags["--mem-fraction-static"] == "0.7" and flags["--random-seed"] == "9"
    assert flags["--base-gpu-id"] == "4"
    assert "--device" not in cmd and engine_env(cmd) is None  # the GPU command is left as it was


def test_sglang_command_on_a_cpu_gets_sglang_cpu_settings():
    args = _args("--rollout-backend", "sglang", "--sglang-python", "/opt/sg/bin/python")
    cmd = build_engine_command(args, port=30001, base_gpu_id=0, cpu=True)
    assert cmd[0] == "/opt/sg/bin/python"
    flags = _flags(cmd)
    assert flags["--device"] == "cpu" and flags["--attention-backend"] == "torch_native"
    assert flags["--sampling-backend"] == "pytorch" and flags["--dtype"] == "float32"
    assert {"--disable-cuda-graph", "--disable-overlap-schedule", "--skip-server-warmup"} <= set(cmd)
    assert int(flags["--max-total-tokens"]) > 0 and 0 < float(flags["--mem-fraction-static"]) < 1
    assert "--base-gpu-id" not in cmd and engine_env(cmd) == {"SGLANG_USE_CPU_ENGINE": "1"}
    # Without cpu=, this process's devices decide: this machine has none.
    assert "--device" in build_engine_command(args, port=1) or cuda_present()


def test_a_missing_sglang_python_is_named(tmp_path):
    args = _args("--rollout-backend", "sglang", "--sglang-python", str(tmp_path / "nope" / "python"))
    with pytest.raises(EngineLaunchError, match="--sglang-python"):
        launch_engine(args, port=find_free_port(), log_dir=tmp_path, timeout=5)


def test_hf_engine_command_from_args():
    args = _args("--rollout-concurrency", "16")
    cmd = build_engine_command(args, model_path="/tmp/m", port=1234)
    assert cmd[1:3] == ["-m", "slime.backends.hf_engine"]
    flags = dict(zip(cmd[3::1], cmd[4::1]))
    assert flags["--model-path"] == "/tmp/m" and flags["--host"] == "127.0.0.1"
    assert flags["--max-batch-size"] == "16" and "--tp-size" not in flags
    assert "--disable-radix-cache" not in cmd  # the prefix cache is on unless asked otherwise


def test_trust_remote_code_is_opt_in():
    assert "--trust-remote-code" not in build_engine_command(_args("--rollout-backend", "sglang"), port=1)
    cmd = build_engine_command(_args("--rollout-backend", "sglang", "--trust-remote-code"), port=1)
    assert "--trust-remote-code" in cmd


@pytest.mark.parametrize("extra,trusted", [((), False), (("--trust-remote-code",), True)])
def test_trust_remote_code_reaches_the_agent_loop_tokenizer(monkeypatch, extra, trusted):
    import transformers

    from slime.rollout.sglang_rollout import GenerateState

    seen = []
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda path, **kw: seen.append(kw["trust_remote_code"]) or object())
    monkeypatch.setattr(GenerateState, "_instances", {})
    state = GenerateState(_args(*extra))  # the agent loop's tokenizer (one per --hf-checkpoint)
    assert seen == [trusted] and GenerateState(_args(*extra)) is state and state.aborted is False


@pytest.mark.parametrize("backend", ["hf_engine", "sglang"])
def test_disable_radix_cache_reaches_both_engines(backend):
    args = _args("--rollout-backend", backend, "--sglang-disable-radix-cache")
    assert "--disable-radix-cache" in build_engine_command(args, model_path="/tmp/m", port=1234)


def test_launch_generate_update_and_stop(tmp_path):
    a = save_tiny_checkpoint(tmp_path / "a", seed=0)
    b = save_tiny_checkpoint(tmp_path / "b", seed=1)
    args = _args()
    payload = {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
               "logprob_start_len": 0}
    engine = launch_engine(args, model_path=str(a), log_dir=tmp_path / "logs", timeout=120)
    try:
        assert engine.url.startswith("http://127.0.0.1:")
        first = http_utils.post_sync(f"{engine.url}/generate", payload)
        reply = asyncio.run(_update(f"{engine.url}/generate", str(b)))
        assert reply["success"] is True
        second = http_utils.post_sync(f"{engine.url}/generate", payload)
        assert first["meta_info"]["input_token_logprobs"] != second["meta_info"]["input_token_logprobs"]
        with pytest.raises(RuntimeError, match="model_path"):
            asyncio.run(_update(engine.url, str(tmp_path / "missing")))
    finally:
        code = engine.stop()
    assert code is not None and engine.process.poll() is not None


async def _update(url, path):
    try:
        return await update_weights_from_disk(url, path, max_retries=1)
    finally:
        await http_utils.close_session()


def test_server_that_dies_reports_its_log(tmp_path):
    script = "import sys; print('cannot load model: no_model_here', flush=True); sys.exit(3)"
    engine = EngineProcess([sys.executable, "-c", script], host="127.0.0.1", port=find_free_port(),
                           log_path=tmp_path / "dead.log")
    with pytest.raises(EngineLaunchError) as err:
        engine.wait_healthy(timeout=60, poll=0.1)
    message = str(err.value)
    assert "exited with code 3" in message and "cannot load model: no_model_here" in message


def test_server_that_never_gets_healthy_is_stopped(tmp_path):
    port = find_free_port()
    script = "import sys, time; print('still loading', flush=True); time.sleep(120)"
    engine = EngineProcess([sys.executable, "-c", script], host="127.0.0.1", port=port,
                           log_path=tmp_path / "slow.log")
    with pytest.raises(EngineLaunchError, match="not healthy after 1s") as err:
        engine.wait_healthy(timeout=1.0, poll=0.1)
    assert "still loading" in str(err.value)
    assert engine.process.poll() is not None  # terminated, not left behind


# ---------------------------------------------------------------------------- sglang-router
class StubEngine:
    """Answers /generate with its own name (400 for an empty input, as SGLang), records weight updates."""

    def __init__(self, name):
        self.name, self.generated, self.loaded, self.flushed = name, [], [], 0

        async def generate(request):
            payload = await request.json()
            if not payload.get("input_ids"):
                return web.json_response({"error": {"message": f"{name}: empty input"}}, status=400)
            self.generated.append(payload)
            return web.json_response({"text": name, "meta_info": {"finish_reason": {"type": "stop"}}})

        async def update(request):
            self.loaded.append((await request.json())["model_path"])
            return web.json_response({"success": True, "message": f"{name} loaded"})

        async def flush(request):
            self.flushed += 1
            return web.Response(text="Cache flushed.")

        async def server_info(request):
            return web.json_response({"context_length": 256, "max_req_input_len": 250,
                                      "enable_deterministic_inference": True, "engine": name})

        async def ok(request):
            return web.Response(text="")

        app = web.Application()
        app.router.add_post("/generate", generate)
        app.router.add_post("/update_weights_from_disk", update)
        app.router.add_post("/flush_cache", flush)
        app.router.add_get("/server_info", server_info)
        app.router.add_get("/health", ok)
        app.router.add_get("/health_generate", ok)
        self.server = ThreadedApp(app)
        self.url = self.server.url


@pytest.fixture
def two_engines():
    engines = [StubEngine("a"), StubEngine("b")]
    yield engines
    for engine in engines:
        engine.server.stop()


def _async(coro_fn):
    async def run():
        try:
            return await coro_fn()
        finally:
            await http_utils.close_session()

    return asyncio.run(run())


def test_sglang_router_lists_its_workers_and_passes_replies_through(two_engines, tmp_path):
    a, b = two_engines
    router = SGLangRouter([a.url, b.url], log_dir=tmp_path).start()
    try:
        assert router.url.startswith("http://127.0.0.1:") and router.process.poll() is None
        assert sorted(_async(lambda: engine_info.router_workers(router.url))) == sorted([a.url, b.url])

        async def six():
            return [await http_utils.post(f"{router.url}/generate", {"input_ids": [1, 2, 3, i]}, max_retries=1)
                    for i in range(6)]

        assert {r["text"] for r in _async(six)} <= {"a", "b"} and len(a.generated) + len(b.generated) == 6
        # The engine's 400 comes back as it was: the client does not retry a request the engine refused.
        with pytest.raises(http_utils.HTTPRequestError, match="empty input") as err:
            _async(lambda: http_utils.post(f"{router.url}/generate", {"input_ids": []}, max_retries=3))
        assert err.value.status == 400
        # A cache flush reaches every engine; a weight update is not routed (each worker gets its own).
        _async(lambda: http_utils.post(f"{router.url}/flush_cache", None, max_retries=1))
        assert a.flushed == b.flushed == 1
        with pytest.raises(http_utils.HTTPRequestError) as err:
            _async(lambda: update_weights_from_disk(router.url, "/ckpt/1", max_retries=1))
        assert err.value.status == 404 and a.loaded == b.loaded == []
    finally:
        router.stop()
    assert router.process.poll() is not None


class _Started:
    """An engine as RolloutManager holds one: a URL, a health wait and a stop."""

    def __init__(self, url):
        self.url, self.stopped = url, False

    def wait_healthy(self, timeout):
        return self

    def stop(self):
        self.stopped = True


def _manager(args, engines):
    from slime.ray.rollout import RolloutManager

    manager = RolloutManager.__new__(RolloutManager)
    manager.args, manager.engines, manager._engine_group, manager.needs_engines = args, engines, None, True
    return manager


def test_engines_started_here_get_the_router_flags(two_engines):
    a, b = two_engines
    args = _args()
    assert args.sglang_router_ip is None and not uses_external_router(args)
    started = [_Started(a.url), _Started(b.url)]
    manager = _manager(args, list(started))
    manager._route_to_engines()
    try:
        # Two engines: an sglang-router, started once they are healthy; the generate functions' URL is
        # upstream's router URL.
        assert (args.sglang_router_ip, args.sglang_router_port) == ("127.0.0.1", manager._router.port)
        assert manager._router.process is None
        assert args.sglang_router_external is False and not uses_external_router(args)
        manager.wait_engines()
        assert manager._router.process.poll() is None
        assert args.engine_limits["rollout"]["context_len"] == 256
        assert args.rollout_max_context_len == args.eval_max_context_len == 250  # a prompt of at most 249
        # Weights go to each engine directly (the router is ours: its engines are known, not asked for).
        assert manager.engine_urls() == [a.url, b.url]
        manager.update_weights("/ckpt/2")
        assert a.loaded == b.loaded == ["/ckpt/2"]

        async def two():
            from slime.rollout.sglang_rollout import engine_url

            return [await http_utils.post(engine_url(args), {"input_ids": [7]}, max_retries=1) for _ in range(2)]

        assert {r["text"] for r in _async(two)} <= {"a", "b"}
    finally:
        router = manager._router
        manager.shutdown()
    assert manager._router is None and all(e.stopped for e in started) and router.process.poll() is not None


def test_one_engine_is_the_router_address_itself(two_engines):
    a, _ = two_engines
    args = _args()
    assert point_router_at_engines(args, [a.url]) is None
    assert f"http://{args.sglang_router_ip}:{args.sglang_router_port}" == a.url
    assert args.rollout_engine_urls == [a.url] and not uses_external_router(args)
    # A user's --sglang-router-ip stays external: RolloutManager starts nothing and asks it for workers.
    assert uses_external_router(_args("--sglang-router-ip", "10.0.0.1", "--sglang-router-port", "3000"))


def test_an_engine_that_dies_during_the_run_is_reported_with_its_log(tmp_path):
    from slime.backends.sglang_utils.launcher import EngineDiedError

    script = "import sys; print('scheduler: killed by the OOM killer', flush=True); sys.exit(137)"
    engine = EngineProcess([sys.executable, "-c", script], host="127.0.0.1", port=find_free_port(),
                           log_path=tmp_path / "dying.log")
    engine.process.wait(60)

    def rollout(*_args, **_kw):
        raise ConnectionError("connection refused")

    manager = _manager(_args(), [engine])
    manager.generate_rollout = rollout
    with pytest.raises(EngineDiedError) as err:
        manager.generate(0)
    message = str(err.value)
    assert engine.url in message and "code 137" in message and "killed by the OOM killer" in message
    from slime.ray.failures import describe_failure

    assert describe_failure(manager.args, err.value) == message  # train.py prints it as one paragraph
