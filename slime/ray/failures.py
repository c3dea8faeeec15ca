"""One paragraph, without a traceback, for the run failures a user acts on rather than debugs.

A teacher or engine that cannot be reached (``HTTPRequestError`` after its retries) is named by the flag
that points at it; a NaN or infinity that reached the trainer (``NonFiniteError``) already says where it
came from. Both may arrive wrapped by Ray (``RayTaskError.cause``) or chained by ``raise ... from``. A
rollout where most episodes failed (``TooManyFailures``) quotes up to three of their errors; steps in a row
with every sample removed (``EmptyStepsError``) name the commonest reason and the flag to change.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from slime.backends.fsdp_utils.guards import NonFiniteError
from slime.utils.http_utils import HTTPRequestError


def _root_cause(err: BaseException):
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        cause = getattr(err, "cause", None)  # Ray's wrapper of an actor's exception
        if isinstance(cause, BaseException):
            err = cause
            continue
        if isinstance(err, (HTTPRequestError, NonFiniteError)):
            return err
        err = err.__cause__ or err.__context__
    return None


def _server(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


def who_is(args, url: str) -> str:
    """The flag (or the engine) behind ``url``."""
    server = _server(url)
    if getattr(args, "rm_url", None) and _server(args.rm_url) == server:
        return f"the teacher server (--rm-url {args.rm_url})"
    router = f"{getattr(args, 'sglang_router_ip', None)}:{getattr(args, 'sglang_router_port', None)}"
    if getattr(args, "sglang_router_ip", None) and router == server:
        from slime.backends.sglang_utils.router import uses_external_router

        if uses_external_router(args):
            return f"the slime router (--sglang-router-ip / --sglang-router-port {router})"
        return f"this run's rollout router or engine at {server} (see the engines' logs)"
    return f"the rollout engine at {server} (started by this run: see its log)"


def describe_failure(args, err: BaseException) -> str | None:
    """The paragraph for ``err``, or None when it is not one of the failures described here."""
    from slime.rollout.empty_steps import EmptyStepsError
    from slime.rollout.trainable_samples import TooManyFailures

    from slime.backends.sglang_utils.launcher import EngineDiedError

    if isinstance(err, (TooManyFailures, EmptyStepsError, EngineDiedError)):  # raised here, never wrapped by Ray
        return str(err)
    root = _root_cause(err)
    if isinstance(root, HTTPRequestError):
        hint = ("Check that it is running and that the URL is right"
                if root.status is None else "The server answered with an error")
        return f"{who_is(args, root.url)} could not be used: {root}. {hint}."
    if isinstance(root, NonFiniteError):
        return (f"training stopped before the optimizer step: {root}. Nothing was updated with it; lower --lr, "
                "check the teacher's log-probs and the rewards, or resume from the last checkpoint (--load).")
    return None
