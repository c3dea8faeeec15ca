"""Upstream's Megatron model-shape flags (``scripts/models/*.sh``) checked against a HF ``config.json``.

The trainers build the model from the ``--hf-checkpoint`` config; the flags, when a script passes them,
must describe the same model. Pure functions over ``args`` and the config dict, used by the start-up
checks (``slime.launch.preflight``), the ``--dry-run`` plan and the trainer alike.

Flags are read as Megatron reads them: a value flag (``--hidden-size``) is compared when given; a switch
(``--swiglu``, ``--qk-layernorm``, ``--disable-bias-linear`` ...) is compared whenever any shape flag is
given, because without it Megatron builds the model without that feature. Qwen2, Qwen3 and Llama configs
are covered (transformers 4 and 5 layouts: ``rope_theta`` at the top or in ``rope_parameters``).
"""

from __future__ import annotations

import math

# Value flags: (attribute, flag). Defaults are None, so "given" is "not None".
VALUE_FLAGS = (
    ("num_layers", "--num-layers"), ("hidden_size", "--hidden-size"), ("ffn_hidden_size", "--ffn-hidden-size"),
    ("num_attention_heads", "--num-attention-heads"), ("num_query_groups", "--num-query-groups"),
    ("kv_channels", "--kv-channels"), ("vocab_size", "--vocab-size"),
    ("max_position_embeddings", "--max-position-embeddings"), ("normalization", "--normalization"),
    ("norm_epsilon", "--norm-epsilon"), ("rotary_base", "--rotary-base"), ("rotary_percent", "--rotary-percent"),
    ("rotary_scaling_factor", "--rotary-scaling-factor"), ("position_embedding_type", "--position-embedding-type"),
)
# Switches: (attribute, flag, value when not given).
SWITCHES = (
    ("group_query_attention", "--group-query-attention", False),
    ("use_rotary_position_embeddings", "--use-rotary-position-embeddings", False),
    ("add_bias_linear", "--disable-bias-linear", True),
    ("add_qkv_bias", "--add-qkv-bias", False), ("qk_layernorm", "--qk-layernorm", False),
    ("swiglu", "--swiglu", False),
    ("untie_embeddings_and_output_weights", "--untie-embeddings-and-output-weights", False),
    ("use_rope_scaling", "--use-rope-scaling", False),
)
FAMILIES = ("qwen2", "qwen3", "llama")


def shape_flags_given(args) -> list[str]:
    """The shape flags a run passed, as spelled on the command line."""
    given = [flag for name, flag in VALUE_FLAGS if getattr(args, name, None) is not None]
    return given + [flag for name, flag, default in SWITCHES if getattr(args, name, default) != default]


def _rope(config: dict) -> tuple[float | None, str, float | None]:
    """(theta, scaling type, scaling factor) from either transformers layout."""
    merged = {**(config.get("rope_parameters") or {}), **(config.get("rope_scaling") or {})}
    theta = config.get("rope_theta", merged.get("rope_theta"))
    kind = merged.get("rope_type", merged.get("type")) or "default"
    return theta, kind, merged.get("factor")


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    return a == b


def _show(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def shape_mismatches(args, config: dict, source: str = "config.json") -> list[str]:
    """One message per shape flag that disagrees with ``config`` (a HF config dict); [] when none is given.

    ``source`` names the config in the messages, e.g. ``--hf-checkpoint /models/Qwen3-8B/config.json``.
    """
    if not shape_flags_given(args):
        return []
    config = config.get("text_config") or config
    heads = config.get("num_attention_heads")
    theta, rope_kind, rope_factor = _rope(config)
    # attribute -> (config key as named in the message, its value); a missing key is not compared.
    values = {"num_layers": ("num_hidden_layers", config.get("num_hidden_layers")),
              "hidden_size": ("hidden_size", config.get("hidden_size")),
              "ffn_hidden_size": ("intermediate_size", config.get("intermediate_size")),
              "num_attention_heads": ("num_attention_heads", heads),
              "vocab_size": ("vocab_size", config.get("vocab_size")),
              "max_position_embeddings": ("max_position_embeddings", config.get("max_position_embeddings")),
              "norm_epsilon": ("rms_norm_eps", config.get("rms_norm_eps")),
              "rotary_base": ("rope_theta", theta),
              "rotary_percent": ("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)),
              "rotary_scaling_factor": ("rope scaling factor", rope_factor if rope_kind == "llama3" else "none")}
    if config.get("head_dim"):
        values["kv_channels"] = ("head_dim", config["head_dim"])
    elif heads and config.get("hidden_size"):
        values["kv_channels"] = ("hidden_size / num_attention_heads", config["hidden_size"] // heads)
    if "rms_norm_eps" in config:
        values["normalization"] = ("rms_norm_eps (an RMSNorm model)", "RMSNorm")
    out = []
    for name, flag in VALUE_FLAGS:
        mine, (key, theirs) = getattr(args, name, None), values.get(name, (None, None))
        if mine is not None and theirs is not None and not _same(mine, theirs):
            out.append(f"{flag} {mine} but {source} has {key} {_show(theirs)}")
    out += _switch_mismatches(args, config, source, rotary=theta is not None, rope_kind=rope_kind)
    return out


def _switch_mismatches(args, config: dict, source: str, *, rotary: bool, rope_kind: str) -> list[str]:
    family = config.get("model_type")
    heads = config.get("num_attention_heads")
    out = []
    kv_heads = config.get("num_key_value_heads") or heads
    if args.group_query_attention:
        groups, label = args.num_query_groups, f"--num-query-groups {args.num_query_groups}"
    else:
        groups = args.num_attention_heads or heads
        label = f"--group-query-attention not given (one query group per head: {groups})"
    if groups is not None and kv_heads is not None and groups != kv_heads:
        out.append(f"{label} but {source} has num_key_value_heads {kv_heads}")
    position = args.position_embedding_type or ("rope" if args.use_rotary_position_embeddings else "learned_absolute")
    if position != "rope" and (rotary or family in FAMILIES):
        out.append(f"position embeddings {position} (add --use-rotary-position-embeddings) but {source} is a "
                   "rotary-embedding model (rope_theta)")
    # (attribute, flag, wanted by the config, config key as named in the message, its value)
    wanted = [("swiglu", "--swiglu", config.get("hidden_act", "silu") == "silu", "hidden_act",
               config.get("hidden_act", "silu")),
              ("add_bias_linear", "--disable-bias-linear", not config.get("mlp_bias", False),
               *(("mlp_bias", config["mlp_bias"]) if "mlp_bias" in config
                 else ("model_type", f"{family} (no biases in its MLP and output projections)")))]
    if "tie_word_embeddings" in config:
        wanted.append(("untie_embeddings_and_output_weights", "--untie-embeddings-and-output-weights",
                       not config["tie_word_embeddings"], "tie_word_embeddings", config["tie_word_embeddings"]))
    wanted.append(("use_rope_scaling", "--use-rope-scaling", rope_kind == "llama3", "rope scaling type", rope_kind))
    if family in FAMILIES:
        qkv_bias = config.get("attention_bias", family == "qwen2")
        wanted += [("qk_layernorm", "--qk-layernorm", family == "qwen3", "model_type", family),
                   ("add_qkv_bias", "--add-qkv-bias", qkv_bias,
                    "attention_bias" if "attention_bias" in config else "model_type",
                    config.get("attention_bias", family))]
    for name, flag, want, key, value in wanted:
        # --disable-bias-linear stores add_bias_linear = False (Megatron's dest).
        given = getattr(args, name) if name != "add_bias_linear" else not args.add_bias_linear
        if given != want:
            out.append(f"{flag} {'given' if given else 'not given'} but {source} has {key} {_show(value)}")
    return out


def tp_divisibility_error(tp: int, heads: int | None, groups: int | None, where: str) -> str | None:
    """The message when ``--tensor-model-parallel-size`` does not divide the heads and query groups."""
    if heads is None:
        return None
    groups = groups or heads
    if heads % tp == 0 and groups % tp == 0:
        return None
    return (f"--tensor-model-parallel-size {tp} must divide both the attention heads ({heads}) and the query "
            f"groups ({groups}) {where}")
