"""http_utils: retries on 5xx / connection errors / timeouts, no retry on 4xx, clear final errors."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from slime.backends.sglang_utils.launcher import find_free_port
from slime.utils import http_utils

from _engine_helpers import ThreadedApp


@pytest.fixture(scope="module")
def stub():
    calls = {"flaky": 0, "bad": 0, "down": 0}

    async def flaky(request):
        calls["flaky"] += 1
        if calls["flaky"] % 3:
            return web.json_response({"error": {"message": "warming up"}}, status=503)
        return web.json_response({"echo": await request.json()})

    async def bad(request):
        calls["bad"] += 1
        return web.json_response({"error": {"message": "sampling_params.top_p must be > 0"}}, status=400)

    async def down(request):
        calls["down"] += 1
        return web.Response(text="boom", status=500)

    async def slow(request):
        await asyncio.sleep(5)
        return web.json_response({})

    async def empty(request):
        return web.Response(text="")

    app = web.Application()
    app.router.add_post("/flaky", flaky)
    app.router.add_post("/bad", bad)
    app.router.add_post("/down", down)
    app.router.add_post("/slow", slow)
    app.router.add_get("/empty", empty)
    server = ThreadedApp(app)
    yield server.url, calls
    server.stop()


def run(coro_fn):
    async def wrapped():
        try:
            # A guard, not a measurement: a bounded call must end, whatever it ends with.
            return await asyncio.wait_for(coro_fn(), timeout=20)
        finally:
            await http_utils.close_session()

    return asyncio.run(wrapped())


def test_5xx_is_retried_until_success(stub):
    url, calls = stub
    calls["flaky"] = 0
    out = run(lambda: http_utils.post(f"{url}/flaky", {"x": 1}, max_retries=3, backoff=0.01))
    assert out == {"echo": {"x": 1}} and calls["flaky"] == 3


def test_4xx_is_not_retried_and_carries_the_server_message(stub):
    url, calls = stub
    with pytest.raises(http_utils.HTTPRequestError) as err:
        run(lambda: http_utils.post(f"{url}/bad", {}, max_retries=3, backoff=0.01))
    assert calls["bad"] == 1 and err.value.status == 400
    assert "top_p must be > 0" in str(err.value) and f"{url}/bad" in str(err.value)


def test_persistent_5xx_ends_with_an_error_naming_url_and_cause(stub):
    url, calls = stub
    with pytest.raises(http_utils.HTTPRequestError) as err:
        run(lambda: http_utils.post(f"{url}/down", {}, max_retries=3, backoff=0.01))
    assert calls["down"] == 3
    assert f"{url}/down" in str(err.value) and "3 attempt" in str(err.value) and "HTTP 500" in str(err.value)


def test_connection_refused_and_timeout_are_bounded(stub):
    url, _ = stub
    dead = f"http://127.0.0.1:{find_free_port()}/generate"
    with pytest.raises(http_utils.HTTPRequestError, match="failed after 3 attempt") as err:
        run(lambda: http_utils.post(dead, {}, max_retries=3, backoff=0.01))
    assert dead in str(err.value) and err.value.status is None
    with pytest.raises(http_utils.HTTPRequestError, match="no reply within 0.2s"):
        run(lambda: http_utils.post(f"{url}/slow", {}, timeout=0.2, max_retries=1, backoff=0.01))


def test_one_session_per_loop_and_sync_helpers(stub):
    url, _ = stub

    async def sessions():
        return http_utils.get_session(), http_utils.get_session()

    first = run(sessions)
    assert first[0] is first[1]
    second = run(sessions)
    assert second[0] is not first[0]
    assert http_utils.get_sync(f"{url}/empty", max_retries=1) is None
    assert http_utils.post_sync(f"{url}/flaky", {"y": 2}, max_retries=5, backoff=0.01) == {"echo": {"y": 2}}


def test_upstream_call_shape_positional_retries_and_headers(stub):
    # Upstream slime calls post(url, payload, max_retries, headers=...): attempts, not retries.
    url, calls = stub
    calls["flaky"] = 0
    out = run(lambda: http_utils.post(f"{url}/flaky", {"z": 3}, 3, headers={"X-SMG-Routing-Key": "s1"}, backoff=0.01))
    assert out == {"echo": {"z": 3}} and calls["flaky"] == 3
    with pytest.raises(http_utils.HTTPRequestError, match="after 2 attempt"):
        run(lambda: http_utils.post(f"{url}/down", {}, 2, backoff=0.01))


def test_invalid_settings_are_rejected():
    with pytest.raises(ValueError, match="max_retries"):
        asyncio.run(http_utils.post("http://127.0.0.1:1/", {}, max_retries=0))
