"""One shared aiohttp session per event loop, with timeouts and bounded retries.

Signatures follow upstream slime where slime code calls them: ``post(url, payload, max_retries=60,
headers=None)`` and ``get(url)``, with ``max_retries`` counting attempts as upstream does. This runtime
adds keyword-only ``timeout`` and ``backoff``; files of the slime contribution never pass them.

``post`` / ``get`` retry connection errors, timeouts and HTTP 5xx with exponential backoff
(``backoff * 2**attempt`` seconds, capped at ``max_backoff``); 4xx answers are the caller's fault and
raise at once with the server's message (upstream retries them too, which only delays the same error).
When the attempts run out, :class:`HTTPRequestError` names the URL, the number of attempts and the last
cause. A reply is never replaced by an empty or zero result. Worst-case time of a call is about
``max_retries * timeout + sum of the backoffs``.

Sessions are kept per event loop because an aiohttp session is bound to the loop that created it
(Ray actors and tests run several loops in one process). ``post_sync`` serves code outside a loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import weakref

import aiohttp

logger = logging.getLogger(__name__)

# Seconds per attempt; read at call time, so a process may tune it (SLIME_HTTP_TIMEOUT) for callers that,
# like upstream slime code, cannot pass ``timeout``.
DEFAULT_TIMEOUT = float(os.environ.get("SLIME_HTTP_TIMEOUT", "600"))
DEFAULT_MAX_RETRIES = 60  # attempts, upstream slime's default
DEFAULT_BACKOFF = 1.0
MAX_BACKOFF = 8.0

_sessions: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession]" = weakref.WeakKeyDictionary()


class HTTPRequestError(RuntimeError):
    """A request that failed for good. ``status`` is the HTTP status when the server answered."""

    def __init__(self, message: str, *, url: str, status: int | None = None):
        super().__init__(message)
        self.url = url
        self.status = status


class _Retryable(Exception):
    def __init__(self, cause: str, status: int | None = None):
        super().__init__(cause)
        self.status = status


def get_session() -> aiohttp.ClientSession:
    """The session of the running event loop (created on first use)."""
    loop = asyncio.get_running_loop()
    session = _sessions.get(loop)
    if session is None or session.closed:
        # No connection cap: the caller bounds concurrency (e.g. --rollout-concurrency).
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        session = aiohttp.ClientSession(connector=connector)
        _sessions[loop] = session
    return session


async def close_session() -> None:
    """Close the running loop's session (call before the loop ends to avoid 'unclosed session' noise)."""
    session = _sessions.pop(asyncio.get_running_loop(), None)
    if session is not None and not session.closed:
        await session.close()


async def _once(method: str, url: str, payload, timeout: float, headers: dict | None):
    session = get_session()
    try:
        async with session.request(method, url, json=payload, headers=headers,
                                   timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            body = await resp.read()
            if resp.status >= 500:
                raise _Retryable(f"HTTP {resp.status}: {_snippet(body)}", resp.status)
            if resp.status >= 400:
                raise HTTPRequestError(f"{method} {url} was rejected with HTTP {resp.status}: {_snippet(body)}",
                                       url=url, status=resp.status)
            if not body:
                return None
            try:
                return json.loads(body)
            except ValueError:
                return body.decode("utf-8", errors="replace")
    except asyncio.TimeoutError:
        raise _Retryable(f"no reply within {timeout:g}s") from None
    except aiohttp.ClientError as err:
        raise _Retryable(f"{type(err).__name__}: {err}") from None


def _snippet(body: bytes, limit: int = 500) -> str:
    text = body.decode("utf-8", errors="replace").strip()
    try:  # SGLang (and the hf_engine) wrap errors as {"error": {"message": ...}}
        parsed = json.loads(text)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict) and "message" in parsed["error"]:
            text = str(parsed["error"]["message"])
    except ValueError:
        pass
    return text[:limit] + ("..." if len(text) > limit else "")


async def request(method: str, url: str, payload=None, *, timeout: float | None = None,
                  max_retries: int = DEFAULT_MAX_RETRIES, backoff: float | None = None,
                  max_backoff: float = MAX_BACKOFF, headers: dict | None = None):
    """Send one request in at most ``max_retries`` attempts. Returns the decoded JSON (or text, or None)."""
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    backoff = DEFAULT_BACKOFF if backoff is None else backoff
    if max_retries < 1 or timeout <= 0 or backoff < 0:
        raise ValueError("need max_retries >= 1 (attempts), timeout > 0 and backoff >= 0")
    last = None
    started = time.monotonic()
    for attempt in range(1, max_retries + 1):
        try:
            return await _once(method, url, payload, timeout, headers)
        except _Retryable as err:
            last = err
            if attempt == max_retries:
                break
            delay = min(max_backoff, backoff * (2 ** (attempt - 1)))
            logger.warning("%s %s failed (%s); attempt %d/%d, next in %.2fs", method, url, err, attempt,
                           max_retries, delay)
            await asyncio.sleep(delay)
    raise HTTPRequestError(f"{method} {url} failed after {max_retries} attempt(s) over "
                           f"{time.monotonic() - started:.0f} s: {last}",
                           url=url, status=last.status)


async def post(url: str, payload, max_retries: int = DEFAULT_MAX_RETRIES, headers: dict | None = None, *,
               timeout: float | None = None, backoff: float | None = None):
    return await request("POST", url, payload, max_retries=max_retries, headers=headers, timeout=timeout,
                         backoff=backoff)


async def get(url: str, *, max_retries: int = DEFAULT_MAX_RETRIES, timeout: float | None = None,
              backoff: float | None = None):
    return await request("GET", url, None, max_retries=max_retries, timeout=timeout, backoff=backoff)


def post_sync(url: str, payload, **kwargs):
    """``post`` for code that is not inside an event loop (runs a private loop and closes its session)."""
    async def run():
        try:
            return await post(url, payload, **kwargs)
        finally:
            await close_session()

    return asyncio.run(run())


def get_sync(url: str, **kwargs):
    async def run():
        try:
            return await get(url, **kwargs)
        finally:
            await close_session()

    return asyncio.run(run())
