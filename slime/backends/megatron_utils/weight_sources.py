"""Where the Megatron backend's weights come from: a HF folder or a Megatron checkpoint root.

``--hf-checkpoint`` is a HF folder. ``--ref-load`` and ``--opd-teacher-load`` may also name a Megatron
checkpoint root (``latest_checkpointed_iteration.txt`` + ``iter_XXXXXXX/``, ``load_paths``): either one
this project saved (the iteration's ``model/hf`` is a HF folder) or one upstream slime users convert
with Megatron's torch_dist format (read by ``torch_dist_reader`` without unpickling code). A torch_dist
checkpoint carries no ``config.json``; like upstream, its model has the policy's architecture.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from slime.backends.megatron_utils import hf_weights
from slime.backends.megatron_utils.load_paths import is_hf_folder, resolve_load
from slime.backends.megatron_utils.model import GPTShape


@dataclass
class WeightSource:
    """A resolved load path: its HF folder (None for torch_dist) and the config its model is built from."""

    flag: str
    hf_folder: str | None
    torch_dist_folder: str | None
    config: dict

    def full_state(self, shape: GPTShape) -> dict[str, torch.Tensor]:
        """Full Megatron state (tensor-parallel 1 names, unpadded vocabulary)."""
        if self.hf_folder is not None:
            from slime.backends.fsdp_utils.checkpoint import _read_weights

            return hf_weights.hf_to_megatron(_read_weights(self.hf_folder), shape)
        from slime.backends.megatron_utils.torch_dist_reader import read_model_state

        state = hf_weights.from_te_names(read_model_state(self.torch_dist_folder, shape.num_layers))
        # Stored vocabularies are padded (Megatron's --make-vocab-size-divisible-by); rows past the HF
        # vocabulary never score a token.
        return {k: (v[: shape.vocab_size] if hf_weights.is_vocab_parallel(k) else v).float() for k, v in state.items()}


def read_config(folder: str) -> dict:
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as handle:
        return json.load(handle)


def resolve(path: str, flag: str, policy_config: dict, ckpt_step: int | None = None) -> WeightSource:
    source = resolve_load(path, flag, ckpt_step)
    if source.kind == "hf":
        return WeightSource(flag, source.folder, None, read_config(source.folder))
    for candidate in (os.path.join(source.folder, "model", "hf"), os.path.join(source.folder, "hf")):
        if is_hf_folder(candidate):
            return WeightSource(flag, candidate, None, read_config(candidate))
    from slime.backends.megatron_utils.torch_dist_reader import is_torch_dist

    if is_torch_dist(source.folder):
        return WeightSource(flag, None, source.folder, policy_config)
    raise FileNotFoundError(f"{flag} {path!r}: iteration folder {source.folder!r} holds neither model/hf (a "
                            "checkpoint of this project) nor a Megatron torch_dist checkpoint (metadata.json, "
                            "*.distcp)")
