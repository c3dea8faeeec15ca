"""A small round-robin router in front of the engines this runtime starts, at upstream's router address.

The agent loop (a file of the slime PR) sends every turn to upstream's router,
``http://{args.sglang_router_ip}:{args.sglang_router_port}/generate``, and never to an engine list. So
when this runtime starts the engines itself (no ``--sglang-router-ip`` given), ``RolloutManager`` points
those two flags at the one engine, or, with several, at a :class:`RoundRobinRouter` it starts in its own
process (a daemon thread with its own event loop, bound to 127.0.0.1 only: the rollouts are its only
clients).

Routes, as sglang-router serves them where this runtime needs them:

* ``POST /generate`` and every route not named below (``/health``, ``/health_generate``,
  ``/server_info``, ``/get_model_info``, ...): forwarded to the next engine in turn, status and body
  unchanged (a 400 stays the engine's 400, which the client does not retry). An engine that cannot be
  reached answers 502 naming it; ``http_utils.post`` retries a 5xx, and the retry goes to the next engine.
* ``POST /flush_cache``, ``/update_weights_from_disk``, ``/abort_request``: sent to every engine (a
  weight update or an abort that reached only one engine would leave the others behind).
* ``GET /workers`` (and the older ``/list_workers``): the engines, in sglang-router's reply shapes.

Per-request round robin spreads the turns of one episode over the engines, so an engine's prefix cache
is hit only when consecutive turns land on it; sglang-router's cache-aware policy does better and is
what ``--sglang-router-ip`` is for.

Whether the router address is the user's or this runtime's is kept in ``args.sglang_router_external``
(:func:`uses_external_router`): an external router is asked for its ``/workers``, the engines started
here are known without asking.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

logger = logging.getLogger(__name__)

BROADCAST = ("/flush_cache", "/update_weights_from_disk", "/abort_request")
# Request headers that describe the hop, not the request: aiohttp sets its own.
_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def uses_external_router(args) -> bool:
    """True when ``--sglang-router-ip`` names the user's router (ask it for its workers); False when this
    runtime pointed it at the engines it started. Args that never went through ``RolloutManager`` (tools,
    tests) keep the flag's plain meaning: set means external."""
    external = getattr(args, "sglang_router_external", None)
    return bool(args.sglang_router_ip) if external is None else bool(external)


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


class RoundRobinRouter:
    """Forward requests to ``worker_urls`` (engine base URLs) in turn; see the module docstring."""

    def __init__(self, worker_urls: list[str], host: str = "127.0.0.1", port: int = 0):
        if not worker_urls:
            raise ValueError("a router needs at least one engine")
        self.workers = [url.rstrip("/") for url in worker_urls]
        self.host, self.port = host, port
        self._next = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ------------------------------------------------------------------ lifetime
    def start(self, timeout: float = 30.0) -> "RoundRobinRouter":
        """Serve from a daemon thread; returns once the socket is bound (``port`` 0: a free one, then known)."""
        ready, failed = threading.Event(), []
        self._loop = asyncio.new_event_loop()

        def serve():
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._setup())
            except BaseException as err:  # noqa: BLE001 - reported to start(), which raises it
                failed.append(err)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="slime-router", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError(f"the router did not bind {self.host} within {timeout:g} s")
        if failed:
            raise RuntimeError(f"the router could not start on {self.host}:{self.port}: {failed[0]}") from failed[0]
        logger.info("round-robin router %s in front of %s", self.url, self.workers)
        return self

    async def _setup(self):
        app = web.Application(client_max_size=256 * 1024 * 1024)  # a long context's input_ids, as the engines
        app.router.add_get("/workers", self._workers)
        app.router.add_get("/list_workers", self._list_workers)
        for path in BROADCAST:
            app.router.add_post(path, self._broadcast)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        # No total timeout: a long generation is the client's to bound (http_utils' per-attempt timeout).
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def stop(self, timeout: float = 30.0) -> None:
        if self._loop is None or self._loop.is_closed():
            return

        async def shutdown():
            if self._runner is not None:
                await self._runner.cleanup()
            if self._session is not None:
                await self._session.close()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
            self._loop.close()

    # ------------------------------------------------------------------ routes
    async def _send(self, worker: str, request: web.Request, body: bytes) -> web.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        url = f"{worker}{request.rel_url}"
        try:
            async with self._session.request(request.method, url, data=body, headers=headers) as reply:
                payload = await reply.read()
                content_type = reply.headers.get("Content-Type", "application/json")
                return web.Response(status=reply.status, body=payload, headers={"Content-Type": content_type})
        except (aiohttp.ClientError, OSError) as err:
            # 502, so the client's retry (http_utils retries a 5xx) goes to the next engine.
            message = f"router {self.url}: engine {worker} could not be reached: {type(err).__name__}: {err}"
            logger.warning(message)
            return web.json_response({"error": {"message": message}}, status=502)

    async def _forward(self, request: web.Request) -> web.Response:
        worker = self.workers[next(self._next) % len(self.workers)]
        return await self._send(worker, request, await request.read())

    async def _broadcast(self, request: web.Request) -> web.Response:
        body = await request.read()
        replies = await asyncio.gather(*(self._send(worker, request, body) for worker in self.workers))
        failed = [(w, r) for w, r in zip(self.workers, replies) if r.status >= 300]
        if failed:
            worker, reply = failed[0]  # the first failure, as the engine gave it
            return web.Response(status=reply.status, body=reply.body, headers={"Content-Type": reply.content_type})
        decoded = [_json_or_text(r.body) for r in replies]
        if all(isinstance(d, dict) and "success" in d for d in decoded):  # /update_weights_from_disk's shape
            message = "; ".join(f"{w}: {d.get('message', '')}" for w, d in zip(self.workers, decoded))
            return web.json_response({"success": all(d["success"] for d in decoded), "message": message})
        return web.json_response({"workers": dict(zip(self.workers, decoded))})

    async def _workers(self, request: web.Request) -> web.Response:
        workers = [
            {"id": str(i), "url": url, "worker_type": "regular", "is_healthy": True}
            for i, url in enumerate(self.workers)
        ]
        return web.json_response({"workers": workers, "total": len(workers)})

    async def _list_workers(self, request: web.Request) -> web.Response:
        return web.json_response({"urls": list(self.workers)})


def _json_or_text(body: bytes):
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", errors="replace")


def point_router_at_engines(args, engine_urls: list[str]) -> RoundRobinRouter | None:
    """Set ``--sglang-router-ip/--sglang-router-port`` to the engines this runtime started: the engine
    itself when there is one, else a :class:`RoundRobinRouter` (returned: the caller stops it)."""
    args.rollout_engine_urls = list(engine_urls)
    args.sglang_router_external = False
    router = None
    if len(engine_urls) == 1:
        host, port = host_port(engine_urls[0])
    else:
        router = RoundRobinRouter(engine_urls).start()
        host, port = router.host, router.port
    args.sglang_router_ip, args.sglang_router_port = host, port
    logger.info(
        "rollouts go to http://%s:%s (%s)",
        host,
        port,
        "the only engine" if router is None else f"round robin over {len(engine_urls)} engines",
    )
    return router
