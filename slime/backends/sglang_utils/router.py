"""sglang-router in front of the engines this runtime starts, at upstream's router address, as slime does.

The agent loop (a file of the slime PR) sends every turn to upstream's router,
``http://{args.sglang_router_ip}:{args.sglang_router_port}/generate``, and never to an engine list. So when this
runtime starts the engines itself (no ``--sglang-router-ip`` given), ``RolloutManager`` points those two flags at
the one engine, or, with several, at an sglang-router (the PyPI package ``sglang-router``, a dependency of this
runtime, run as ``python -m sglang_router.launch_router`` in a process of its own, bound to 127.0.0.1) started once
the engines are healthy. It serves the hf_engine and SGLang alike.

Its cache-aware policy sends a request to the engine whose radix tree holds the longest part of its prompt (while
the engines' loads stay balanced), so an episode's turns keep landing on the engine that already holds their
prefix; a round robin spreads them and every turn after the first prefills its whole history again.

What sglang-router 0.3.2 does with the routes this runtime uses (tried against it, ``tests/test_sglang_router.py``):

* ``/generate``: to one worker, by policy; a worker's 400 comes back as the worker's 400.
* ``/flush_cache``: to every worker.
* ``/update_weights_from_disk`` and ``/abort_request``: 404, not routed. Weights and aborts go to each worker
  directly, from the router's ``GET /workers`` list (what upstream slime's abort path reads) or, for engines
  started here, from the URLs known without asking (``RolloutManager.engine_urls``).
* ``/get_server_info``: the router's own (worker count), not an engine's; this runtime reads each engine's.

Whether the router address is the user's or this runtime's is kept in ``args.sglang_router_external``
(:func:`uses_external_router`): an external router is asked for its ``/workers``, the engines started here are
known without asking.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from slime.backends.sglang_utils.processes import die_with_parent_preexec

logger = logging.getLogger(__name__)

POLICY = "cache_aware"


class RouterLaunchError(RuntimeError):
    """sglang-router exited or did not list its workers in time; the message quotes its log."""


def uses_external_router(args) -> bool:
    """True when ``--sglang-router-ip`` names the user's router (ask it for its workers); False when this
    runtime pointed it at the engines it started. Args that never went through ``RolloutManager`` (tools,
    tests) keep the flag's plain meaning: set means external."""
    external = getattr(args, "sglang_router_external", None)
    return bool(args.sglang_router_ip) if external is None else bool(external)


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


def router_python(args=None) -> str:
    """An interpreter that has sglang-router: this one (it is a dependency of this runtime), else
    ``--sglang-python``'s."""
    if importlib.util.find_spec("sglang_router") is not None:
        return sys.executable
    other = getattr(args, "sglang_python", None) if args is not None else None
    if other:
        return other
    raise RouterLaunchError("sglang-router is not installed in this Python (pip install sglang-router, or "
                            "`make venv`), and no --sglang-python was given that might have it")


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) or "(empty log)"
    except OSError:
        return "(no log)"


class SGLangRouter:
    """``python -m sglang_router.launch_router`` in front of ``worker_urls``; :meth:`start` once they are healthy."""

    def __init__(self, worker_urls: list[str], *, host: str = "127.0.0.1", port: int | None = None,
                 policy: str = POLICY, python: str | None = None, log_dir: str | os.PathLike | None = None):
        if not worker_urls:
            raise ValueError("a router needs at least one engine")
        from slime.backends.sglang_utils.launcher import find_free_port

        self.workers = [url.rstrip("/") for url in worker_urls]
        self.host, self.port = host, port or find_free_port(host)
        self.policy = policy
        self.python = python or router_python()
        log_dir = Path(log_dir or os.environ.get("SLIME_ENGINE_LOG_DIR", "/tmp/slime_engines"))
        self.log_path = log_dir / f"router_{self.host}_{self.port}.log"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        from slime.backends.sglang_utils.launcher import watched_module

        return watched_module(self.python, "sglang_router.launch_router") + [
            "--host", self.host, "--port", str(self.port), "--worker-urls", *self.workers,
            "--policy", self.policy, "--log-level", "warn",
            # The workers are healthy when the router starts: check at once instead of every 30 s.
            "--worker-startup-check-interval", "1", "--worker-startup-timeout-secs", "60",
            # This runtime's client retries a 5xx itself (http_utils); one retry layer is enough.
            "--disable-retries"]

    def start(self, timeout: float = 90.0) -> "SGLangRouter":
        """Start the router and return once its ``GET /workers`` lists every worker as healthy."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True, preexec_fn=die_with_parent_preexec())
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RouterLaunchError(f"sglang-router exited with code {self.process.returncode} "
                                        f"({' '.join(self.command())}); last lines of {self.log_path}:\n"
                                        f"{_tail(self.log_path)}")
            if sorted(self.healthy_workers()) == sorted(self.workers):
                logger.info("sglang-router %s (%s) in front of %s", self.url, self.policy, self.workers)
                return self
            if time.monotonic() >= deadline:
                self.stop()
                raise RouterLaunchError(f"sglang-router at {self.url} did not list its {len(self.workers)} "
                                        f"workers as healthy within {timeout:g} s; last lines of {self.log_path}:\n"
                                        f"{_tail(self.log_path)}")
            time.sleep(0.25)

    def healthy_workers(self) -> list[str]:
        try:
            with urllib.request.urlopen(f"{self.url}/workers", timeout=5) as reply:
                listed = json.loads(reply.read()).get("workers", [])
        except (OSError, ValueError, AttributeError):
            return []
        return [w["url"].rstrip("/") for w in listed if isinstance(w, dict) and w.get("is_healthy", True)]

    def stop(self, grace: float = 10.0) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            import signal

            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.process.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
        return self.process.returncode


def point_router_at_engines(args, engine_urls: list[str]) -> SGLangRouter | None:
    """Set ``--sglang-router-ip/--sglang-router-port`` to the engines this runtime started: the engine itself
    when there is one, else an :class:`SGLangRouter` (returned not yet started: the caller starts it once the
    engines are healthy, and stops it)."""
    args.rollout_engine_urls = list(engine_urls)
    args.sglang_router_external = False
    router = None
    if len(engine_urls) == 1:
        host, port = host_port(engine_urls[0])
    else:
        router = SGLangRouter(engine_urls, python=router_python(args))
        host, port = router.host, router.port
    args.sglang_router_ip, args.sglang_router_port = host, port
    logger.info("rollouts go to http://%s:%s (%s)", host, port,
                "the only engine" if router is None else f"sglang-router over {len(engine_urls)} engines")
    return router
