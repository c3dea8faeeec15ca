"""Parsing and validation of SGLang's ``/generate`` request (the reply is built in ``response``).

A request body becomes a list of :class:`GenerateRequest` (one per prompt) plus a flag saying whether
the caller sent a batch (then the reply is a list). Every rejection raises :class:`ProtocolError`,
whose message names the offending field; the server turns it into HTTP 400.

Defaults follow SGLang's ``SamplingParams`` / ``GenerateReqInput``: temperature 1, top_p 1, top_k -1
(whole vocabulary), max_new_tokens 128, skip_special_tokens true, spaces_between_special_tokens true,
logprob_start_len -1 (only the last prompt token). Temperatures below 1e-6 mean greedy decoding, as in
SGLang.

Sampling keys follow SGLang 0.5.23's request contract (``sglang/api/v1/api_types.py``: unknown keys in
``sampling_params`` are a 400 there too). Every key upstream slime's rollout sends by default is
accepted: ``spaces_between_special_tokens`` is handed to ``tokenizer.decode`` as SGLang's detokenizer
hands it (transformers 5 tokenizers ignore it, so both values give the same text with them), and
``custom_params`` is checked against SGLang's type for it and otherwise unused: SGLang only hands it to
a custom logit processor, which hf_engine does not have. Upstream slime's
``{"return_top_p_token_ids": true}`` is read by its patched SGLang only; stock SGLang 0.5.23 ignores it
and returns no ``top_p_token_ids``, and so does hf_engine.

``top_logprobs_num`` (k) follows SGLang's ``GenerateReqInput``: an integer, or for a batch one per prompt,
null meaning 0. SGLang does not check k (a negative one acts as 0, one above the vocabulary fails in
``topk``); hf_engine answers 400 to both. What the reply holds for it is ``response``'s job.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

GREEDY_EPS = 1e-6  # SGLang's _SAMPLING_EPS: below it, sampling turns into argmax

# SGLang sampling parameters this engine does not implement. They are accepted at a neutral value (so
# clients that always send them keep working) and rejected otherwise, rather than silently ignored.
# Several have more than one neutral spelling in SGLang: an empty grammar string means "unset", an empty
# logit_bias / stop_regex / choice means none, beam_width 1 is no beam search.
_NEUTRAL_UNSUPPORTED = {
    "min_p": (0.0,),
    "frequency_penalty": (0.0,),
    "presence_penalty": (0.0,),
    "repetition_penalty": (1.0,),
    "min_new_tokens": (0,),
    "n": (1,),
    "beam_width": (1,),
    "json_schema": ("",),
    "regex": ("",),
    "ebnf": ("",),
    "structural_tag": ("",),
    "stop_regex": ([],),
    "logit_bias": ({},),
    "choice": ([],),
    "watermark": (),
}
# "seed" is hf_engine's own alias of sampling_seed (SGLang would reject it); stream_interval only paces
# streamed chunks, so any integer is accepted and none matters.
_SUPPORTED = {"temperature", "top_p", "top_k", "max_new_tokens", "stop", "stop_token_ids",
              "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "ignore_eos",
              "sampling_seed", "seed", "custom_params", "stream_interval"}
_TOP_LEVEL = {"text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len", "rid",
              "return_text_in_logprobs", "stream", "top_logprobs_num", "token_ids_logprob", "prompt"}
# Fields of SGLang's GenerateReqInput that sglang-router (0.3.x) writes into every /generate it forwards, and
# that hf_engine has no feature behind: accepted at the value that asks for nothing, refused otherwise.
# ``model`` is the router's own (which model a multi-model gateway routes to; SGLang ignores it), and
# log_metrics / no_logs only steer SGLang's request logging, so any boolean does.
_TOP_LEVEL_NEUTRAL = {
    "return_hidden_states": (False,),
    "return_routed_experts": (False,),
    "return_entropy": (False,),
    "return_bytes": (False,),
    "background": (False,),
}
_TOP_LEVEL_IGNORED = {"model", "log_metrics", "no_logs"}
# SGLang's scheduler refuses prompts of max_req_input_len tokens or more, max_req_input_len being
# min(context - 1, KV pool - 1) - 5 (tp_worker.py); without a KV pool that is context - 6.
_SCHEDULER_INPUT_MARGIN = 6


class ProtocolError(ValueError):
    """A malformed request; the message names the field."""


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    ignore_eos: bool = False
    seed: int | None = None
    custom_params: dict | None = None  # validated, then unused (no custom logit processor here)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1


@dataclass
class GenerateRequest:
    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1  # resolved to an index in [0, len(input_ids)) by parse_generate
    return_text_in_logprobs: bool = False
    top_logprobs_num: int = 0
    token_ids_logprob: list[int] | None = None

    @property
    def top_k_logprobs(self) -> int:
        """How many top log-probs to compute per position: SGLang only returns them with return_logprob."""
        return self.top_logprobs_num if self.return_logprob else 0

    @property
    def logprob_token_ids(self) -> list[int] | None:
        """The token ids whose log-probs are reported at every position (SGLang's ``token_ids_logprob``)."""
        return self.token_ids_logprob if self.return_logprob and self.token_ids_logprob else None

    @property
    def score_only(self) -> bool:
        return self.sampling.max_new_tokens == 0


# ---------------------------------------------------------------------------- field checks
def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(name, v, *, low=None, high=None, low_open=False):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ProtocolError(f"{name} must be a number, got {v!r}")
    v = float(v)
    if low is not None and (v < low or (low_open and v == low)):
        raise ProtocolError(f"{name} must be {'>' if low_open else '>='} {low}, got {v}")
    if high is not None and v > high:
        raise ProtocolError(f"{name} must be <= {high}, got {v}")
    return v


def _integer(name, v, *, low=None):
    if not _is_int(v):
        raise ProtocolError(f"{name} must be an integer, got {v!r}")
    if low is not None and v < low:
        raise ProtocolError(f"{name} must be >= {low}, got {v}")
    return v


def _boolean(name, v):
    if not isinstance(v, bool):
        raise ProtocolError(f"{name} must be true or false, got {v!r}")
    return v


def _is_neutral(value, neutrals) -> bool:
    # null always means "use the default", as in SGLang. A boolean is no number here (SGLang's contract
    # rejects true where it expects 0), though Python would let False == 0 through.
    if value is None:
        return True
    return not isinstance(value, bool) and any(value == n for n in neutrals)


_JSON_SCALARS = (type(None), bool, int, float, str)
# SGLang's private key in custom_params (a reasoning terminator chosen by its OpenAI renderer); its
# SamplingParams.verify checks it strictly, so a bad value is a 400 there too.
_REASONING_END_KEY = "__sglang_reasoning_end_token_ids"
_MAX_REASONING_END_IDS = 32


def _custom_params(name, value, vocab_size):
    """Check ``custom_params`` against SGLang's type for it, ``Dict[str, CustomParamValue]``: values are
    JSON scalars, lists of scalars or objects of scalars. SGLang's HTTP layer lets any JSON through, but
    its scheduler decodes the request with that type and fails there; hf_engine answers 400 up front."""
    if not isinstance(value, dict):
        raise ProtocolError(f"{name} must be an object, got {type(value).__name__}")
    for key, entry in value.items():
        inner = entry if isinstance(entry, list) else entry.values() if isinstance(entry, dict) else [entry]
        if not all(isinstance(e, _JSON_SCALARS) for e in inner):
            raise ProtocolError(f"{name}.{key} must be a JSON scalar, a list of scalars or an object of "
                                f"scalars (SGLang's custom_params type)")
    if _REASONING_END_KEY in value:
        ids = value[_REASONING_END_KEY]
        if (not isinstance(ids, list) or not 0 < len(ids) <= _MAX_REASONING_END_IDS
                or not all(_is_int(t) and 0 <= t and (vocab_size is None or t < vocab_size) for t in ids)):
            raise ProtocolError(f"{name}.{_REASONING_END_KEY} must be a non-empty list of at most "
                                f"{_MAX_REASONING_END_IDS} token ids")
    return dict(value)


def parse_sampling_params(raw, where: str = "sampling_params", vocab_size: int | None = None) -> SamplingParams:
    if raw is None:
        return SamplingParams()
    if not isinstance(raw, dict):
        raise ProtocolError(f"{where} must be an object, got {type(raw).__name__}")
    out = SamplingParams()
    for key, value in raw.items():
        name = f"{where}.{key}"
        if key in _NEUTRAL_UNSUPPORTED:
            neutrals = _NEUTRAL_UNSUPPORTED[key]
            if not _is_neutral(value, neutrals):
                allowed = " or ".join(["null"] + [repr(n) for n in neutrals])
                raise ProtocolError(f"{name}={value!r} is not supported by hf_engine (only its neutral "
                                    f"value: {allowed})")
            continue
        if key not in _SUPPORTED:
            raise ProtocolError(f"{name} is not a known sampling parameter")
        if value is None:
            continue  # SGLang treats an explicit null as "use the default"
        if key == "temperature":
            out.temperature = _number(name, value, low=0.0)
        elif key == "top_p":
            out.top_p = _number(name, value, low=0.0, high=1.0, low_open=True)
        elif key == "top_k":
            out.top_k = _integer(name, value)
            if out.top_k == 0 or out.top_k < -1:
                raise ProtocolError(f"{name} must be -1 (no limit) or >= 1, got {value}")
        elif key == "max_new_tokens":
            out.max_new_tokens = _integer(name, value, low=0)
        elif key == "stop":
            stops = [value] if isinstance(value, str) else value
            if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
                raise ProtocolError(f"{name} must be a non-empty string or a list of non-empty strings")
            out.stop = list(stops)
        elif key == "stop_token_ids":
            if not isinstance(value, list) or not all(_is_int(t) for t in value):
                raise ProtocolError(f"{name} must be a list of integers")
            out.stop_token_ids = list(value)
        elif key in ("skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "ignore_eos"):
            setattr(out, key, _boolean(name, value))
        elif key in ("sampling_seed", "seed"):
            out.seed = _integer(name, value)
            if not -(2**63) <= out.seed < 2**63:
                raise ProtocolError(f"{name} must fit in 64 bits (SGLang's range), got {value}")
        elif key == "custom_params":
            out.custom_params = _custom_params(name, value, vocab_size)
        elif key == "stream_interval":
            _integer(name, value)  # only paces streamed chunks, and hf_engine does not stream
    return out


# ---------------------------------------------------------------------------- the request body
def _per_item(body: dict, key: str, n: int, batched: bool, default):
    """SGLang lets per-request fields be a scalar (shared) or, for a batch, a list with one per prompt."""
    value = body.get(key, default)
    if batched and isinstance(value, list) and key != "stop":
        if len(value) != n:
            raise ProtocolError(f"{key} is a list of {len(value)} entries for a batch of {n} prompts")
        return value
    return [value] * n


def _token_ids_logprob(value, n: int, batched: bool, vocab_size: int) -> list:
    """SGLang's ``token_ids_logprob``: one flat list of ids (shared by a batch), or per prompt a list of
    them; null or empty means none. Every id must lie in the model's vocabulary (SGLang answers 400 with
    this message, naming the range, so a client can read the vocabulary size off it)."""
    if not value:
        return [None] * n
    if not isinstance(value, list):
        value = [value]
    per_prompt = batched and isinstance(value[0], list)
    if per_prompt and len(value) != n:
        raise ProtocolError(f"token_ids_logprob is a list of {len(value)} entries for a batch of {n} prompts")
    lists = value if per_prompt else [value] * n
    out = []
    for ids in lists:
        if not ids:
            out.append(None)
            continue
        if not isinstance(ids, list) or not all(_is_int(t) for t in ids):
            raise ProtocolError("token_ids_logprob must be a flat list of integers.")
        for token_id in ids:
            if token_id < 0 or token_id >= vocab_size:
                raise ProtocolError(f"token_ids_logprob contains out-of-vocabulary token id {token_id}; "
                                    f"valid range is [0, {vocab_size}).")
        out.append(list(ids))
    return out


def _explicit_max_new_tokens(raw_params, i: int):
    """``max_new_tokens`` as the request spelled it (None when absent): SGLang's context check reads the
    raw field, so a request that leaves it to the default is not checked against the context."""
    raw = raw_params[i] if isinstance(raw_params, list) else raw_params
    return raw.get("max_new_tokens") if isinstance(raw, dict) else None


def check_context(prompt_len: int, max_new_tokens, context_len: int) -> None:
    """SGLang 0.5.23's length rules for a generate request, in its order and with its messages (400):
    its tokenizer manager refuses a prompt of ``context_len`` tokens or more, then a prompt plus
    ``max_new_tokens`` (when the request gives it) above ``context_len``; its scheduler then refuses a
    prompt of ``max_req_input_len`` (``context_len - 6`` without a KV-pool limit) tokens or more."""
    if prompt_len >= context_len:
        raise ProtocolError(f"The input ({prompt_len} tokens) is longer than the model's context length "
                            f"({context_len} tokens).")
    if max_new_tokens is not None and max_new_tokens + prompt_len > context_len:
        raise ProtocolError(
            f"Requested token count exceeds the model's maximum context length of {context_len} tokens. "
            f"You requested a total of {max_new_tokens + prompt_len} tokens: {prompt_len} tokens from the "
            f"input messages and {max_new_tokens} tokens for the completion. Please reduce the number of "
            "tokens in the input messages or the completion to fit within the limit.")
    max_input = max_req_input_len(context_len)
    if prompt_len >= max_input:
        raise ProtocolError(f"Input length ({prompt_len} tokens) exceeds the maximum allowed length "
                            f"({max_input} tokens). Use a shorter input or enable --allow-auto-truncate.")


def max_req_input_len(context_len: int) -> int:
    """SGLang's ``max_req_input_len`` for a server without a KV-pool limit (reported by /get_server_info)."""
    return context_len - _SCHEDULER_INPUT_MARGIN


def parse_generate(body, tokenizer, vocab_size: int, context_len: int) -> tuple[list[GenerateRequest], bool]:
    """Validate a /generate body. Returns (requests, batched)."""
    if not isinstance(body, dict):
        raise ProtocolError("request body must be a JSON object")
    unknown = sorted(set(body) - _TOP_LEVEL - set(_TOP_LEVEL_NEUTRAL) - _TOP_LEVEL_IGNORED)
    if unknown:
        raise ProtocolError(f"unknown field(s) {unknown}")
    for key, neutrals in _TOP_LEVEL_NEUTRAL.items():
        if key in body and not (body[key] is None or any(body[key] is n for n in neutrals)):
            raise ProtocolError(f"{key}={body[key]!r} is not supported by hf_engine (only false or null)")
    for key in ("log_metrics", "no_logs"):
        if body.get(key) is not None:
            _boolean(key, body[key])
    if body.get("stream"):
        raise ProtocolError("stream=true is not supported by hf_engine")
    text = body.get("text", body.get("prompt"))
    ids = body.get("input_ids")
    if (text is None) == (ids is None):
        raise ProtocolError("exactly one of text or input_ids is required")

    if ids is not None:
        batched = isinstance(ids, list) and len(ids) > 0 and isinstance(ids[0], list)
        prompts = ids if batched else [ids]
        for i, p in enumerate(prompts):
            where = f"input_ids[{i}]" if batched else "input_ids"
            if not isinstance(p, list) or not p:
                raise ProtocolError(f"{where} must be a non-empty list of token ids")
            bad = [t for t in p if not _is_int(t) or not 0 <= t < vocab_size]
            if bad:
                raise ProtocolError(f"{where} holds {bad[0]!r}, not a token id in [0, {vocab_size})")
    else:
        batched = isinstance(text, list)
        texts = text if batched else [text]
        if batched and not texts:
            raise ProtocolError("text is an empty list")
        if not all(isinstance(t, str) for t in texts):
            raise ProtocolError("text must be a string or a list of strings")
        prompts = [tokenizer(t)["input_ids"] for t in texts]
        for i, p in enumerate(prompts):
            if not p:
                raise ProtocolError(f"text[{i}] tokenizes to nothing" if batched else "text tokenizes to nothing")
    n = len(prompts)

    raw_params = body.get("sampling_params")
    if batched and isinstance(raw_params, list):
        if len(raw_params) != n:
            raise ProtocolError(f"sampling_params is a list of {len(raw_params)} entries for {n} prompts")
        params = [parse_sampling_params(p, f"sampling_params[{i}]", vocab_size) for i, p in enumerate(raw_params)]
    else:
        # Parsed once per prompt so that no two requests share (and mutate) one object.
        params = [parse_sampling_params(raw_params, vocab_size=vocab_size) for _ in range(n)]

    rids = _per_item(body, "rid", n, batched, None)
    want_lp = _per_item(body, "return_logprob", n, batched, False)
    starts = _per_item(body, "logprob_start_len", n, batched, -1)
    want_text = _per_item(body, "return_text_in_logprobs", n, batched, False)
    top_nums = _per_item(body, "top_logprobs_num", n, batched, 0)
    id_lists = _token_ids_logprob(body.get("token_ids_logprob"), n, batched, vocab_size)

    requests = []
    for i in range(n):
        sfx = f"[{i}]" if batched else ""
        prompt = [int(t) for t in prompts[i]]
        check_context(len(prompt), _explicit_max_new_tokens(raw_params, i), context_len)
        start = _integer(f"logprob_start_len{sfx}", starts[i] if starts[i] is not None else -1, low=-1)
        if start == -1:
            start = len(prompt) - 1
        if start >= len(prompt):
            raise ProtocolError(f"logprob_start_len{sfx}={start} must be < the prompt length {len(prompt)}")
        top_num = _integer(f"top_logprobs_num{sfx}", top_nums[i] if top_nums[i] is not None else 0, low=0)
        if top_num > vocab_size:
            raise ProtocolError(f"top_logprobs_num{sfx}={top_num} exceeds the vocabulary size {vocab_size}")
        rid = rids[i] if rids[i] is not None else uuid.uuid4().hex
        if not isinstance(rid, str):
            raise ProtocolError(f"rid{sfx} must be a string")
        requests.append(GenerateRequest(
            rid=rid, input_ids=prompt, sampling=params[i],
            return_logprob=_boolean(f"return_logprob{sfx}", False if want_lp[i] is None else want_lp[i]),
            logprob_start_len=start,
            return_text_in_logprobs=_boolean(f"return_text_in_logprobs{sfx}", want_text[i] or False),
            top_logprobs_num=top_num, token_ids_logprob=id_lists[i],
        ))
    return requests, batched
