"""The shell scripts' wait for a background engine: healthy -> 0, dead process -> 1 at once."""

import os
import subprocess
import sys

from _engine_helpers import start_hf_engine
from slime.backends.sglang_utils.launcher import find_free_port
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
