"""SGLang's ``/generate`` reply: what the scheduler hands back for a request, and its JSON shape.

The scheduler fills a :class:`GenerateResult` per request (ids, log-probs, the finish reason built by
``finish_stop`` / ``finish_length`` / ``finish_abort``); :func:`build_response` turns it into the body
SGLang answers with, ``{"text", "output_ids", "meta_info"}``. The matched stop is trimmed from the text
(not from ``output_ids``) unless ``no_stop_trim`` is set, as SGLang does.

With ``return_logprob`` and ``top_logprobs_num`` k > 0 the reply adds ``input_top_logprobs`` (aligned
with ``input_token_logprobs``, first entry null) and ``output_top_logprobs`` (one entry per output
token), each entry the k most likely ``[logprob, token_id, text_or_null]`` in descending order; the
log-probs are the ones ``input_token_logprobs`` / ``output_token_logprobs`` are read from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slime.backends.hf_engine.protocol import GenerateRequest


@dataclass
class GenerateResult:
    """What the scheduler hands back for one request."""

    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    input_logprobs: list[float] | None = None  # for prompt tokens start+1 .. end (start's entry is null)
    # With top_k_logprobs = k: per position, (k log-probs descending, their token ids). The input list
    # covers the same positions as input_logprobs; the output list has one pair per output token.
    input_top_logprobs: list[tuple[list[float], list[int]]] | None = None
    output_top_logprobs: list[tuple[list[float], list[int]]] = field(default_factory=list)
    # With token_ids_logprob: per position, the log-probs of those ids (same positions as the top lists).
    input_token_ids_logprobs: list[list[float]] | None = None
    output_token_ids_logprobs: list[list[float]] = field(default_factory=list)
    finish_reason: dict = field(default_factory=dict)
    latency_s: float = 0.0
    weight_version: str = "default"  # the engine's weight version when the request was answered


def finish_stop(matched) -> dict:
    return {"type": "stop", "matched": matched}


def finish_length(length: int) -> dict:
    return {"type": "length", "length": length}


def finish_abort(message: str) -> dict:
    return {"type": "abort", "message": message}


def build_response(req: GenerateRequest, result: GenerateResult, tokenizer) -> dict:
    """SGLang's /generate reply for one prompt."""
    sp = req.sampling
    text_ids = result.output_ids
    finish = result.finish_reason
    matched = finish.get("matched")
    # SGLang trims the matched stop from the text (not from output_ids) unless no_stop_trim is set. A
    # stop token is an int id (bool is an int to Python, but never a token), a stop string a str.
    matched_token = isinstance(matched, int) and not isinstance(matched, bool)
    if not sp.no_stop_trim and finish.get("type") == "stop" and matched_token and text_ids:
        text_ids = text_ids[:-1]
    # As SGLang's detokenizer does: both flags go to the tokenizer, which decides what they do.
    text = tokenizer.decode(text_ids, skip_special_tokens=sp.skip_special_tokens,
                            spaces_between_special_tokens=sp.spaces_between_special_tokens)
    if not sp.no_stop_trim and isinstance(matched, str):
        cut = text.find(matched)
        if cut >= 0:
            text = text[:cut]
    meta = {
        "id": req.rid,
        "finish_reason": finish,
        "prompt_tokens": len(req.input_ids),
        "completion_tokens": len(result.output_ids),
        "cached_tokens": 0,
        "e2e_latency": result.latency_s,
        "weight_version": result.weight_version,
    }
    if req.return_logprob:
        def piece(tid):
            return tokenizer.decode([tid]) if req.return_text_in_logprobs else None

        span = req.input_ids[req.logprob_start_len:]
        values = [None] + list(result.input_logprobs or [])
        meta["input_token_logprobs"] = [[v, t, piece(t)] for v, t in zip(values, span)]
        meta["output_token_logprobs"] = [[v, t, piece(t)] for v, t in zip(result.output_logprobs, result.output_ids)]
        if req.top_logprobs_num > 0:
            def top(pairs):
                return [[[v, t, piece(t)] for v, t in zip(vals, ids)] for vals, ids in pairs]

            # SGLang's input list starts with null: the first position has no prediction, as above.
            meta["input_top_logprobs"] = [None] + top(result.input_top_logprobs or [])
            meta["output_top_logprobs"] = top(result.output_top_logprobs)
        if req.logprob_token_ids:
            ids = req.logprob_token_ids

            def asked(rows):
                return [[[v, t, piece(t)] for v, t in zip(vals, ids)] for vals in rows]

            # As SGLang: entries follow the order of token_ids_logprob; the first input position has none.
            meta["input_token_ids_logprobs"] = [None] + asked(result.input_token_ids_logprobs or [])
            meta["output_token_ids_logprobs"] = asked(result.output_token_ids_logprobs)
    return {"text": text, "output_ids": list(result.output_ids), "meta_info": meta}
