"""Client helpers for engine maintenance routes (same on SGLang and the hf_engine)."""

from __future__ import annotations

from slime.utils import http_utils


def _base(url: str) -> str:
    # Accept either the server's base URL or its /generate URL (what --rm-url holds).
    url = url.rstrip("/")
    return url[: -len("/generate")] if url.endswith("/generate") else url


async def update_weights_from_disk(url: str, model_path: str, *, timeout: float = 600.0, max_retries: int = 4,
                                   **kwargs) -> dict:
    """Ask the engine to load the HF checkpoint at ``model_path``; raise if it reports failure.

    Few attempts: an engine that cannot be reached now will not be reached in a minute either, and
    training on against stale weights would silently go off-policy.
    """
    reply = await http_utils.post(f"{_base(url)}/update_weights_from_disk", {"model_path": str(model_path)},
                                  max_retries, timeout=timeout, **kwargs)
    if not isinstance(reply, dict) or not reply.get("success"):
        raise RuntimeError(f"{_base(url)} did not load weights from {model_path}: {reply!r}")
    return reply


async def flush_cache(url: str, **kwargs) -> None:
    await http_utils.post(f"{_base(url)}/flush_cache", None, **kwargs)


async def get_model_info(url: str, **kwargs) -> dict:
    return await http_utils.get(f"{_base(url)}/get_model_info", **kwargs)


async def abort_all_requests(urls: list[str], **kwargs) -> None:
    """Abort every request on each engine (``/abort_request {"abort_all": true}``; the requests return with
    ``finish_reason.type == "abort"``). sglang-router does not route this route, so each engine is asked: the
    router's ``GET /workers`` list (``engine_info.router_workers``) or the engines started here."""
    import asyncio

    await asyncio.gather(*(http_utils.post(f"{_base(url)}/abort_request", {"abort_all": True}, **kwargs)
                           for url in urls))
