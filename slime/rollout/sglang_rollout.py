"""The default rollout function and single-turn generate function (slime's plugin signatures).

``generate_rollout(args, rollout_id, data_source, evaluation=False)`` takes prompts, runs the generate
function (``--custom-generate-function-path`` or :func:`generate`) on every sample with bounded
concurrency, computes rewards, and returns groups of samples. Each request carries its own sampling
seed derived from ``--rollout-seed`` and the sample index, so a resumed run regenerates exactly what an
uninterrupted one would.
"""

from __future__ import annotations

import asyncio
import logging
import time

from slime.rollout.rewards import assign_rewards
from slime.utils.daemon_executor import DaemonThreadPool
from slime.utils.http_utils import post
from slime.utils.misc import load_function
from slime.utils.types import Sample, Status

logger = logging.getLogger(__name__)

# Phase timings of the last rollout call (generation vs. reward/teacher scoring), read by the manager.
LAST_TIMINGS: dict[str, float] = {}
# How the last training rollout was drawn: with --turns-per-step its episodes, student turns and waves.
LAST_COUNTS: dict[str, int] = {}


class GenerateState:
    """Upstream's name for the rollout process's generation state: the policy tokenizer and the abort flag.

    One instance per ``--hf-checkpoint`` (upstream keeps one per process), so every generate function
    (single-turn here, the agent loop of ``examples/multi_turn_tcod``) shares the tokenizer. Upstream loads
    it with ``trust_remote_code=True``; this runtime runs a checkpoint's code only with
    ``--trust-remote-code``, as for the engines it starts.
    """

    _instances: dict[str, "GenerateState"] = {}

    def __new__(cls, args):
        path = args.hf_checkpoint
        if path not in cls._instances:
            from transformers import AutoTokenizer

            state = super().__new__(cls)
            state.args = args
            trust = bool(getattr(args, "trust_remote_code", False))
            state.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
            state.reset()
            cls._instances[path] = state
        return cls._instances[path]

    def reset(self) -> None:
        self.aborted = False


def engine_url(args, sample: Sample | None = None) -> str:
    """Upstream's router, as every generate function reaches the engines. For engines this runtime starts,
    ``RolloutManager`` points the router flags at them (``sglang_utils.router``)."""
    if not getattr(args, "sglang_router_ip", None):
        raise RuntimeError("no rollout engine: set --sglang-router-ip/--sglang-router-port")
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"


def context_limit(args, evaluation: bool = False) -> int | None:
    """Upstream's flag for the longest sequence: ``--eval-max-context-len`` in evaluation, else
    ``--rollout-max-context-len`` (``RolloutManager`` lowers both to what the engines, and in training a
    teacher server, take)."""
    value = getattr(args, "eval_max_context_len" if evaluation else "rollout_max_context_len", None)
    return None if value is None else int(value)


def token_room(args, n_tokens: int, evaluation: bool = False) -> int | None:
    """How many tokens a sequence of ``n_tokens`` may still grow by (None: no limit known)."""
    limit = context_limit(args, evaluation)
    return None if limit is None else limit - n_tokens


def sampling_seed(args, sample: Sample, evaluation: bool, salt: int = 0) -> int:
    """A per-request seed: same run, same sample index -> same tokens, whatever is batched alongside."""
    base = int(args.rollout_seed) * 1_000_003 + (7_919 if evaluation else 0)
    return (base + int(sample.index or 0) * 131 + salt) % (2**31 - 1)


def build_sampling_params(args, evaluation: bool = False) -> dict:
    temperature = args.eval_temperature if evaluation else args.rollout_temperature
    max_new = (args.eval_max_response_len or args.rollout_max_response_len) if evaluation \
        else args.rollout_max_response_len
    params = {
        "temperature": temperature,
        "top_p": args.rollout_top_p,
        "top_k": args.rollout_top_k,
        "max_new_tokens": max_new,
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if args.rollout_stop:
        params["stop"] = list(args.rollout_stop)
    if args.rollout_stop_token_ids:
        params["stop_token_ids"] = list(args.rollout_stop_token_ids)
    return params


async def generate(args, sample: Sample, sampling_params: dict, evaluation: bool = False) -> Sample:
    """Single-turn: one completion of ``sample.prompt``; response tokens are trainable.

    ``max_new_tokens`` is cut to what the prompt leaves of ``--rollout-max-context-len`` (in evaluation
    ``--eval-max-context-len``), which carry the engine's context and, in server-teacher OPD, what the
    teacher can score: SGLang answers 400 to a prompt plus ``max_new_tokens`` above its context, and a 4xx
    is not retried. A prompt that leaves no room is not sent: the sample comes back TRUNCATED with no
    response, ``remove_sample`` set and ``metadata["outcome"] = "prompt_too_long"``, so it is neither
    scored by the teacher nor trained on.
    """
    tokenizer = GenerateState(args).tokenizer
    if not sample.tokens:
        prompt = sample.prompt
        if isinstance(prompt, list):
            prompt = tokenizer.apply_chat_template(
                prompt, tokenize=False, add_generation_prompt=True, **(args.apply_chat_template_kwargs or {})
            )
        sample.tokens = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    params = dict(sampling_params)
    room = token_room(args, len(sample.tokens), evaluation)
    if room is not None and room < params["max_new_tokens"]:
        if room <= 0:
            return _prompt_too_long(args, sample, evaluation)
        params["max_new_tokens"] = room
    output = await post(engine_url(args), {
        "input_ids": sample.tokens,
        "sampling_params": params,
        "return_logprob": True,
    })
    entries = output["meta_info"]["output_token_logprobs"]  # ids and log-probs both from here, as upstream
    sample.append_response_tokens(
        args,
        tokens=[item[1] for item in entries],
        log_probs=[item[0] for item in entries],
        trainable=True,
        meta_info=output["meta_info"],
        text=output["text"],
    )
    return sample


def _prompt_too_long(args, sample: Sample, evaluation: bool) -> Sample:
    flag = "--eval-max-context-len" if evaluation else "--rollout-max-context-len"
    limits = getattr(args, "engine_limits", None) or {}  # runtime-only: what the flag was lowered from
    message = (f"prompt of {len(sample.tokens)} tokens leaves no room to generate ({flag} "
               f"{context_limit(args, evaluation)}, engine limits {limits}); not sent")
    logger.warning("sample %s: %s", sample.index, message)
    sample.status = Status.TRUNCATED
    sample.remove_sample = True
    sample.metadata["outcome"] = "prompt_too_long"
    sample.metadata["truncated_reason"] = message
    return sample


async def _run_all(args, groups: list[list[Sample]], evaluation: bool) -> list[list[Sample]]:
    generate_fn = load_function(args.custom_generate_function_path) if args.custom_generate_function_path \
        else generate
    sampling_params = build_sampling_params(args, evaluation)
    semaphore = asyncio.Semaphore(max(1, args.rollout_concurrency))

    async def one(sample: Sample):
        params = dict(sampling_params)
        # Upstream seeds requests only with deterministic inference; this runtime always does, per sample.
        params["sampling_seed"] = sampling_seed(args, sample, evaluation)
        async with semaphore:
            result = await generate_fn(args, sample, params, evaluation=evaluation)
        return result if isinstance(result, list) else [result]

    flat = [s for group in groups for s in group]
    results = await asyncio.gather(*(one(s) for s in flat))
    # Regroup: a generate function may return several samples per input (slime allows list[Sample]).
    out, cursor = [], 0
    for group in groups:
        regrouped = []
        for _ in group:
            regrouped.extend(results[cursor])
            cursor += 1
        out.append(regrouped)
    return out


def generate_rollout(args, rollout_id: int, data_source, evaluation: bool = False):
    """Generate and reward one rollout step. Returns a list of groups of samples."""
    t0 = time.perf_counter()
    if getattr(args, "turns_per_step", None) and not evaluation:
        from slime.rollout.turn_budget import draw_turn_matched

        play = lambda wave: run_async(_run_all(args, wave, False))  # noqa: E731
        groups, counts = draw_turn_matched(args, rollout_id, data_source, play)
        LAST_COUNTS.clear()
        LAST_COUNTS.update(counts)
    else:
        groups = data_source.get_samples(args.rollout_batch_size) if not evaluation else data_source
        groups = run_async(_run_all(args, groups, evaluation))
    t1 = time.perf_counter()
    # Failed and aborted episodes are dropped before training (select_trainable): no teacher call for them.
    scored = [s for g in groups for s in g if s.status not in (Status.FAILED, Status.ABORTED)]
    run_async(assign_rewards(args, scored, evaluation=evaluation))
    LAST_TIMINGS.clear()
    LAST_TIMINGS.update({"time/generate": t1 - t0, "time/reward": time.perf_counter() - t1})
    return groups


def run_async(coro):
    """Run a coroutine from sync code, on a persistent loop so the shared HTTP session survives.

    If it raises (Ctrl-C included), the loop's other tasks are cancelled and awaited first, so every episode's
    ``env.close()`` runs (``slime.utils.loop_runner``)."""
    from slime.utils.loop_runner import run_until_complete

    return run_until_complete(_get_loop(), coro)


_LOOP: asyncio.AbstractEventLoop | None = None


def _get_loop() -> asyncio.AbstractEventLoop:
    global _LOOP
    if _LOOP is None or _LOOP.is_closed():
        _LOOP = asyncio.new_event_loop()
        # asyncio.to_thread (the agent loop's environment calls) runs here: daemon threads, so a hung
        # environment call cannot keep a stopped run alive.
        _LOOP.set_default_executor(DaemonThreadPool())
    return _LOOP
