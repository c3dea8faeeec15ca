"""Start-up checks that a teacher (or reference) model shares the student's vocabulary (this project's runtime).

Not part of the slime contribution: upstream slime has no such check, and its ``http_utils.get`` takes
no timeout. ``train.py`` runs them before Ray starts: :func:`check_teacher_vocab` for a teacher server
(``--opd-type sglang``), :func:`check_local_vocab` for a model folder the trainer loads (the in-trainer
teacher, the reference). ``FSDPActor`` repeats the local check when it loads a frozen model.

The teacher scores the student's token ids, so two things must match: the tokenizer (id -> token, a
same-size but permuted vocabulary scores the wrong tokens) and the model's vocabulary size (the width
of its output layer: extra rows take probability mass and shift every log-prob).

A real SGLang server reports neither size in ``/get_model_info``, and its tokenizer folder is often not
readable from the trainer. What is not settled from those is then asked of the server itself through
``/generate`` (:func:`probe_teacher`): SGLang 0.5.23 checks ``token_ids_logprob`` against the model's
vocabulary and answers 400 naming the range (``valid range is [0, V)``), so the id ``V - 1`` (the
student's last row) must be accepted and ``V`` refused; and a score-only request of token ids spread
over the student's vocabulary (its special tokens included) with ``return_text_in_logprobs`` shows the
teacher's text for each id, which must be the student's. Single-token decoding can differ between
transformers versions for a few ordinary tokens, so there a handful of differing ids is a warning and
10% or more an error; any differing added (special) token is an error (chat templates rely on them).
"""

from __future__ import annotations

import logging
import os
import re

from slime.utils import http_utils
from slime.utils.hf_config import config_field

logger = logging.getLogger(__name__)


def _teacher_base(args) -> str:
    url = getattr(args, "rm_url", None)
    if not url:
        raise ValueError("server-teacher OPD needs --rm-url http://HOST:PORT/generate (the teacher server)")
    url = url.rstrip("/")
    return url[: -len("/generate")] if url.endswith("/generate") else url


def vocab_difference(student_vocab: dict, other_vocab: dict) -> list | None:
    """None when both token -> id mappings are equal, else up to 5 differing (token, id) pairs."""
    if student_vocab == other_vocab:
        return None
    return sorted(set(other_vocab.items()) ^ set(student_vocab.items()))[:5]


def model_vocab_size(folder: str | None) -> int | None:
    """The output-layer width from a HF folder's config.json, when the folder is readable here."""
    return config_field(folder, "vocab_size")


def load_vocab(folder: str | None) -> dict | None:
    """The token -> id mapping of a local tokenizer folder, or None (no folder, or weights only)."""
    if not folder or not os.path.isdir(folder):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder).get_vocab()
    except (OSError, ValueError):
        return None


def check_local_vocab(policy_folder: str, other_folder: str, flag: str, *, policy_vocab: dict | None = None) -> None:
    """Reject a model folder (``flag``) whose tokenizer or model vocabulary differs from the policy's.

    Tokenizers are compared only when both folders have one; ``policy_vocab`` saves reloading the policy's.
    """
    policy_size, other_size = model_vocab_size(policy_folder), model_vocab_size(other_folder)
    if policy_size is not None and other_size is not None and policy_size != other_size:
        raise ValueError(f"{flag} {other_folder!r} has a model vocabulary of {other_size} but the policy "
                         f"(--hf-checkpoint) has {policy_size}: it must share the policy's tokenizer to score its tokens")
    if os.path.realpath(policy_folder) == os.path.realpath(other_folder):
        return
    policy_vocab = policy_vocab if policy_vocab is not None else load_vocab(policy_folder)
    other_vocab = load_vocab(other_folder)
    if policy_vocab is None or other_vocab is None:
        return
    differ = vocab_difference(policy_vocab, other_vocab)
    if differ:
        raise ValueError(f"{flag} {other_folder!r}: its tokenizer maps tokens differently from the policy's "
                         f"(--hf-checkpoint), e.g. {differ}: it must share the policy's tokenizer")


# Of the probed ids, this share (or more) decoding differently means another tokenizer.
PROBE_MISMATCH_LIMIT = 0.1
PROBE_IDS = 512
_RANGE = re.compile(r"valid range is \[0, (\d+)\)")


def probe_ids(tokenizer, count: int = PROBE_IDS) -> list[int]:
    """Token ids spread over the whole tokenizer: the first ones, an even spread, the added (special)
    tokens and the last one."""
    n = len(tokenizer)
    ids = set(range(min(n, 32))) | {round(i * (n - 1) / max(1, count - 1)) for i in range(count)} | {n - 1}
    ids |= {i for i in getattr(tokenizer, "added_tokens_decoder", {}) if 0 <= i < n}
    return sorted(ids)


async def _accepts_id(base: str, token_id: int, prompt: list[int], timeout: float):
    """(accepted, message): whether the server takes ``token_id`` in ``token_ids_logprob``."""
    payload = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
               "token_ids_logprob": [token_id]}
    try:
        await http_utils.post(f"{base}/generate", payload, 2, timeout=timeout)
    except http_utils.HTTPRequestError as err:
        if err.status == 400:
            return False, str(err)
        raise
    return True, ""


async def probe_teacher(base: str, tokenizer, student_model_size: int | None, *, check_size: bool,
                        check_tokens: bool, timeout: float = 30.0) -> bool:
    """Ask the teacher server itself (see the module docstring). Raises ValueError on a different
    vocabulary; returns whether something was verified (False: the server does not support the probe)."""
    prompt = (tokenizer.encode("Hello", add_special_tokens=False) if tokenizer is not None else [0]) or [0]
    verified = False
    if check_size and student_model_size:
        size = int(student_model_size)
        ok, message = await _accepts_id(base, size - 1, prompt, timeout)
        found = _RANGE.search(message)
        if not ok and not found:
            logger.warning("the OPD teacher at %s refused the vocabulary probe (%s): its model vocabulary is "
                           "not verified", base, message)
            return False
        if not ok:
            raise ValueError(f"OPD teacher at {base} has a model vocabulary (output layer) of {found.group(1)} but "
                             f"the student (--hf-checkpoint) has {size}: it cannot score the student's tokens")
        ok, message = await _accepts_id(base, size, prompt, timeout)
        if ok:
            raise ValueError(f"OPD teacher at {base} has a model vocabulary (output layer) larger than the "
                             f"student's {size} (token id {size} is accepted): its log-probs are normalised "
                             "over other rows, so it cannot score the student")
        verified = True
    if check_tokens and tokenizer is not None:
        ids = probe_ids(tokenizer)
        payload = {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
                   "logprob_start_len": 0, "return_text_in_logprobs": True}
        reply = await http_utils.post(f"{base}/generate", payload, 2, timeout=timeout)
        entries = ((reply or {}).get("meta_info") or {}).get("input_token_logprobs") or []
        texts = {int(e[1]): e[2] for e in entries if isinstance(e, list) and len(e) >= 3}
        if not texts or all(t is None for t in texts.values()):
            logger.warning("the OPD teacher at %s returns no token texts (started with --skip-tokenizer-init?): "
                           "its tokenizer is not verified", base)
            return verified
        differ = [(i, texts[i], tokenizer.decode([i])) for i in ids
                  if i in texts and texts[i] is not None and texts[i].strip() != tokenizer.decode([i]).strip()]
        special = set(getattr(tokenizer, "added_tokens_decoder", {}))
        bad_special = [d for d in differ if d[0] in special]
        if bad_special or len(differ) >= PROBE_MISMATCH_LIMIT * len(ids):
            raise ValueError(f"OPD teacher at {base} decodes {len(differ)} of {len(ids)} probed token ids differently "
                             f"from the student's tokenizer, e.g. (id, teacher, student) {(bad_special or differ)[:3]}: "
                             "the teacher must share the student's tokenizer")
        if differ:
            logger.warning("the OPD teacher at %s decodes %d of %d probed token ids differently from the student "
                           "(%s): transformers versions can differ on single tokens; check they share one tokenizer",
                           base, len(differ), len(ids), differ[:3])
        verified = True
    return verified


async def check_teacher_vocab(args, tokenizer_or_vocab_size, *, timeout: float = 30.0) -> dict:
    """Fail at start-up if the teacher server's vocabulary differs from the student's.

    ``tokenizer_or_vocab_size`` is the student's tokenizer (compared by size, and token by token when
    the teacher's tokenizer folder is readable here) or its vocabulary size. The model vocabularies
    (output-layer widths) are compared too when both are known: the teacher's from /get_model_info
    (``model_vocab_size``) or its model folder, the student's from ``--hf-checkpoint``. Returns the
    teacher's /get_model_info reply.
    """
    base = _teacher_base(args)
    info = await http_utils.get(f"{base}/get_model_info", timeout=timeout, max_retries=3)
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
    teacher_model_size = info.get("model_vocab_size") or model_vocab_size(info.get("model_path"))
    student_model_size = model_vocab_size(getattr(args, "hf_checkpoint", None))
    sizes_compared = teacher_model_size is not None and student_model_size is not None
    if sizes_compared:
        if int(teacher_model_size) != student_model_size:
            raise ValueError(f"OPD teacher at {base} has a model vocabulary (output layer) of {teacher_model_size} "
                             f"but the student (--hf-checkpoint) has {student_model_size}: with the same tokenizer "
                             "its log-probs are still normalised over other rows, so it cannot score the student")
    teacher_tok_path = info.get("tokenizer_path")
    teacher_vocab = load_vocab(teacher_tok_path) if tokenizer is not None else None
    if teacher_vocab is not None:
        differ = vocab_difference(tokenizer.get_vocab(), teacher_vocab)
        if differ:
            raise ValueError(f"OPD teacher tokenizer ({teacher_tok_path}) maps tokens differently from the "
                             f"student's, e.g. {differ}: the teacher must share the student's tokenizer")
        checked = True
    if not sizes_compared or (tokenizer is not None and teacher_vocab is None):
        # Real SGLang, tokenizer folder not readable here: ask the server itself.
        checked = await probe_teacher(base, tokenizer, student_model_size, check_size=not sizes_compared,
                                      check_tokens=tokenizer is not None and teacher_vocab is None,
                                      timeout=timeout) or checked
    if not checked:
        logger.warning("could not verify the OPD teacher's vocabulary at %s (no vocab_size in /get_model_info, "
                       "its tokenizer folder is not readable here and it does not answer the /generate probe): "
                       "make sure it shares the student's tokenizer", base)
    return info
