"""The shell scripts' wait for a background engine: healthy -> 0, dead process -> 1 at once, and a port held
by another server is never taken for ours (here and in the launcher's own wait)."""

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from aiohttp import web

from _engine_helpers import ThreadedApp, start_hf_engine
from slime.backends.sglang_utils import launcher
from slime.backends.sglang_utils.launcher import EngineLaunchError, EngineProcess, find_free_port
from slime.backends.sglang_utils.wait_healthy import main
from slime.utils.tiny_models import save_tiny_checkpoint


def test_returns_zero_once_the_engine_can_generate(tmp_path):
    path = save_tiny_checkpoint(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2)
    server, _ = start_hf_engine(path)
    try:
        assert main(["--port", str(server.port), "--pid", str(os.getpid()), "--timeout", "60"]) == 0
    finally:
        server.stop()


def test_returns_one_when_the_server_process_is_gone():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    # A wait that ignored the dead process would sit out the whole timeout (and trip pytest's own).
    assert main(["--port", str(find_free_port()), "--pid", str(dead.pid), "--timeout", "900"]) == 1


async def _ok(request):
    return web.Response(text="ok")


def _healthy_stub():
    """Another server holding a port and answering health checks (in this process)."""
    app = web.Application()
    app.router.add_get("/health_generate", _ok)
    return ThreadedApp(app)


# A server that loads for a moment, then cannot bind its port (it is taken) and exits, as SGLang does.
BIND_LATE = "import socket, sys, time; time.sleep({delay}); socket.socket().bind(('127.0.0.1', int(sys.argv[1])))"


def test_a_busy_port_is_not_mistaken_for_our_server(capsys):
    stub = _healthy_stub()
    server = subprocess.Popen([sys.executable, "-c", BIND_LATE.format(delay=1.0), str(stub.port)],
                              stderr=subprocess.DEVNULL)
    try:
        # Before the fix: 0 at the first poll, while the new server was still loading.
        assert main(["--port", str(stub.port), "--pid", str(server.pid), "--timeout", "60"]) == 1
        assert server.wait(10) != 0  # it died with EADDRINUSE
    finally:
        server.kill()
        stub.stop()
    err = capsys.readouterr().err
    assert f"server process {server.pid} exited" in err and "answered by another process" in err


def test_a_live_server_behind_a_busy_port_times_out_naming_it(capsys):
    stub = _healthy_stub()
    loading = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert main(["--port", str(stub.port), "--pid", str(loading.pid), "--timeout", "1.5"]) == 1
    finally:
        loading.kill()
        loading.wait()
        stub.stop()
    assert f"port {stub.port} is held by another process" in capsys.readouterr().err


def test_the_launcher_reports_a_busy_port_with_the_exit_code(tmp_path):
    stub = _healthy_stub()
    cmd = [sys.executable, "-c", BIND_LATE.format(delay=0.5), str(stub.port)]
    engine = EngineProcess(cmd, host="127.0.0.1", port=stub.port, log_path=tmp_path / "engine.log")
    try:
        with pytest.raises(EngineLaunchError) as err:
            engine.wait_healthy(timeout=60, poll=0.1)
    finally:
        engine.stop()
        stub.stop()
    message = str(err.value)
    assert "exited with code 1" in message and f"port {stub.port} is answered by another process" in message
    assert "Address already in use" in message  # the server's own log line is quoted


# A server that binds its port and answers every GET with 200 until killed.
SERVE = (
    "import http.server, sys\n"
    "class Ok(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n"
    "    def log_message(self, *args):\n"
    "        pass\n"
    "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), Ok).serve_forever()\n"
)


def test_the_launcher_starts_again_on_a_new_port_when_its_own_pick_was_taken(tmp_path, monkeypatch):
    # find_free_port's port is free when picked and released before the server binds it: here another
    # server takes it in between, so the first start dies with EADDRINUSE and the second gets a new port.
    stub = _healthy_stub()
    picks = iter([stub.port, find_free_port()])
    monkeypatch.setattr(launcher, "find_free_port", lambda host="127.0.0.1": next(picks))
    monkeypatch.setattr(launcher, "build_engine_command",
                        lambda args, **kw: [sys.executable, "-c", SERVE, str(kw["port"])])
    try:
        engine = launcher.launch_engine(SimpleNamespace(), log_dir=tmp_path, timeout=30)
        try:
            assert engine.port != stub.port and engine.process.poll() is None
        finally:
            engine.stop()
        with pytest.raises(EngineLaunchError, match="answered by another process"):  # a given port: one try
            launcher.launch_engine(SimpleNamespace(), port=stub.port, log_dir=tmp_path, timeout=30)
    finally:
        stub.stop()


def test_the_rollout_manager_restarts_an_engine_whose_port_was_taken_and_routes_to_the_new_one(tmp_path,
                                                                                              monkeypatch):
    # RolloutManager starts its engines without waiting (they load while the trainers start), so the race
    # above can hit it too: the engine that lost its port is started again and the router flags follow it.
    from slime.ray.rollout import RolloutManager

    stub = _healthy_stub()
    fresh = find_free_port()
    picks = iter([stub.port, fresh])
    monkeypatch.setattr(launcher, "find_free_port", lambda host="127.0.0.1": next(picks))
    monkeypatch.setattr(launcher, "build_engine_command",
                        lambda args, **kw: [sys.executable, "-c", SERVE, str(kw["port"])])
    monkeypatch.setenv("SLIME_ENGINE_LOG_DIR", str(tmp_path))
    manager = RolloutManager.__new__(RolloutManager)
    manager.args = SimpleNamespace(rollout_backend="hf", rollout_num_gpus=1, rollout_num_gpus_per_engine=1,
                                   engine_host="127.0.0.1", hf_checkpoint="unused", rollout_model_path=None)
    manager.engines, manager._engine_group, manager._router, manager.needs_engines = [], None, None, False
    try:
        manager._start_engines()
        assert manager.args.sglang_router_port == stub.port  # routed before the engine could bind
        manager.wait_engines(timeout=30)
        assert [e.port for e in manager.engines] == [fresh] and manager.engines[0].process.poll() is None
        assert manager.args.rollout_engine_urls == [f"http://127.0.0.1:{fresh}"]
        assert manager.args.sglang_router_port == fresh
    finally:
        for engine in manager.engines:
            engine.stop()
        stub.stop()
