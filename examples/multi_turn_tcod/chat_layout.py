"""The token layout of a multi-turn trajectory, shared by the agent loop and expert SFT data.

One trajectory is one ``Sample``::

    prompt   = chat_template([system?, user: first observation], add_generation_prompt=True)
    response = action_1 <|im_end|>  obs_1  action_2 <|im_end|>  obs_2 ... action_T <|im_end|>
    obs_t    = "\\n<|im_start|>user\\n{observation}<|im_end|>\\n<|im_start|>assistant\\n"

Actions (with their stop token) are trainable, observations are not. Every piece is tokenized on its
own (``add_special_tokens=False``) and appended, so earlier turns are never re-tokenized: the ids the
student sampled are the ids the teacher scores. ``obs_t`` starts with "\\n" because the template ends
every message with ``<|im_end|>\\n`` and the student stops at ``<|im_end|>``. A tokenizer without ChatML's
``<|im_end|>`` gets a clear error.
"""

from __future__ import annotations

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def action_stop_token_id(tokenizer) -> int:
    """The id that ends a student turn (``<|im_end|>``): a stop token for the engine and the turn's last id."""
    token_id = tokenizer.convert_tokens_to_ids(IM_END)
    if token_id is None or token_id == getattr(tokenizer, "unk_token_id", None):
        raise ValueError(f"the tokenizer has no {IM_END!r} token: the multi-turn layout needs a ChatML chat template")
    return int(token_id)


def prompt_messages(first_observation: str, system: str | None = None) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": first_observation})
    return messages


def encode_prompt(tokenizer, first_observation: str, system: str | None = None) -> list[int]:
    """Prompt ids: the chat template on the first observation, ending with the assistant header."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the tokenizer has no chat_template; the multi-turn layout applies it to the first observation"
        )
    text = tokenizer.apply_chat_template(
        prompt_messages(first_observation, system), tokenize=False, add_generation_prompt=True
    )
    return _ids(tokenizer, text)


def observation_text(observation: str) -> str:
    """The non-trainable text between two student turns."""
    return f"\n{IM_START}user\n{observation}{IM_END}\n{IM_START}assistant\n"


def encode_observation(tokenizer, observation: str) -> list[int]:
    return _ids(tokenizer, observation_text(observation))


def encode_action(tokenizer, action: str) -> list[int]:
    """Ids of one student turn as the student would emit it: the action text, then ``<|im_end|>``."""
    return _ids(tokenizer, action) + [action_stop_token_id(tokenizer)]


def decode_action(tokenizer, token_ids) -> str:
    """The action text of one generated turn: stop token dropped, surrounding whitespace stripped."""
    stop = action_stop_token_id(tokenizer)
    ids = list(token_ids)
    if stop in ids:
        ids = ids[: ids.index(stop)]
    return tokenizer.decode(ids, skip_special_tokens=True).strip()
