"""The value model for ``--advantage-estimator ppo``: the policy's backbone with a scalar head.

On disk a critic is a HF backbone folder (``save_pretrained``, loadable with ``AutoModel``) plus
``value_head.safetensors``. ``--critic-load`` may name such a folder or any HF causal-LM folder (the
policy checkpoint by default), whose backbone is taken and whose head starts at zero: a zero head
predicts value 0 everywhere, so the first advantages equal the discounted returns.
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import save_file

from slime.backends.fsdp_utils.model_io import validate_hf_folder
from slime.checkpoint.files import read_safetensors

VALUE_HEAD_FILE = "value_head.safetensors"


class ValueModel(torch.nn.Module):
    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone
        self.value_head = torch.nn.Linear(backbone.config.hidden_size, 1, dtype=torch.float32)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    @property
    def config(self):
        return self.backbone.config

    def forward(self, input_ids, attention_mask):
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        # The head runs in float32 so values keep their precision under bf16 compute. The result must not
        # be a view: FSDP2 hooks the root's output for backward, and a view invites in-place edits.
        return self.value_head(hidden.float()).squeeze(-1).clone()


def load_value_model(path: str, flag: str = "--critic-load") -> ValueModel:
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    validate_hf_folder(path, flag)
    # From a causal-LM folder the LM head is left out on purpose; silence transformers' report of it.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        backbone = AutoModel.from_pretrained(path, dtype=torch.float32, use_safetensors=True,
                                             attn_implementation="sdpa")
    finally:
        hf_logging.set_verbosity(verbosity)
    critic = ValueModel(backbone)
    head_file = os.path.join(path, VALUE_HEAD_FILE)
    if os.path.isfile(head_file):
        critic.value_head.load_state_dict(read_safetensors(head_file))
    return critic


def save_value_model(critic: ValueModel, full_state: dict[str, torch.Tensor], path: str) -> None:
    """Write a critic from its full state dict (keys ``backbone.*`` and ``value_head.*``); rank 0 only."""
    os.makedirs(path, exist_ok=True)
    backbone_state = {k[len("backbone."):]: v for k, v in full_state.items() if k.startswith("backbone.")}
    head_state = {k[len("value_head."):]: v.contiguous() for k, v in full_state.items()
                  if k.startswith("value_head.")}
    critic.backbone.save_pretrained(path, state_dict=backbone_state, safe_serialization=True)
    save_file(head_state, os.path.join(path, VALUE_HEAD_FILE))
