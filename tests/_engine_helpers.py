"""Test helpers: run an aiohttp app (the hf_engine, or a stub) on a background thread, send it requests, and
compute reference log-probs with a direct forward."""

from __future__ import annotations

import asyncio
import threading

import torch
from aiohttp import web

from slime.backends.sglang_utils.launcher import find_free_port
from slime.utils import http_utils


class ThreadedApp:
    """Serve ``app`` on 127.0.0.1:<free port> from a daemon thread until :meth:`stop`."""

    def __init__(self, app: web.Application):
        self.port = find_free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        # Short shutdown: stub handlers that sleep on purpose must not hold up teardown.
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        ready = threading.Event()

        def serve():
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._runner.setup())
            self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        ready.wait(30)

    def stop(self):
        async def shutdown():
            await self._runner.cleanup()
            # Handlers still sleeping on purpose (timeout stubs) are cancelled, not left dangling.
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()


def start_hf_engine(model_path, **scheduler_kwargs) -> tuple[ThreadedApp, object]:
    """The hf_engine in-process; returns (server, runner) so tests can reach the served model."""
    from slime.backends.hf_engine.model_runner import ModelRunner
    from slime.backends.hf_engine.scheduler import Scheduler
    from slime.backends.hf_engine.server import make_app

    runner = ModelRunner(str(model_path))
    scheduler = Scheduler(runner, **scheduler_kwargs)
    scheduler.start()
    return ThreadedApp(make_app(runner, scheduler)), runner


# ---------------------------------------------------------------------------- requests and references
def run(coro):
    async def wrapped():
        try:
            return await coro
        finally:
            await http_utils.close_session()

    return asyncio.run(wrapped())


def gen(url, payload):
    return run(http_utils.post(f"{url}/generate", payload, max_retries=1, timeout=60))


def gen_many(url, payloads):
    async def all_at_once():
        return await asyncio.gather(*(http_utils.post(f"{url}/generate", p, max_retries=1, timeout=120)
                                      for p in payloads))

    return run(all_at_once())


@torch.no_grad()
def token_logprobs(model, ids, temperature=1.0):
    """log p(ids[j] | ids[:j]) for j >= 1 from one unbatched forward."""
    logits = model(torch.tensor([ids])).logits[0, :-1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


def values(entries):
    return torch.tensor([e[0] for e in entries])
