"""``--rm-url`` is the teacher server's ``http(s)://HOST:PORT/generate``, and only where a teacher server is used.

The OPD hooks post to the URL as given: without a scheme or with another path the first rollout fails
after Ray and the engines are up (or, behind a proxy, posts to the wrong endpoint). With an in-trainer
teacher (``--opd-type megatron``) nothing reads it, so the user would believe a server scores the run.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from slime.arguments.argument_error import ArgumentError

# The reward hooks that send --rm-url the teacher payload; another custom --custom-rm-path may expect any URL.
TEACHER_CLIENTS = (None, "slime.rollout.on_policy_distillation.reward_func")
FORM = "http(s)://HOST:PORT/generate"


def url_problem(url: str) -> str | None:
    """Why ``url`` is not ``http(s)://HOST:PORT/generate``, or None."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return "no http:// or https:// scheme" if "://" not in url else f"scheme {parts.scheme!r} is not http(s)"
    try:
        port = parts.port
    except ValueError:
        return f"port {parts.netloc.rpartition(':')[2]!r} is not a number"
    if not parts.hostname:
        return "no host"
    if port is None:
        return "no port"
    if parts.path != "/generate":  # posted to as given: "/generate/" would rely on the server's redirect
        return "no path (add /generate)" if parts.path in ("", "/") else f"path {parts.path!r} is not /generate"
    if parts.query or parts.fragment:
        return "a query or fragment after /generate"
    return None


def check_rm_url(args) -> None:
    url = getattr(args, "rm_url", None)
    if not url:
        return
    if getattr(args, "use_opd", False) and args.opd_type == "megatron":
        raise ArgumentError(f"--rm-url {url} is set but --opd-type megatron scores with the in-trainer teacher "
                            "(--opd-teacher-load), so no server at --rm-url would be asked: drop --rm-url, or use "
                            "--opd-type sglang for a teacher server")
    if getattr(args, "custom_rm_path", None) not in TEACHER_CLIENTS:
        return
    problem = url_problem(url)
    if problem:
        raise ArgumentError(f"--rm-url {url!r} is not an {FORM} URL: {problem} "
                            "(e.g. http://127.0.0.1:13141/generate, the teacher server's endpoint)")


def unused_rm_url_notes(args) -> list[str]:
    """A warning when nothing reads ``--rm-url``: no OPD teacher server and no custom reward hook."""
    url = getattr(args, "rm_url", None)
    if not url or getattr(args, "use_opd", False) or getattr(args, "custom_rm_path", None):
        return []
    return [f"warning: --rm-url {url} is set but nothing reads it: without --use-opd --opd-type sglang (a teacher "
            "server) or a --custom-rm-path hook the run trains on the environment's reward"]
