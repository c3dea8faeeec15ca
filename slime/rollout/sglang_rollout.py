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

# The tokenizer cache and engine routing live with the agent loop (the slime contribution, which cannot
# import this runtime module); single-turn generation here shares them.
from examples.multi_turn_tcod.rollout import engine_url, get_tokenizer, output_log_probs, token_room
from slime.rollout.rewards import assign_rewards
from slime.utils.http_utils import post
from slime.utils.misc import load_function
from slime.utils.types import Sample, Status

logger = logging.getLogger(__name__)

# Phase timings of the last rollout call (generation vs. reward/teacher scoring), read by the manager.
LAST_TIMINGS: dict[str, float] = {}


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

    ``max_new_tokens`` is cut to what the prompt leaves of the engine's context (and of
    ``--rollout-max-context-len``, and in server-teacher OPD of what the teacher can score): SGLang answers
    400 to a prompt plus ``max_new_tokens`` above its context, and a 4xx is not retried. A prompt that
    leaves no room is not sent: the sample comes back TRUNCATED with no response, ``remove_sample`` set
    and ``metadata["outcome"] = "prompt_too_long"``, so it is neither scored by the teacher nor trained on.
    """
    tokenizer = get_tokenizer(args)
    if not sample.tokens:
        prompt = sample.prompt
        if isinstance(prompt, list):
            prompt = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        sample.tokens = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    params = dict(sampling_params)
    room = token_room(args, len(sample.tokens), evaluation)
    if room is not None and room < params["max_new_tokens"]:
        if room <= 0:
            return _prompt_too_long(args, sample)
        params["max_new_tokens"] = room
    output = await post(engine_url(args, sample), {
        "input_ids": sample.tokens,
        "sampling_params": params,
        "return_logprob": True,
    })
    sample.append_response_tokens(
        args,
        tokens=output["output_ids"],
        log_probs=output_log_probs(output["meta_info"]),
        trainable=True,
        meta_info=output["meta_info"],
        text=output["text"],
    )
    return sample


def _prompt_too_long(args, sample: Sample) -> Sample:
    limits = getattr(args, "engine_limits", None) or {}
    message = (f"prompt of {len(sample.tokens)} tokens leaves no room to generate (engine limits {limits}, "
               f"--rollout-max-context-len {args.rollout_max_context_len}); not sent")
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
    groups = data_source.get_samples(args.rollout_batch_size) if not evaluation else data_source
    t0 = time.perf_counter()
    groups = run_async(_run_all(args, groups, evaluation))
    t1 = time.perf_counter()
    scored = [s for g in groups for s in g if s.status != Status.FAILED]
    run_async(assign_rewards(args, scored, evaluation=evaluation))
    LAST_TIMINGS.clear()
    LAST_TIMINGS.update({"time/generate": t1 - t0, "time/reward": time.perf_counter() - t1})
    return groups


def run_async(coro):
    """Run a coroutine from sync code, on a persistent loop so the shared HTTP session survives."""
    loop = _get_loop()
    return loop.run_until_complete(coro)


_LOOP: asyncio.AbstractEventLoop | None = None


def _get_loop() -> asyncio.AbstractEventLoop:
    global _LOOP
    if _LOOP is None or _LOOP.is_closed():
        _LOOP = asyncio.new_event_loop()
    return _LOOP
