"""One shared aiohttp session per event loop, with timeouts and bounded retries.

``post`` / ``get`` retry connection errors, timeouts and HTTP 5xx with exponential backoff
(``backoff * 2**attempt`` seconds, capped at ``max_backoff``); 4xx answers are the caller's fault and
raise at once with the server's message. When the retries run out, :class:`HTTPRequestError` names
the URL, the number of attempts and the last cause. A reply is never replaced by an empty or zero
result. Worst-case time of a call is about ``(max_retries + 1) * timeout + sum of the backoffs``.

Sessions are kept per event loop because an aiohttp session is bound to the loop that created it
(Ray actors and tests run several loops in one process). ``post_sync`` serves code outside a loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref

import aiohttp

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 600.0
DEFAULT_MAX_RETRIES = 3
DEFAULT_BACKOFF = 1.0
MAX_BACKOFF = 30.0

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


async def _once(method: str, url: str, payload, timeout: float):
    session = get_session()
    try:
        async with session.request(method, url, json=payload,
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


async def request(method: str, url: str, payload=None, *, timeout: float = DEFAULT_TIMEOUT,
                  max_retries: int = DEFAULT_MAX_RETRIES, backoff: float = DEFAULT_BACKOFF,
                  max_backoff: float = MAX_BACKOFF):
    """Send one request with bounded retries. Returns the decoded JSON (or text, or None if empty)."""
    if max_retries < 0 or timeout <= 0 or backoff < 0:
        raise ValueError("need max_retries >= 0, timeout > 0 and backoff >= 0")
    last = None
    for attempt in range(max_retries + 1):
        try:
            return await _once(method, url, payload, timeout)
        except _Retryable as err:
            last = err
            if attempt == max_retries:
                break
            delay = min(max_backoff, backoff * (2 ** attempt))
            logger.warning("%s %s failed (%s); retry %d/%d in %.2fs", method, url, err, attempt + 1,
                           max_retries, delay)
            await asyncio.sleep(delay)
    raise HTTPRequestError(f"{method} {url} failed after {max_retries + 1} attempt(s): {last}",
                           url=url, status=last.status)


async def post(url: str, payload, **kwargs):
    return await request("POST", url, payload, **kwargs)


async def get(url: str, **kwargs):
    return await request("GET", url, None, **kwargs)


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
