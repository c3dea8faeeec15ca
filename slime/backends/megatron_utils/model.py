"""Megatron-core ``GPTModel`` built from a Hugging Face config (Qwen2, Qwen3, Llama families).

``init_parallel`` sets Megatron's tensor / data parallel groups over the already-initialised
torch.distributed world (gloo on CPU, nccl on GPU) and seeds its RNG tracker. ``build_gpt`` maps a HF
``config.json`` onto a ``TransformerConfig`` and the GPTModel arguments; parameters are built in float32
(the master copy AdamW updates) and filled from a checkpoint afterwards (``hf_weights``), so Megatron's
own initialisation is skipped. On CPU the local (pure-PyTorch) layer spec is used with the patches in
``cpu_patches`` and PyTorch's fused attention (``sdpa_attention``); with CUDA and Transformer Engine
installed, Transformer Engine's spec.

The vocabulary is padded to a multiple of the tensor-parallel size only (not Megatron's 128 default):
padded rows never reach a log-prob, because the head leaves the rows past the HF vocabulary out
(``forward.output_head``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")


@dataclass(frozen=True)
class Layout:
    """Where this process sits: tensor-parallel rank/size and data-parallel rank/size."""

    tp_rank: int
    tp_size: int
    dp_rank: int
    dp_size: int


def init_parallel(tp_size: int, seed: int) -> Layout:
    """Megatron's model-parallel groups (TP ``tp_size``, PP 1) over the current torch.distributed world."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from slime.backends.megatron_utils import cpu_patches

    cpu_patches.apply()
    world = dist.get_world_size()
    if world % tp_size:
        raise ValueError(f"--tensor-model-parallel-size {tp_size} does not divide the {world} trainer processes")
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(tensor_model_parallel_size=tp_size, pipeline_model_parallel_size=1)
    # No dropout anywhere, so the inference tracker (no forked CUDA generators) is all that is needed.
    model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True)
    return Layout(ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size(),
                  ps.get_data_parallel_rank(), ps.get_data_parallel_world_size())


def _rope(config: dict) -> tuple[float, float | None]:
    """``(rope_theta, llama3 scaling factor or None)``; other RoPE scalings are refused."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    theta = config.get("rope_theta", params.get("rope_theta", 10000.0))
    kind = scaling.get("rope_type", scaling.get("type")) or params.get("rope_type", "default")
    if kind in (None, "default"):
        return float(theta), None
    if kind == "llama3":
        source = scaling or params
        # Megatron's llama3 scaling has these constants built in; another setting would differ silently.
        fixed = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
        for key, value in fixed.items():
            if key in source and float(source[key]) != value:
                raise ValueError(f"rope scaling {key}={source[key]} is not supported (Megatron fixes it at {value})")
        return float(theta), float(source.get("factor", 8.0))
    raise ValueError(f"rope scaling type {kind!r} is not supported by the megatron backend")


@dataclass(frozen=True)
class GPTShape:
    """What the weight conversion needs to know about a model, read from its HF config."""

    model_type: str
    vocab_size: int
    padded_vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_query_groups: int
    head_dim: int
    ffn_hidden_size: int
    qkv_bias: bool
    qk_layernorm: bool
    tied: bool

    @classmethod
    def from_config(cls, config: dict, tp_size: int = 1) -> "GPTShape":
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {model_type!r} is not supported by the megatron backend "
                             f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
        if config.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {config.get('hidden_act')!r}: the megatron backend maps SwiGLU (silu) MLPs only")
        heads = config["num_attention_heads"]
        groups = config.get("num_key_value_heads") or heads
        for name, value in (("num_attention_heads", heads), ("num_key_value_heads", groups)):
            if value % tp_size:
                raise ValueError(f"{name} {value} is not divisible by --tensor-model-parallel-size {tp_size}")
        vocab = config["vocab_size"]
        return cls(model_type=model_type, vocab_size=vocab, padded_vocab_size=-(-vocab // tp_size) * tp_size,
                   hidden_size=config["hidden_size"], num_layers=config["num_hidden_layers"], num_heads=heads,
                   num_query_groups=groups,
                   head_dim=config.get("head_dim") or config["hidden_size"] // heads,
                   ffn_hidden_size=config["intermediate_size"],
                   qkv_bias=bool(config.get("attention_bias", model_type == "qwen2")),
                   qk_layernorm=model_type == "qwen3",
                   tied=bool(config.get("tie_word_embeddings", False)))


def use_transformer_engine() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return False
    return True


def build_gpt(config: dict, args, tp_size: int):
    """A float32 ``GPTModel`` shaped like the HF ``config`` (weights uninitialised: load them next)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )
    from megatron.core.transformer.transformer_config import TransformerConfig

    shape = GPTShape.from_config(config, tp_size)
    theta, rope_factor = _rope(config)
    on_gpu = torch.cuda.is_available()
    sequence_parallel = bool(getattr(args, "sequence_parallel", False)) and tp_size > 1 and on_gpu
    transformer = TransformerConfig(
        num_layers=shape.num_layers, hidden_size=shape.hidden_size, ffn_hidden_size=shape.ffn_hidden_size,
        num_attention_heads=shape.num_heads, num_query_groups=shape.num_query_groups, kv_channels=shape.head_dim,
        normalization="RMSNorm", layernorm_epsilon=float(config.get("rms_norm_eps", 1e-6)),
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, add_qkv_bias=shape.qkv_bias,
        qk_layernorm=shape.qk_layernorm, hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=tp_size, sequence_parallel=sequence_parallel,
        params_dtype=torch.float32, use_cpu_initialization=not on_gpu, perform_initialization=False,
        attention_softmax_in_fp32=True, bf16=False,
        # --recompute-granularity full is applied by the trainer (forward.enable_recompute, the same on CPU
        # and GPU) rather than by Megatron's recompute, which saves and restores CUDA RNG states.
    )
    if use_transformer_engine():
        spec = get_gpt_layer_with_transformer_engine_spec(qk_layernorm=shape.qk_layernorm)
    else:
        from slime.backends.megatron_utils.sdpa_attention import SDPACoreAttention

        spec = get_gpt_layer_local_spec(qk_layernorm=shape.qk_layernorm, normalization="RMSNorm")
        spec.submodules.self_attention.submodules.core_attention = SDPACoreAttention
    model = GPTModel(transformer, spec, vocab_size=shape.padded_vocab_size,
                     max_sequence_length=int(config.get("max_position_embeddings", 4096)),
                     position_embedding_type="rope", rotary_base=int(theta),
                     rope_scaling=rope_factor is not None, rope_scaling_factor=rope_factor or 8.0,
                     share_embeddings_and_output_weights=shape.tied)
    if on_gpu:
        model = model.cuda()
    model.slime_shape = shape
    return model
