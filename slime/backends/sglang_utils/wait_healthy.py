"""Wait from a shell script until an engine server started in the background can generate.

    python -m slime.backends.sglang_utils.wait_healthy --port P --pid PID [--host 127.0.0.1] [--timeout 120]

Exits 0 once ``GET /health_generate`` answers from process ``PID``'s own socket (or, where that cannot be
checked, while ``PID`` is alive before and after the answer); 1 if ``PID`` died first or the timeout
passed, with the reason on stderr. A port held by another server is not mistaken for ours: ours then
dies with EADDRINUSE and that is reported. Shell scripts (the CPU demo, benchmarks) start the server
themselves and share this wait.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request

from slime.backends.sglang_utils.processes import pid_alive, port_listener_is


def _answers(host: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health_generate", timeout=5) as resp:
            return resp.status == 200
    except OSError:  # not listening yet, not ready, or an HTTP error
        return False


def wait(host: str, port: int, pid: int, timeout: float, poll: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    foreign = False  # the port answered, but from another process's socket
    busy = f"; port {port} is answered by another process, so the server probably could not bind it " \
           "(EADDRINUSE in its log)"
    while True:
        if not pid_alive(pid):  # waiting longer cannot help
            print(f"wait_healthy: server process {pid} exited before it answered on port {port}"
                  f"{busy if foreign else ''}; its exit code is known to the shell that started it "
                  f"(`wait {pid}`)", file=sys.stderr)
            return False
        if _answers(host, port):
            if port_listener_is(port, pid) is False:
                foreign = True
            elif pid_alive(pid):
                return True
        if time.monotonic() >= deadline:
            held = f" (port {port} is held by another process)" if foreign else ""
            print(f"wait_healthy: server process {pid} did not answer on port {port} within {timeout:g}s{held}",
                  file=sys.stderr)
            return False
        time.sleep(poll)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pid", type=int, required=True, help="the server process to watch")
    parser.add_argument("--timeout", type=float, default=120.0)
    a = parser.parse_args(argv)
    from slime.utils.misc import heartbeat

    # A server loading its model on a busy machine takes half a minute: say so every 10 s.
    with heartbeat(f"wait_healthy: the server on port {a.port} is still loading"):
        return 0 if wait(a.host, a.port, a.pid, a.timeout) else 1


if __name__ == "__main__":
    sys.exit(main())
