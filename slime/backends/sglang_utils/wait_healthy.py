"""Wait from a shell script until an engine server started in the background can generate.

    python -m slime.backends.sglang_utils.wait_healthy --port P --pid PID [--host 127.0.0.1] [--timeout 120]

Exits 0 once ``GET /health_generate`` answers, 1 if the process ``PID`` died first or the timeout
passed. Shell scripts (the CPU demo, benchmarks) start the server themselves and share this wait.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.request


def wait(host: str, port: int, pid: int, timeout: float, poll: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://{host}:{port}/health_generate", timeout=5)
            return True
        except OSError:
            try:
                os.kill(pid, 0)  # the server process died: waiting longer cannot help
            except OSError:
                return False
            time.sleep(poll)
    return False


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pid", type=int, required=True, help="the server process to watch")
    parser.add_argument("--timeout", type=float, default=120.0)
    a = parser.parse_args(argv)
    return 0 if wait(a.host, a.port, a.pid, a.timeout) else 1


if __name__ == "__main__":
    sys.exit(main())
