"""A piece of work on the scheduler's worker thread: what it holds, when it is done, how it is answered.

A :class:`Job` is one ``/generate`` request (one prompt) with its random generator and the
:class:`GenerateResult` its rows fill; a :class:`Barrier` is a weight update or cache flush that waits for
the work before it. Both carry the asyncio future of the handler that submitted them, completed from the
worker thread by :func:`resolve`. :func:`finish_reason` holds SGLang's rules for when a generating row
stops. *Which* jobs run together, and when, is the scheduler's business, not this module's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from slime.backends.hf_engine.protocol import GenerateRequest
from slime.backends.hf_engine.response import GenerateResult, finish_length, finish_stop


@dataclass
class Job:
    req: GenerateRequest
    loop: object
    future: object
    generator: torch.Generator
    started: float = field(default_factory=time.perf_counter)
    result: GenerateResult = field(default_factory=GenerateResult)
    abort_message: str | None = None
    settled: bool = False  # answered or dropped: no longer counted by Scheduler.load()


@dataclass
class Barrier:
    kind: str  # "update_weights" | "flush_cache"
    payload: dict
    loop: object
    future: object


def resolve(loop, future, value=None, error=None):
    """Complete an asyncio future from the worker thread; a cancelled one (client gone) is left alone."""
    def done():
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    loop.call_soon_threadsafe(done)


def keep_input_logprobs(result: GenerateResult, span) -> None:
    """Store a runner :class:`Span` in the result as plain lists (the reply is built from those)."""
    result.input_logprobs = span.logprobs.tolist()
    if span.top is not None:
        result.input_top_logprobs = list(zip(span.top[0].tolist(), span.top[1].tolist()))
    if getattr(span, "asked", None) is not None:
        result.input_token_ids_logprobs = span.asked.tolist()


def id_lists(jobs) -> dict:
    """``id_lists=`` for the runner when some job asks for ``token_ids_logprob`` (else no keyword, so
    runners that never see such requests need not take it)."""
    lists = [getattr(j.req, "logprob_token_ids", None) for j in jobs]
    return {"id_lists": lists} if any(lists) else {}


def finish_reason(job: Job, token: int, runner):
    """Why ``job`` stops after sampling ``token`` (already appended to its output), or None to go on."""
    sp, out = job.req.sampling, job.result.output_ids
    if token in sp.stop_token_ids or (not sp.ignore_eos and token in runner.eos_ids):
        return finish_stop(token)
    if sp.stop:
        text = runner.tokenizer.decode(out, skip_special_tokens=sp.skip_special_tokens)
        for stop in sp.stop:
            if stop in text:
                return finish_stop(stop)
    if len(out) >= sp.max_new_tokens:
        return finish_length(sp.max_new_tokens)
    # SGLang's scheduler caps max_new_tokens at max_req_len - input - 1, max_req_len being
    # context - 1 (without a KV-pool limit): a request stops 2 tokens short of the context.
    if len(job.req.input_ids) + len(out) >= runner.context_len - 2:
        return finish_length(len(out))
    return None
