"""Weights between Hugging Face (Qwen2 / Qwen3 / Llama) and Megatron-core ``GPTModel``, and TP shards.

Three forms of the same weights:

* **HF**: ``model.layers.{i}.self_attn.q_proj.weight`` ... as ``save_pretrained`` writes them;
* **full Megatron**: the state dict of a tensor-parallel-1 ``GPTModel`` with the local layer spec
  (``decoder.layers.{i}.self_attention.linear_qkv.weight`` ...), unpadded vocabulary. This is the
  exchange form: checkpoints, upstream torch_dist readers and the HF export all pass through it;
* **local**: this process's tensor-parallel shard, the keys of its own model's ``state_dict``.

Facts of the layout (Megatron's): ``linear_qkv`` holds, for each query group in turn, that group's query
heads, then its key head, then its value head; ``linear_fc1`` is ``cat(gate_proj, up_proj)``. Under
tensor parallelism column-parallel weights (qkv, fc1, embedding, output layer) split their rows, with
fc1 splitting gate and up separately; row-parallel weights (attention output, fc2) split their columns;
norms are replicated.
"""

from __future__ import annotations

import torch

from slime.backends.megatron_utils.model import GPTShape

_LAYER = "decoder.layers.{i}."
# HF suffix -> Megatron suffix for the one-to-one tensors of a decoder layer.
_DIRECT = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
    "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
}
# Transformer Engine's spec fuses the pre-attention / pre-MLP norms into the following linear layer.
_TE_NAMES = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
             "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}


def _take(state: dict, key: str) -> torch.Tensor:
    if key not in state:
        raise KeyError(f"checkpoint has no {key!r}")
    return state[key]


def _qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: GPTShape) -> torch.Tensor:
    groups, d = shape.num_query_groups, shape.head_dim
    tail = q.shape[1:]
    per_group = [q.reshape(groups, -1, *tail), k.reshape(groups, d, *tail), v.reshape(groups, d, *tail)]
    return torch.cat(per_group, dim=1).reshape(-1, *tail)


def _split_qkv(qkv: torch.Tensor, shape: GPTShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups, d = shape.num_query_groups, shape.head_dim
    q_rows = shape.num_heads // groups * d
    tail = qkv.shape[1:]
    q, k, v = qkv.reshape(groups, q_rows + 2 * d, *tail).split([q_rows, d, d], dim=1)
    return q.reshape(-1, *tail), k.reshape(-1, *tail), v.reshape(-1, *tail)


def hf_to_megatron(hf: dict[str, torch.Tensor], shape: GPTShape) -> dict[str, torch.Tensor]:
    """Full Megatron state from a HF state dict (keys as in ``model.safetensors``)."""
    out = {"embedding.word_embeddings.weight": _take(hf, "model.embed_tokens.weight"),
           "decoder.final_layernorm.weight": _take(hf, "model.norm.weight")}
    if not shape.tied:
        out["output_layer.weight"] = _take(hf, "lm_head.weight")
    for i in range(shape.num_layers):
        src, dst = f"model.layers.{i}.", _LAYER.format(i=i)
        for hf_name, mg_name in _DIRECT.items():
            if "_norm." in hf_name and not shape.qk_layernorm:
                continue
            out[dst + mg_name] = _take(hf, src + hf_name)
        attn = src + "self_attn."
        out[dst + "self_attention.linear_qkv.weight"] = _qkv(
            *(_take(hf, f"{attn}{p}_proj.weight") for p in "qkv"), shape)
        if shape.qkv_bias:
            out[dst + "self_attention.linear_qkv.bias"] = _qkv(
                *(_take(hf, f"{attn}{p}_proj.bias") for p in "qkv"), shape)
        out[dst + "mlp.linear_fc1.weight"] = torch.cat([_take(hf, src + "mlp.gate_proj.weight"),
                                                        _take(hf, src + "mlp.up_proj.weight")])
    return out


def megatron_to_hf(full: dict[str, torch.Tensor], shape: GPTShape) -> dict[str, torch.Tensor]:
    """HF state dict from a full Megatron state (the inverse of :func:`hf_to_megatron`)."""
    out = {"model.embed_tokens.weight": _take(full, "embedding.word_embeddings.weight"),
           "model.norm.weight": _take(full, "decoder.final_layernorm.weight")}
    if not shape.tied:
        out["lm_head.weight"] = _take(full, "output_layer.weight")
    for i in range(shape.num_layers):
        src, dst = _LAYER.format(i=i), f"model.layers.{i}."
        for hf_name, mg_name in _DIRECT.items():
            if "_norm." in hf_name and not shape.qk_layernorm:
                continue
            out[dst + hf_name] = _take(full, src + mg_name)
        for suffix in ("weight", "bias") if shape.qkv_bias else ("weight",):
            q, k, v = _split_qkv(_take(full, f"{src}self_attention.linear_qkv.{suffix}"), shape)
            for name, tensor in zip("qkv", (q, k, v)):
                out[f"{dst}self_attn.{name}_proj.{suffix}"] = tensor
        gate, up = _take(full, src + "mlp.linear_fc1.weight").chunk(2)
        out[dst + "mlp.gate_proj.weight"], out[dst + "mlp.up_proj.weight"] = gate, up
    return {k: v.contiguous() for k, v in out.items()}


def from_te_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Transformer Engine spec names -> local spec names (norms fused into linear layers come out)."""
    out = {}
    for key, value in state.items():
        for local, te in _TE_NAMES.items():
            if key.endswith(te):
                key = key[: -len(te)] + local
        out[key] = value
    return out


def to_te_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state.items():
        for local, te in _TE_NAMES.items():
            if key.endswith(local) and key.startswith("decoder.layers."):
                key = key[: -len(local)] + te
        out[key] = value
    return out


# ---------------------------------------------------------------------------- tensor-parallel shards
def _rule(key: str) -> str:
    """How a full tensor is split across tensor-parallel ranks."""
    if key in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return "vocab"
    if key.endswith("linear_fc1.weight"):
        return "glu"
    if key.endswith(("linear_qkv.weight", "linear_qkv.bias")):
        return "rows"
    if key.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return "cols"
    return "replicated"


def is_vocab_parallel(key: str) -> bool:
    return _rule(key) == "vocab"


def is_tensor_parallel(key: str) -> bool:
    """Whether each tensor-parallel rank holds a different part of this parameter."""
    return _rule(key) != "replicated"


def grad_is_partial_over_tp(key: str, sequence_parallel: bool) -> bool:
    """Whether a replicated parameter's gradient on one tensor-parallel rank is only that rank's share.

    q/k norms are shared by all heads, and each rank runs only its own heads; with sequence parallelism
    every norm sees only its rank's part of the sequence. Megatron sums such gradients over the group.
    """
    if is_tensor_parallel(key):
        return False
    return sequence_parallel or key.endswith(("q_layernorm.weight", "k_layernorm.weight"))


def shard(full: dict[str, torch.Tensor], shape: GPTShape, tp_rank: int, tp_size: int) -> dict[str, torch.Tensor]:
    """The tensor-parallel rank's part of every full tensor (vocabulary padded with zero rows)."""
    out = {}
    for key, tensor in full.items():
        rule = _rule(key)
        if rule == "vocab":
            pad = shape.padded_vocab_size - tensor.shape[0]
            tensor = torch.cat([tensor, tensor.new_zeros(pad, *tensor.shape[1:])]) if pad else tensor
            out[key] = tensor.chunk(tp_size)[tp_rank]
        elif rule == "glu":
            out[key] = torch.cat([half.chunk(tp_size)[tp_rank] for half in tensor.chunk(2)])
        elif rule == "rows":
            out[key] = tensor.chunk(tp_size)[tp_rank]
        elif rule == "cols":
            out[key] = tensor.chunk(tp_size, dim=1)[tp_rank]
        else:
            out[key] = tensor
        out[key] = out[key].clone()
    return out


def unshard(parts: list[torch.Tensor], key: str, shape: GPTShape) -> torch.Tensor:
    """The full tensor from every tensor-parallel rank's part, in rank order (inverse of :func:`shard`)."""
    rule = _rule(key)
    if rule == "replicated":
        return parts[0]
    if rule == "cols":
        return torch.cat(parts, dim=1)
    if rule == "glu":
        halves = [p.chunk(2) for p in parts]
        return torch.cat([torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])])
    full = torch.cat(parts)
    return full[: shape.vocab_size] if rule == "vocab" else full


def local_state(model) -> dict[str, torch.Tensor]:
    """This process's parameters by local-spec name (Transformer Engine names mapped back)."""
    return from_te_names({k: v for k, v in model.state_dict(keep_vars=True).items()
                          if isinstance(v, torch.Tensor) and not k.endswith("_extra_state")})


def load_local(model, local: dict[str, torch.Tensor]) -> None:
    """Copy a local shard (local-spec names) into ``model``; every parameter must be covered exactly."""
    params = local_state(model)
    missing = sorted(set(params) - set(local))
    unexpected = sorted(set(local) - set(params))
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        for key, param in params.items():
            if tuple(param.shape) != tuple(local[key].shape):
                raise ValueError(f"{key}: checkpoint shape {tuple(local[key].shape)}, model {tuple(param.shape)}")
            param.copy_(local[key])


def gather_tensors(local: dict[str, torch.Tensor], shape: GPTShape, tp_group) -> dict[str, torch.Tensor]:
    """Full tensors, on CPU, from every tensor-parallel rank's ``local`` ones keyed by Megatron name (a
    collective over ``tp_group``). Works for anything laid out like the parameters: weights, AdamW moments."""
    import torch.distributed as dist

    tp_size = dist.get_world_size(tp_group) if tp_group is not None else 1
    out = {}
    for key, tensor in local.items():
        tensor = tensor.detach()
        parts = [tensor]
        if tp_size > 1 and _rule(key) != "replicated":
            parts = [torch.empty_like(tensor) for _ in range(tp_size)]
            dist.all_gather(parts, tensor.contiguous(), group=tp_group)
        out[key] = unshard([p.cpu() for p in parts], key, shape).clone()
    return out


def gather_full(model, shape: GPTShape, tp_group) -> dict[str, torch.Tensor]:
    """The model's full Megatron state on every rank of its tensor-parallel group (a collective)."""
    return gather_tensors(local_state(model), shape, tp_group)
