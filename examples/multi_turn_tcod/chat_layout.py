"""The token layout of a multi-turn trajectory: the agent loop's, and that of any data built to match it.

One trajectory is one ``Sample``::

    prompt   = chat_template([user: first observation], add_generation_prompt=True)
    response = turn_1 <|im_end|>  obs_1  turn_2 <|im_end|>  obs_2 ... turn_T <|im_end|>
    obs_t    = "\\n" + chat_template([user: observation_t], add_generation_prompt=True)

Turns (with their stop token) are trainable, observations are not. Each piece is tokenized on its own
and appended, so earlier turns are never re-tokenized: the ids the student sampled are the ids the
teacher scores. With Qwen3 a turn is ``<think>...</think>\\n\\n`` then the action, and the reasoning stays
in the context of later turns. Every template render gets ``--apply-chat-template-kwargs`` (e.g.
``{"enable_thinking": false}``, which makes the template open every assistant turn with an empty think
block). ``obs_t`` starts with "\\n" because ChatML ends every message with ``<|im_end|>\\n`` and the
student stops at ``<|im_end|>``.
"""

IM_END = "<|im_end|>"
# Rendered before an observation and cut off again: the template's text for one user message alone.
_DUMMY = [{"role": "user", "content": "x"}]


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def turn_stop_id(tokenizer) -> int:
    """The id that ends a student turn (``<|im_end|>``): a stop token for the engine and the turn's last id."""
    token_id = tokenizer.convert_tokens_to_ids(IM_END)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise ValueError(f"the tokenizer has no {IM_END!r} token: the multi-turn layout needs a ChatML chat template")
    return token_id


def encode_prompt(tokenizer, prompt, chat_template_kwargs: dict | None = None) -> list[int]:
    """Prompt ids: the chat template on the first observation (text or messages), then the assistant header."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {})
    )
    return _ids(tokenizer, text)


def observation_text(tokenizer, message: dict, chat_template_kwargs: dict | None = None) -> str:
    """The non-trainable text between two student turns: ``message`` rendered by the chat template."""
    kwargs = chat_template_kwargs or {}
    full = tokenizer.apply_chat_template(_DUMMY + [message], tokenize=False, add_generation_prompt=True, **kwargs)
    head = tokenizer.apply_chat_template(_DUMMY, tokenize=False, add_generation_prompt=False, **kwargs)
    if not full.startswith(head):
        raise ValueError("the chat template renders a message differently once another follows it")
    return "\n" + full[len(head) :]


def encode_observation(tokenizer, message, chat_template_kwargs: dict | None = None) -> list[int]:
    if isinstance(message, str):
        message = {"role": "user", "content": message}
    return _ids(tokenizer, observation_text(tokenizer, message, chat_template_kwargs))


def encode_action(tokenizer, action: str) -> list[int]:
    """Ids of a replayed (expert) turn: the action text, then ``<|im_end|>``."""
    return _ids(tokenizer, action) + [turn_stop_id(tokenizer)]
