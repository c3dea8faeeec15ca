"""What the rollout side reads from running engines: where they are, how long a request they take, and
whether they honour per-request sampling seeds (this project's runtime; SGLang 0.5.23's routes).

* **Workers behind slime's router.** With ``--sglang-router-ip`` the runtime starts no engine, so it
  asks the router which workers it routes to, as upstream slime's abort path does: ``GET /workers``
  (sglang-router / SGLang Model Gateway: ``{"workers": [{"url": ..., ...}], ...}``), falling back to the
  older ``GET /list_workers`` (``{"urls": [...]}``). Weight updates go to every worker listed.
* **Length limits.** SGLang refuses (HTTP 400) a prompt of ``context_len`` tokens or more, a prompt plus
  ``max_new_tokens`` above ``context_len``, and (its scheduler) a prompt of ``max_req_input_len`` tokens
  or more. ``/server_info`` (older name ``/get_server_info``) reports the launch flag ``context_length``
  (null unless given) and the scheduler's ``max_req_input_len`` (``min(context - 1, KV pool - 1) - 5``);
  ``/model_info`` reports no length. So the context is ``context_length`` when set, else
  ``max_req_input_len + 6`` (exact without a KV-pool limit, and a safe lower bound with one), else the
  model's ``max_position_embeddings`` from a local config.
* **Seeds.** SGLang uses ``sampling_seed`` only when it runs with ``--enable-deterministic-inference``
  (``enable_deterministic_inference`` in ``/server_info``); otherwise every request is seeded alike. The
  hf_engine honours seeds either way, but without the flag its numbers depend on what shares a batch.
  Either way a rerun does not reproduce its rollouts without the flag.

The limits land on ``args.engine_limits`` as ``{"rollout": {...}, "teacher": {...}}`` with
``context_len`` and ``max_prompt_len`` (the longest prompt accepted), and :func:`clamp_context_flags` makes
upstream's flags carry them: ``--rollout-max-context-len`` and ``--eval-max-context-len`` are what the agent
loop (a file of the slime PR, which reads no runtime-only attribute) and the single-turn generate function
bound a sequence by.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from slime.utils import http_utils
from slime.utils.hf_config import config_field

logger = logging.getLogger(__name__)

SERVER_INFO_ROUTES = ("/server_info", "/get_server_info")
# SGLang's scheduler: max_req_input_len = min(context - 1, KV pool - 1) - 5 (managers/tp_worker.py).
SCHEDULER_INPUT_MARGIN = 6


class NoEnginesError(RuntimeError):
    """The router lists no worker: there is nobody to generate with or to push weights to."""


def base_url(url: str) -> str:
    """A server's base URL from itself or its ``/generate`` URL (what ``--rm-url`` holds)."""
    url = url.rstrip("/")
    return url[: -len("/generate")] if url.endswith("/generate") else url


@dataclass
class EngineLimits:
    context_len: int | None = None  # prompt + max_new_tokens must stay within it
    max_prompt_len: int | None = None  # the longest prompt the server accepts
    deterministic: bool | None = None  # sampling_seed honoured (None: the server does not say)

    def as_dict(self) -> dict:
        return asdict(self)


def _int_or_none(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def model_context_length(folder: str | None) -> int | None:
    """``max_position_embeddings`` from a local HF folder's config.json (SGLang's default context)."""
    return _int_or_none(config_field(folder, "max_position_embeddings"))


def limits_from_server_info(info: dict, model_context: int | None = None) -> EngineLimits:
    """The length limits and the seed behaviour an SGLang ``/server_info`` reply implies."""
    info = info if isinstance(info, dict) else {}
    context = _int_or_none(info.get("context_length"))
    max_input = _int_or_none(info.get("max_req_input_len"))
    if context is None and max_input is not None:
        context = max_input + SCHEDULER_INPUT_MARGIN
    if context is None:
        context = model_context
    bounds = [b - 1 for b in (context, max_input) if b is not None]
    deterministic = info.get("enable_deterministic_inference")
    return EngineLimits(context_len=context, max_prompt_len=min(bounds) if bounds else None,
                        deterministic=deterministic if isinstance(deterministic, bool) else None)


def combine(limits: list[EngineLimits]) -> EngineLimits:
    """What every one of several engines accepts (the smallest limits; seeds honoured only if all do)."""
    def smallest(values):
        known = [v for v in values if v is not None]
        return min(known) if known else None

    flags = [lim.deterministic for lim in limits]
    deterministic = None if any(f is None for f in flags) or not flags else all(flags)
    return EngineLimits(context_len=smallest(lim.context_len for lim in limits),
                        max_prompt_len=smallest(lim.max_prompt_len for lim in limits),
                        deterministic=deterministic)


async def get_server_info(url: str, *, timeout: float = 30.0, max_retries: int = 3) -> dict:
    """``GET /server_info``, or ``/get_server_info`` where the newer route is missing."""
    base, last = base_url(url), None
    for route in SERVER_INFO_ROUTES:
        try:
            reply = await http_utils.get(f"{base}{route}", timeout=timeout, max_retries=max_retries)
        except http_utils.HTTPRequestError as err:
            if err.status in (404, 405):
                last = err
                continue
            raise
        if not isinstance(reply, dict):
            raise RuntimeError(f"{base}{route} answered {str(reply)[:200]!r}, not a JSON object")
        return reply
    raise RuntimeError(f"{base} serves neither of {SERVER_INFO_ROUTES}: {last}")


async def read_limits(url: str, model_folder: str | None = None, **kwargs) -> EngineLimits:
    return limits_from_server_info(await get_server_info(url, **kwargs), model_context_length(model_folder))


async def router_workers(router_url: str, *, timeout: float = 30.0, max_retries: int = 3) -> list[str]:
    """Base URLs of the workers slime's router routes to (``/workers``, else ``/list_workers``)."""
    base = base_url(router_url)
    try:
        reply = await http_utils.get(f"{base}/workers", timeout=timeout, max_retries=max_retries)
    except http_utils.HTTPRequestError as err:
        if err.status not in (404, 405):
            raise
        reply = await http_utils.get(f"{base}/list_workers", timeout=timeout, max_retries=max_retries)
        urls = reply.get("urls") if isinstance(reply, dict) else None
        if not isinstance(urls, list):
            raise RuntimeError(f"router {base}/list_workers answered {str(reply)[:200]!r}, expected {{'urls': [...]}}")
        return [base_url(u) for u in urls if isinstance(u, str) and u]
    workers = reply.get("workers") if isinstance(reply, dict) else None
    if not isinstance(workers, list):
        raise RuntimeError(f"router {base}/workers answered {str(reply)[:200]!r}, expected {{'workers': [...]}}")
    return [base_url(w["url"]) for w in workers if isinstance(w, dict) and isinstance(w.get("url"), str)]


async def require_router_workers(args) -> list[str]:
    """The router's workers; :class:`NoEnginesError` when it lists none (weights could reach nobody)."""
    router = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
    urls = await router_workers(router)
    if not urls:
        raise NoEnginesError(f"the router at {router} lists no workers (GET /workers): rollouts have no engine "
                             "and new weights would reach nobody, so training would silently go off-policy. "
                             "Register the SGLang servers with the router before training.")
    return urls


def warn_if_seeds_ignored(what: str, urls: list[str], limits: EngineLimits) -> None:
    if limits.deterministic is False:
        logger.warning("%s %s run(s) without --enable-deterministic-inference: SGLang ignores the per-request "
                       "sampling_seed then, and the hf_engine's results depend on what shares a batch, so a "
                       "resumed or repeated run does not regenerate the same rollouts. Start them with "
                       "--enable-deterministic-inference (train.py: --sglang-enable-deterministic-inference) "
                       "to make rollouts reproducible.", what, urls)
    elif limits.deterministic is None:
        logger.warning("%s %s do(es) not report enable_deterministic_inference in /server_info: per-request "
                       "sampling seeds may be ignored (SGLang honours them only with "
                       "--enable-deterministic-inference)", what, urls)


def sequence_limit(limits: dict | None) -> int | None:
    """The longest sequence an engine with ``limits`` (an :class:`EngineLimits` dict) can grow to request by
    request: within its context, and only while the sequence is a prompt it accepts. A flag of
    ``max_prompt_len + 1`` lets a request go out only for a prompt of at most ``max_prompt_len`` tokens,
    and its prompt plus ``max_new_tokens`` stays within the flag, so within the context."""
    limits = limits or {}
    bounds = [limits.get("context_len")]
    if limits.get("max_prompt_len") is not None:
        bounds.append(limits["max_prompt_len"] + 1)
    known = [int(b) for b in bounds if b is not None]
    return min(known) if known else None


def teacher_sequence_limit(limits: dict | None) -> int | None:
    """The longest sequence a teacher server scores: the whole sequence is its prompt."""
    limits = limits or {}
    if limits.get("max_prompt_len") is not None:
        return int(limits["max_prompt_len"])
    return None if limits.get("context_len") is None else int(limits["context_len"]) - 1  # prompt < context


def clamp_context_flags(args, limits: dict) -> list[str]:
    """Set (or lower) ``--rollout-max-context-len`` and ``--eval-max-context-len`` to what the servers take.

    Rollouts: the rollout engines and, in training with a teacher server (``--opd-type sglang``, which
    scores every trained sequence and, with ``--tcod-prefix-source teacher``, plays B2F prefix turns), the
    teacher. Evaluation is not scored by the teacher: the rollout engines only. A limit that cannot be
    read leaves the flag as it is. Returns one line per flag changed, naming what bounded it.
    """
    engines = sequence_limit(limits.get("rollout"))
    teacher = None
    if getattr(args, "use_opd", False) and getattr(args, "opd_type", None) == "sglang":
        teacher = teacher_sequence_limit(limits.get("teacher"))
    changes = []
    for flag, bounds in (
        ("rollout_max_context_len", (("the rollout engines", engines), ("the teacher server", teacher))),
        ("eval_max_context_len", (("the rollout engines", engines),)),
    ):
        current = getattr(args, flag, None)
        known = [(value, who) for who, value in bounds if value is not None]
        if not known:
            continue
        value, who = min(known)
        if current is not None and current <= value:
            continue
        setattr(args, flag, value)
        was = "unset" if current is None else f"lowered from {current}"
        changes.append(f"--{flag.replace('_', '-')} {value} ({was}: the longest sequence {who} take(s))")
    return changes
