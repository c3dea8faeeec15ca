"""Start-up checks that a teacher (or reference) model shares the student's vocabulary (this project's runtime).

Not part of the slime contribution: upstream slime has no such check, and its ``http_utils.get`` takes
no timeout. ``train.py`` runs them before Ray starts: :func:`check_teacher_vocab` for a teacher server
(``--opd-type sglang``), :func:`check_local_vocab` for a model folder the trainer loads (the in-trainer
teacher, the reference). ``FSDPActor`` repeats the local check when it loads a frozen model.

The teacher scores the student's token ids, so two things must match: the tokenizer (id -> token, a
same-size but permuted vocabulary scores the wrong tokens) and the model's vocabulary size (the width
of its output layer: extra rows take probability mass and shift every log-prob).
"""

from __future__ import annotations

import json
import logging
import os

from slime.utils import http_utils

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
    if not folder or not os.path.isfile(os.path.join(folder, "config.json")):
        return None
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    size = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
    return int(size) if size is not None else None


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
    if teacher_model_size is not None and student_model_size is not None:
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
    if not checked:
        logger.warning("could not verify the OPD teacher's vocabulary at %s (no vocab_size in /get_model_info "
                       "and its tokenizer folder is not readable here): make sure it shares the student's "
                       "tokenizer", base)
    return info
