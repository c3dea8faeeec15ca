"""Server-teacher on-policy distillation: slime's reward hooks for a teacher behind SGLang's protocol.

Flags (slime's)::

    --use-opd --opd-type sglang --rm-url http://HOST:PORT/generate
    --custom-rm-path slime.rollout.on_policy_distillation.reward_func
    --custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards

``reward_func`` sends the whole sequence (prompt + response, for an agent the whole trajectory with its
observation tokens) to the teacher once, as a score-only request, with slime's exact payload.
``post_process_rewards`` keeps the last ``response_length`` input-token log-probs as
``sample.teacher_log_probs``; masked observation tokens get a teacher log-prob too and the trainer's
loss mask ignores them, so a multi-turn trajectory needs no special handling.

Temperature: slime sends ``temperature: 0``, which a server ignores for input-token log-probs, so the
teacher is scored at temperature 1 (see ``--opd-type sglang`` validation in arguments.py).

Rewards: the teacher term enters the advantages in the trainer (``apply_opd_kl_to_advantages``), not
here. The returned rewards are the task rewards a sample carried before the teacher replaced
``sample.reward`` (``metadata["task_reward"]``, kept by ``slime.rollout.rewards``), else 0.0: with
pure OPD they are all zero.

slime's known gap closed here: a generate function may return ``list[Sample]``; ``reward_func`` then
scores every sample (concurrently), stores each reply on its sample and returns the list of replies,
and ``post_process_rewards`` accepts nested lists.
"""

from __future__ import annotations

import asyncio
import logging
import os

from slime.utils import http_utils
from slime.utils.types import Sample

logger = logging.getLogger(__name__)

# Bounded retries so a dead teacher ends the run with a clear error instead of hanging it.
TEACHER_TIMEOUT = float(os.environ.get("OPD_TEACHER_TIMEOUT", "300"))
TEACHER_MAX_RETRIES = int(os.environ.get("OPD_RETRY_MAX", "3"))
TEACHER_BACKOFF = float(os.environ.get("OPD_RETRY_BACKOFF", "1.0"))


def teacher_payload(sample: Sample) -> dict:
    """slime's exact teacher request: score every token of the sequence, generate nothing."""
    return {
        "input_ids": list(sample.tokens),
        "sampling_params": {"temperature": 0, "max_new_tokens": 0, "skip_special_tokens": False},
        "return_logprob": True,
        "logprob_start_len": 0,
    }


def _rm_url(args) -> str:
    url = getattr(args, "rm_url", None)
    if not url:
        raise ValueError("server-teacher OPD needs --rm-url http://HOST:PORT/generate (the teacher server)")
    return url


async def _score(args, sample: Sample) -> dict:
    if not sample.tokens:
        raise ValueError(f"sample {sample.index}: no tokens to send to the teacher")
    url = _rm_url(args)
    try:
        reply = await http_utils.post(url, teacher_payload(sample), timeout=TEACHER_TIMEOUT,
                                      max_retries=TEACHER_MAX_RETRIES, backoff=TEACHER_BACKOFF)
    except http_utils.HTTPRequestError as err:
        raise RuntimeError(f"OPD teacher request for sample {sample.index} failed: {err}") from err
    if not isinstance(reply, dict) or "input_token_logprobs" not in (reply.get("meta_info") or {}):
        raise RuntimeError(f"OPD teacher at {url} answered without meta_info.input_token_logprobs: "
                           f"{str(reply)[:300]}")
    return reply


async def reward_func(args, sample, **kwargs):
    """slime's custom reward model hook: the teacher's reply (scored log-probs) for ``sample``.

    For a ``list[Sample]`` every sample is scored, gets its reply in ``sample.reward``, and the list of
    replies is returned.
    """
    if isinstance(sample, list):
        flat = list(_flatten(sample))
        replies = await asyncio.gather(*(_score(args, s) for s in flat))
        for s, reply in zip(flat, replies):
            s.reward = reply
        return list(replies)
    return await _score(args, sample)


def _flatten(samples):
    for s in samples:
        if isinstance(s, list):
            yield from _flatten(s)
        else:
            yield s


def extract_teacher_log_probs(reply: dict, response_length: int) -> list[float]:
    """The teacher's log-probs of the last ``response_length`` tokens from a score-only reply."""
    entries = reply["meta_info"]["input_token_logprobs"][1:]  # entry 0 is the first token: no log-prob
    if response_length > len(entries):
        raise ValueError(f"teacher returned {len(entries)} log-probs for a response of {response_length} tokens "
                         "(was logprob_start_len 0 sent, and the whole sequence?)")
    values = [e[0] for e in entries[len(entries) - response_length:]] if response_length else []
    if any(v is None for v in values):
        raise ValueError("teacher returned a null log-prob inside the response span")
    return [float(v) for v in values]


def post_process_rewards(args, samples, **kwargs):
    """Store ``teacher_log_probs`` on every sample and return ``(raw_rewards, rewards)``.

    ``samples`` may nest lists (generate functions that return ``list[Sample]``); the returned lists
    follow the flattened order.
    """
    flat = list(_flatten(samples))
    for s in flat:
        reply = s.reward
        if isinstance(reply, dict) and "meta_info" in reply:
            s.teacher_log_probs = extract_teacher_log_probs(reply, s.response_length)
        elif s.teacher_log_probs is None or len(s.teacher_log_probs) != s.response_length:
            raise ValueError(f"sample {s.index}: sample.reward holds no teacher reply ({type(reply).__name__}); "
                             "was --custom-rm-path slime.rollout.on_policy_distillation.reward_func run?")
    rewards = [float((s.metadata or {}).get("task_reward", 0.0) or 0.0) for s in flat]
    return list(rewards), rewards


async def check_teacher_vocab(args, tokenizer_or_vocab_size, *, timeout: float = 30.0) -> dict:
    """Fail at start-up if the teacher's vocabulary differs from the student's.

    ``tokenizer_or_vocab_size`` is the student's tokenizer (compared by size, and token by token when
    the teacher's tokenizer folder is readable here) or its vocabulary size. Returns the teacher's
    /get_model_info reply.
    """
    url = _rm_url(args).rstrip("/")
    base = url[: -len("/generate")] if url.endswith("/generate") else url
    info = await http_utils.get(f"{base}/get_model_info", timeout=timeout)
    if not isinstance(info, dict):
        raise RuntimeError(f"teacher at {base} answered /get_model_info with {str(info)[:200]!r}")
    tokenizer = None if isinstance(tokenizer_or_vocab_size, int) else tokenizer_or_vocab_size
    student_size = tokenizer_or_vocab_size if tokenizer is None else len(tokenizer)
    teacher_size = info.get("vocab_size")
    if teacher_size is not None and int(teacher_size) != int(student_size):
        raise ValueError(f"OPD teacher at {base} has a vocabulary of {teacher_size} tokens but the student has "
                         f"{student_size}: the teacher scores the student's token ids, so both must share one "
                         "tokenizer")
    checked = teacher_size is not None
    teacher_tok_path = info.get("tokenizer_path")
    if tokenizer is not None and teacher_tok_path and os.path.isdir(teacher_tok_path):
        from transformers import AutoTokenizer

        teacher_vocab = AutoTokenizer.from_pretrained(teacher_tok_path).get_vocab()
        student_vocab = tokenizer.get_vocab()
        if teacher_vocab != student_vocab:
            differ = sorted(set(teacher_vocab.items()) ^ set(student_vocab.items()))[:5]
            raise ValueError(f"OPD teacher tokenizer ({teacher_tok_path}) maps tokens differently from the "
                             f"student's, e.g. {differ}: the teacher must share the student's tokenizer")
        checked = True
    if not checked:
        logger.warning("could not verify the OPD teacher's vocabulary at %s (no vocab_size in /get_model_info "
                       "and its tokenizer folder is not readable here): make sure it shares the student's "
                       "tokenizer", base)
    return info
