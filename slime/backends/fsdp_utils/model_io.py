"""Loading transformers models into FSDP2 and gathering / restoring full state dicts.

Every rank loads the whole HF checkpoint on CPU in float32 (the master copy the optimizer updates) and
``fully_shard`` then keeps only its shard, moved to the mesh's device. Each decoder layer is its own
FSDP unit so at most one layer is gathered at a time, then the root takes the embeddings and head.
On CUDA, parameters are cast to bfloat16 for compute and gradients are reduced in float32.
"""

from __future__ import annotations

import glob
import os

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def validate_hf_folder(path: str | None, flag: str) -> str:
    """Check that ``path`` is a HF model folder (config.json + safetensors weights); name the flag if not."""
    if not path:
        raise ValueError(f"{flag} is not set: it must name a HF model folder (config.json + *.safetensors)")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{flag} {path!r} is not a folder; on the fsdp backend it must be a HF model "
                                "folder with config.json and *.safetensors weights")
    missing = []
    if not os.path.isfile(os.path.join(path, "config.json")):
        missing.append("config.json")
    if not glob.glob(os.path.join(path, "*.safetensors")):
        missing.append("*.safetensors weights")
    if missing:
        raise FileNotFoundError(f"{flag} {path!r} is not a HF model folder: missing {' and '.join(missing)} "
                                "(save it with save_pretrained(..., safe_serialization=True))")
    return path


def device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def make_mesh(world_size: int):
    return init_device_mesh(device_type(), (world_size,))


def load_causal_lm(path: str, flag: str = "--hf-checkpoint"):
    from transformers import AutoModelForCausalLM

    validate_hf_folder(path, flag)
    # use_safetensors: never fall back to pickled .bin weights.
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, use_safetensors=True,
                                                attn_implementation="sdpa")


def decoder_layers(model) -> list[torch.nn.Module]:
    """The repeated transformer blocks of a HF model (``model.model.layers`` for Llama/Qwen families)."""
    base = getattr(model, model.base_model_prefix, model) if hasattr(model, "base_model_prefix") else model
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no decoder layers found at .{model.base_model_prefix}.layers")
    return list(layers)


def enable_activation_checkpointing(model) -> None:
    """Recompute every decoder layer in backward (``--gradient-checkpointing``); call before ``shard``.

    transformers checkpoints each layer's ``forward`` inside the module call, so FSDP2's hooks stay outside
    the checkpoint and the layer's parameters are gathered once for the recompute, not twice.
    """
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable({"use_reentrant": False})  # the non-reentrant form works with inputs that need no gradient


def shard(model: torch.nn.Module, mesh, layers: list[torch.nn.Module], *, frozen: bool = False) -> torch.nn.Module:
    """Wrap each decoder layer, then the root, with FSDP2.

    FSDP keeps a trained root's parameters (embeddings, final norm, LM head) gathered from forward to
    backward. A frozen model has no backward, so its root is resharded after each forward instead; left
    gathered it would hold a full copy of embeddings and head on every device between forwards.
    """
    from slime.backends.fsdp_utils.forward import attach_response_head

    kwargs = {"mesh": mesh}
    if mesh.device_type == "cuda":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs, **({"reshard_after_forward": True} if frozen else {}))
    attach_response_head(model)
    return model


def frozen(model: torch.nn.Module) -> torch.nn.Module:
    """A model that only scores (reference, teacher): eval mode, no gradients."""
    model.eval()
    model.requires_grad_(False)
    return model


def full_model_state(model) -> dict[str, torch.Tensor]:
    """Full (unsharded) state dict on CPU; a collective: every rank must call it. Rank 0 gets the tensors."""
    return get_model_state_dict(model, options=_FULL)


def full_optimizer_state(model, optimizer) -> dict:
    return get_optimizer_state_dict(model, optimizer, options=_FULL)


def load_full_model_state(model, state: dict[str, torch.Tensor]) -> None:
    """Every rank passes the same full state dict; each keeps its own shard."""
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=True))


def load_full_optimizer_state(model, optimizer, state: dict) -> None:
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
