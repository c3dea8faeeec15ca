"""The unit of data that flows from rollout to trainer: one prompt and (for agents) one whole trajectory.

Field names follow slime's ``slime.utils.types.Sample`` so plugins written for slime work here.
Invariants kept by :meth:`Sample.append_response_tokens` and checked by :meth:`Sample.validate`:

* ``tokens`` is prompt + response; the response is the last ``response_length`` tokens;
* ``loss_mask`` has one 0/1 entry per response token (1 = trained on);
* ``rollout_log_probs`` (when present) has one entry per response token; non-trainable tokens get 0.0;
* ``teacher_log_probs`` (when present) has one entry per response token.
"""

from __future__ import annotations

import base64
import copy
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

import torch


def _int_list(values) -> list[int]:
    if values is None:
        return []
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [int(v) for v in values]


def _float_list(values) -> list[float] | None:
    if values is None:
        return None
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [float(v) for v in values]


@dataclass
class Sample:
    """One rollout sample (a single-turn answer or a whole multi-turn trajectory)."""

    class Status(str, Enum):
        # Nested, as in upstream slime: plugins write ``Sample.Status.COMPLETED``.
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    teacher_log_probs: list[float] | None = None
    # MoE routing replay: (len(tokens) - 1, num_layers, moe_router_topk) expert ids from the rollout engine.
    rollout_routed_experts: list | None = None
    # Upstream slime's way to keep a sample out of the loss: its loss mask is zeroed before training.
    remove_sample: bool = False
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    # As in slime: sent as X-SMG-Routing-Key under --router-policy consistent_hashing (None here: one router).
    session_id: str | None = None

    # ------------------------------------------------------------------ derived views
    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def effective_response_length(self) -> int:
        """Tokens that are trained on (slime's name)."""
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    def get_reward_value(self, args=None) -> float:
        key = getattr(args, "reward_key", None) if args is not None else None
        if isinstance(self.reward, dict):
            if not key:
                raise ValueError("sample.reward is a dict; set --reward-key to choose the scalar to train on")
            return float(self.reward[key])
        return float(self.reward if self.reward is not None else 0.0)

    # ------------------------------------------------------------------ growth
    def append_response_tokens(
        self,
        args=None,
        *,
        tokens=None,
        log_probs=None,
        trainable: bool = True,
        meta_info: dict | None = None,
        text: str | None = None,
        update_terminal_info: bool = True,
    ) -> None:
        """Append response-side tokens and keep ``loss_mask`` and log-probs aligned with them.

        Student (model-sampled) tokens pass ``trainable=True`` and their sampling log-probs.
        Environment observations and replayed turns pass ``trainable=False`` and no log-probs;
        they get loss-mask 0 and a 0.0 placeholder log-prob.
        """
        tokens = _int_list(tokens)
        log_probs = _float_list(log_probs)
        if log_probs is not None and len(log_probs) != len(tokens):
            raise ValueError(f"append_response_tokens: {len(log_probs)} log_probs for {len(tokens)} tokens")
        if tokens and trainable and log_probs is None:
            raise ValueError("append_response_tokens: trainable tokens need their rollout log_probs")
        if tokens and not trainable and log_probs is not None:
            raise ValueError("append_response_tokens: non-trainable tokens must not pass log_probs")

        previous = self.response_length
        if self.loss_mask is None:
            # A response that existed before masking started was trained on as a whole.
            self.loss_mask = [1] * previous
        if self.rollout_log_probs is None and (trainable and tokens):
            # Earlier tokens without log-probs were non-trainable placeholders.
            self.rollout_log_probs = [0.0] * previous

        self.tokens.extend(tokens)
        self.response_length += len(tokens)
        self.loss_mask.extend([1 if trainable else 0] * len(tokens))
        if self.rollout_log_probs is not None:
            self.rollout_log_probs.extend(log_probs if log_probs is not None else [0.0] * len(tokens))
        if text:
            self.response += text

        if meta_info is not None and meta_info.get("routed_experts") is not None:
            self._apply_routed_experts(args, meta_info)
        if update_terminal_info and meta_info is not None:
            finish = (meta_info.get("finish_reason") or {}).get("type")
            if finish == "length":
                self.status = Sample.Status.TRUNCATED
            elif finish == "abort":
                self.status = Sample.Status.ABORTED
            elif finish == "stop":
                self.status = Sample.Status.COMPLETED

    def _apply_routed_experts(self, args, meta_info: dict) -> None:
        """Keep SGLang's routed experts: rows ``[routed_experts_start_len, len(tokens) - 1)`` of the sequence.

        SGLang sends them base64-encoded int32 (or as a list); a row count that does not match the tokens
        is an error, as upstream slime's ``Sample`` treats it.
        """
        value = meta_info["routed_experts"]
        if isinstance(value, str):
            value = torch.frombuffer(bytearray(base64.b64decode(value)), dtype=torch.int32)
        flat = torch.as_tensor(value, dtype=torch.int32).reshape(-1)
        if args is None:
            raise ValueError("append_response_tokens: args (num_layers, moe_router_topk) decode routed experts")
        start = int(meta_info.get("routed_experts_start_len", 0) or 0)
        rows, width = max(0, len(self.tokens) - 1 - start), args.num_layers * args.moe_router_topk
        if flat.numel() != rows * width:
            raise ValueError(
                f"routed_experts has {flat.numel()} ids; {len(self.tokens)} tokens from start {start} need "
                f"{rows} rows x {args.num_layers} layers x {args.moe_router_topk} experts"
            )
        kept = (self.rollout_routed_experts or [])[:start]
        if len(kept) < start:
            raise ValueError(f"routed_experts_start_len={start} but only {len(kept)} rows are kept")
        self.rollout_routed_experts = kept + flat.reshape(rows, args.num_layers, args.moe_router_topk).tolist()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise ValueError naming the field that breaks the layout invariants."""
        if self.response_length < 0 or self.response_length > len(self.tokens):
            raise ValueError(
                f"sample {self.index}: response_length={self.response_length} but only {len(self.tokens)} tokens"
            )
        for name in ("loss_mask", "rollout_log_probs", "teacher_log_probs"):
            value = getattr(self, name)
            if value is not None and len(value) != self.response_length:
                raise ValueError(
                    f"sample {self.index}: len({name})={len(value)} != response_length={self.response_length}"
                )
        if self.loss_mask is not None and any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError(f"sample {self.index}: loss_mask must hold only 0 and 1")

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)}
        out["status"] = self.status.value
        return out

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "Sample":
        data = dict(data)
        known = {f.name for f in fields(Sample)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"Sample.from_dict: unknown field(s) {unknown}")
        if "status" in data:
            data["status"] = Sample.Status(data["status"])
        return Sample(**data)


# Runtime shorthand for ``Sample.Status``. Upstream slime has no module-level ``Status``, so files of the
# slime contribution (see docs/en/developer_guide/architecture.md) must write ``Sample.Status``.
Status = Sample.Status
