"""Server-teacher on-policy distillation: slime's reward hooks for a teacher behind SGLang's protocol.

Flags (slime's)::

    --use-opd --opd-type sglang --rm-url http://HOST:PORT/generate
    --custom-rm-path slime.rollout.on_policy_distillation.reward_func
    --custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards

Part of the slime contribution and a drop-in for upstream's module of the same name: the same
payload (upstream PR #2085: ``temperature`` = ``--rollout-temperature``; an SGLang server does not
scale input-token log-probs by it, so the teacher is scored at temperature 1 either way), the same
``post_process_rewards`` contract, plus what multi-turn agents need:

* ``reward_func`` sends the whole sequence (for an agent the whole trajectory with its observation
  tokens) to the teacher once, as a score-only request. Masked observation tokens get a teacher log-prob
  too and the trainer's loss mask ignores them, so a trajectory needs no special handling.
* A generate function may return ``list[Sample]``; upstream then passes the list to ``reward_func``,
  which scores every sample concurrently and returns one reply per sample (upstream's hook breaks).
* Samples marked ``remove_sample`` (failed episodes, finished B2F replays) are not sent: their
  "teacher" log-probs are their own rollout log-probs, so they add no KL anywhere.
* Requests go through slime's ``http_utils.post`` with a bounded number of attempts
  (``OPD_RETRY_MAX``, default 3), so a dead teacher ends the step with an error naming it.
* With ``--opd-teacher-top-k K`` (this runtime's flag; absent upstream, so off there) the request
  also asks for the teacher's top-K log-probs at every position (SGLang's ``top_logprobs_num``) and
  they are kept in ``metadata["teacher_topk"]`` for the exact-KL diagnostic and ``--opd-loss full``.
* ``post_process_rewards`` rejects a teacher reply with a NaN or infinite log-prob (response span or
  top-K) with an error naming the sample and the teacher, so nothing trains on it. ``-inf`` is refused
  too, top-K entries included: a token the teacher rules out completely makes the OPD term and the
  top-K KL infinite (the student never has exactly zero mass there); a server whose top-K holds ``-inf``
  is being asked for more tokens than it gives mass to, so lower ``--opd-teacher-top-k``.
* ``post_process_rewards`` returns ``(raw_rewards, rewards)`` with the task reward each sample carried
  (``metadata["task_reward"]``) as the raw reward, for logging, and 0.0 as every reward, as upstream's
  hook does: the objective is pure OPD, and the teacher term enters the advantages in the trainer
  (``apply_opd_kl_to_advantages``). Upstream skips its reward normalization when this hook is set, so
  a non-zero reward here would train an unbaselined REINFORCE term there.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os

from slime.backends.fsdp_utils.guards import NonFiniteError
from slime.utils import http_utils
from slime.utils.types import Sample

logger = logging.getLogger(__name__)

# Attempts per teacher request (upstream's http_utils counts attempts): a dead teacher fails the step.
TEACHER_MAX_RETRIES = int(os.environ.get("OPD_RETRY_MAX", "3"))


def teacher_top_k(args) -> int:
    return int(getattr(args, "opd_teacher_top_k", 0) or 0)


def teacher_payload(args, sample: Sample) -> dict:
    """Upstream slime's teacher request: score every token of the sequence, generate nothing."""
    payload = {
        "input_ids": list(sample.tokens),
        "sampling_params": {
            "temperature": args.rollout_temperature,
            "max_new_tokens": 0,
            "skip_special_tokens": False,
        },
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    if teacher_top_k(args):
        payload["top_logprobs_num"] = teacher_top_k(args)
    return payload


def _rm_url(args) -> str:
    url = getattr(args, "rm_url", None)
    if not url:
        raise ValueError("server-teacher OPD needs --rm-url http://HOST:PORT/generate (the teacher server)")
    return url


# The reply recorded for a sample that is not sent to the teacher (see remove_sample above).
SKIPPED_REPLY = {"opd_skipped": True}


async def _score(args, sample: Sample) -> dict:
    if getattr(sample, "remove_sample", False):
        return dict(SKIPPED_REPLY)
    if not sample.tokens:
        raise ValueError(f"sample {sample.index}: no tokens to send to the teacher")
    url = _rm_url(args)
    try:
        reply = await http_utils.post(url, teacher_payload(args, sample), TEACHER_MAX_RETRIES)
    except Exception as err:  # the error types differ between upstream's http_utils and this runtime's
        raise RuntimeError(f"OPD teacher request for sample {sample.index} to {url} failed: "
                           f"{type(err).__name__}: {err}") from err
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


def extract_teacher_top_logprobs(reply: dict, response_length: int, k: int) -> dict:
    """The teacher's top-``k`` ``{"ids": [[...]], "logprobs": [[...]]}`` for the last ``response_length`` positions."""
    entries = (reply["meta_info"].get("input_top_logprobs") or [])[1:]  # entry 0: the first token, None
    if response_length > len(entries):
        raise ValueError(f"teacher returned top log-probs for {len(entries)} positions, the response has "
                         f"{response_length} (does the server support top_logprobs_num?)")
    ids, logprobs = [], []
    for entry in entries[len(entries) - response_length:] if response_length else []:
        if not entry or len(entry) < k:
            raise ValueError(f"teacher returned {len(entry or [])} top log-probs at a response position, "
                             f"{k} were asked (--opd-teacher-top-k above the vocabulary size?)")
        ids.append([int(e[1]) for e in entry[:k]])
        logprobs.append([float(e[0]) for e in entry[:k]])
    return {"ids": ids, "logprobs": logprobs}


def _check_finite(args, sample: Sample, what: str, rows) -> None:
    """Raise naming the sample, the teacher and the first bad response position if ``rows`` hold NaN / inf."""
    for position, row in enumerate(rows):
        bad = [v for v in (row if isinstance(row, list) else [row]) if not math.isfinite(v)]
        if bad:
            # NonFiniteError: train.py ends the run with one paragraph (slime/ray/failures.py), not a traceback.
            raise NonFiniteError(f"OPD teacher at {getattr(args, 'rm_url', None)} returned a non-finite {what} "
                             f"({bad[0]}) for sample {sample.index} at response position {position}; refusing "
                             "to train on it (a broken teacher checkpoint or dtype? an --opd-teacher-top-k "
                             "larger than the tokens the teacher gives mass to?)")


def post_process_rewards(args, samples, **kwargs):
    """Store ``teacher_log_probs`` on every sample and return ``(raw_rewards, rewards)``.

    ``samples`` may nest lists (generate functions that return ``list[Sample]``); the returned lists
    follow the flattened order.
    """
    flat = list(_flatten(samples))
    for s in flat:
        reply = s.reward
        if isinstance(reply, dict) and reply.get("opd_skipped"):
            own = s.rollout_log_probs
            s.teacher_log_probs = list(own) if own is not None and len(own) == s.response_length \
                else [0.0] * s.response_length
        elif isinstance(reply, dict) and "meta_info" in reply:
            teacher_log_probs = extract_teacher_log_probs(reply, s.response_length)
            _check_finite(args, s, "log-prob", teacher_log_probs)
            s.teacher_log_probs = teacher_log_probs
            if teacher_top_k(args):
                s.metadata = dict(s.metadata or {})
                topk = extract_teacher_top_logprobs(reply, s.response_length, teacher_top_k(args))
                _check_finite(args, s, "top-k log-prob", topk["logprobs"])
                s.metadata["teacher_topk"] = topk
        elif s.teacher_log_probs is None or len(s.teacher_log_probs) != s.response_length:
            raise ValueError(f"sample {s.index}: sample.reward holds no teacher reply ({type(reply).__name__}); "
                             "was --custom-rm-path slime.rollout.on_policy_distillation.reward_func run?")
    raw_rewards = [float((s.metadata or {}).get("task_reward", 0.0) or 0.0) for s in flat]
    return raw_rewards, [0.0] * len(flat)
