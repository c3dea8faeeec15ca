"""Start-up check that a teacher server shares the student's vocabulary (this project's runtime).

Not part of the slime contribution: upstream slime has no such check, and its ``http_utils.get`` takes
no timeout. Called by ``train.py`` before the first rollout with ``--opd-type sglang``.
"""

from __future__ import annotations

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


async def check_teacher_vocab(args, tokenizer_or_vocab_size, *, timeout: float = 30.0) -> dict:
    """Fail at start-up if the teacher's vocabulary differs from the student's.

    ``tokenizer_or_vocab_size`` is the student's tokenizer (compared by size, and token by token when
    the teacher's tokenizer folder is readable here) or its vocabulary size. Returns the teacher's
    /get_model_info reply.
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
