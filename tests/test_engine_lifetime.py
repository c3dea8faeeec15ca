"""Engines die with the process that started them, however it dies: SIGKILL a parent that launched an
engine and the engine is gone within seconds (PR_SET_PDEATHSIG from the launcher, and the hf_engine's own
--parent-pid watchdog, each shown alone too)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest

from slime.backends.sglang_utils.launcher import build_engine_command
from slime.backends.sglang_utils.processes import pid_alive
from slime.utils.tiny_models import save_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def _parent(script: str, *argv) -> subprocess.Popen:
    """A parent process running ``script``; it prints the pid of what it started, then sleeps."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", script, *map(str, argv)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_parent_and_expect_gone(parent: subprocess.Popen, started_within: float = 120,
                                 alive_first: bool = True) -> None:
    line = parent.stdout.readline().strip()
    assert line.isdigit(), parent.stderr.read()
    child = int(line)
    try:
        if alive_first:
            assert pid_alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 5
        while pid_alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(child), f"process {child} outlived its SIGKILLed parent"
    finally:
        if pid_alive(child):
            os.kill(child, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
            parent.wait()


LAUNCH_HF_ENGINE = """
import sys, time
from argparse import Namespace
from pathlib import Path
from slime.backends.sglang_utils import launcher
args = Namespace(rollout_backend="hf_engine", engine_host="127.0.0.1", seed=0, rollout_concurrency=2)
if sys.argv[2] == "watchdog-only":  # no PR_SET_PDEATHSIG; killed once the watchdog is armed, mid-start-up
    launcher.die_with_parent_preexec = lambda: None
    cmd = launcher.build_engine_command(args, model_path=sys.argv[1], port=launcher.find_free_port())
    engine = launcher.EngineProcess(cmd, host="127.0.0.1", port=0, log_path=Path(sys.argv[3]) / "e.log")
    while "exiting when process" not in engine.log_tail():
        assert engine.process.poll() is None, engine.log_tail()
        time.sleep(0.1)
else:
    engine = launcher.launch_engine(args, model_path=sys.argv[1], log_dir=sys.argv[3], timeout=180)
print(engine.process.pid, flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("mode", ["served", "watchdog-only"])
def test_an_hf_engine_dies_with_its_sigkilled_parent(tmp_path, mode):
    if mode != "watchdog-only" and not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    model = save_tiny_checkpoint(tmp_path / "m", hidden_size=16, num_layers=1, num_heads=2)
    _kill_parent_and_expect_gone(_parent(LAUNCH_HF_ENGINE, model, mode, tmp_path / "logs"))


@linux_only
def test_pdeathsig_alone_covers_a_server_we_cannot_change(tmp_path):
    # Real SGLang has no watchdog of ours: the launcher's PR_SET_PDEATHSIG is what ends it.
    script = """
import sys, time
from slime.backends.sglang_utils.launcher import EngineProcess
engine = EngineProcess([sys.executable, "-c", "import time; time.sleep(300)"], host="127.0.0.1", port=1,
                       log_path=sys.argv[1])
print(engine.process.pid, flush=True)
time.sleep(300)
"""
    _kill_parent_and_expect_gone(_parent(script, tmp_path / "server.log"))


WATCHED = """
import sys, time
from slime.backends.sglang_utils.processes import watch_parent
watch_parent(int(sys.argv[1]), poll=0.1)
print("watching", flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("direct", [True, False])
def test_the_watchdog_exits_when_the_watched_process_is_gone(direct):
    # direct: the watched pid is the parent (re-parenting is seen); else an unrelated process (pid polled).
    script = f"""
import os, subprocess, sys, time
watched = os.getpid() if {direct} else subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]).pid
child = subprocess.Popen([sys.executable, "-c", {WATCHED!r}, str(watched)], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "watching"
if not {direct}:
    os.kill(watched, 9)  # before the pid is printed: the test kills this parent as soon as it reads it
print(child.pid, flush=True)
time.sleep(300)
"""
    # Indirect: the watched process is already dead, so the watchdog may have fired before we look.
    _kill_parent_and_expect_gone(_parent(script), alive_first=direct)


def test_the_launcher_gives_the_hf_engine_its_pid():
    args = Namespace(rollout_backend="hf_engine", engine_host="127.0.0.1", seed=0, rollout_concurrency=2)
    cmd = build_engine_command(args, model_path="/m", port=1)
    assert cmd[cmd.index("--parent-pid") + 1] == str(os.getpid())
