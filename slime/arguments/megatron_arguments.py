"""Upstream slime's Megatron flags (model shape, parallel sizes, numerics, optimizer) and their validation.

Split from ``slime/utils/arguments.py``, which adds this group to the parser and calls :func:`validate_megatron_args`
from ``validate_args``. Flags are spelled and stored as Megatron-LM does; docs/en/megatron_backend.md
says what each does here and which values are refused.
"""

from __future__ import annotations

import warnings

from slime.arguments.argument_error import fail
from slime.arguments.megatron_shape import tp_divisibility_error


# What the runtime does with a flag it accepts only so that upstream's launch scripts run unchanged.
_NO_EFFECT = "accepted for upstream's scripts; no effect in this runtime"
# Upstream's MODEL_ARGS value flags: (flag, help), in upstream's order.
_CONFIG = "checked against the --hf-checkpoint config.json"
_SHAPE_FLAGS = (
    ("--num-layers", f"decoder layers; {_CONFIG} (num_hidden_layers)"),
    ("--hidden-size", f"{_CONFIG} (hidden_size)"),
    ("--ffn-hidden-size", f"MLP width; {_CONFIG} (intermediate_size)"),
    ("--num-attention-heads", f"{_CONFIG} (num_attention_heads)"),
    ("--num-query-groups", f"key/value heads, with --group-query-attention; {_CONFIG} (num_key_value_heads)"),
    ("--kv-channels", f"head dimension; {_CONFIG} (head_dim)"),
    ("--vocab-size", f"unpadded vocabulary; {_CONFIG} (vocab_size)"),
    ("--make-vocab-size-divisible-by", f"{_NO_EFFECT}: the megatron trainer pads the vocabulary to a multiple "
                                       "of the TP size only"),
    ("--max-position-embeddings", f"{_CONFIG} (max_position_embeddings)"),
    ("--seq-length", f"{_NO_EFFECT}: sequence lengths come from the rollouts"),
)


def add_megatron_arguments(parser):
    """Upstream slime's Megatron flags, spelled and stored (``dest``) as Megatron-LM does.

    Model-shape flags describe the model as upstream's ``scripts/models/*.sh`` do; the trainers build the
    model from the ``--hf-checkpoint`` config and start-up checks that the flags agree with it
    (``slime/arguments/megatron_shape.py``). Value flags default to None ("not given"); see
    docs/en/megatron_backend.md for what each flag does here and which values are refused.
    """
    g = parser.add_argument_group(
        "megatron", "Model-shape flags describe the model as upstream's scripts do; the trainers build it from the "
                    "--hf-checkpoint config.json, and start-up checks that the flags given agree with it.")
    # Model shape (upstream's MODEL_ARGS).
    for flag, what in _SHAPE_FLAGS:
        g.add_argument(flag, type=int, default=None, help=what)
    g.add_argument("--group-query-attention", action="store_true",
                   help="use --num-query-groups (Megatron's rule: without this switch every head is its own group)")
    g.add_argument("--use-rotary-position-embeddings", action="store_true",
                   help="Megatron's legacy switch for --position-embedding-type rope")
    g.add_argument("--position-embedding-type", choices=("learned_absolute", "rope", "mrope", "relative", "none"),
                   default=None, help=f"{_CONFIG}: must be rope for its rotary models")
    g.add_argument("--disable-bias-linear", dest="add_bias_linear", action="store_false",
                   help="no biases in the linear layers: sets args.add_bias_linear (default: %(default)s) to "
                        "False, as Megatron stores it")
    g.add_argument("--add-qkv-bias", action="store_true", help="biases on the q/k/v projections only (Qwen2)")
    g.add_argument("--normalization", choices=("LayerNorm", "RMSNorm"), default=None,
                   help=f"{_CONFIG} (RMSNorm when it has rms_norm_eps)")
    g.add_argument("--norm-epsilon", type=float, default=None, help=f"{_CONFIG} (rms_norm_eps)")
    g.add_argument("--rotary-base", type=int, default=None, help="RoPE theta")
    g.add_argument("--rotary-percent", type=float, default=None, help="share of each head's dimensions rotated")
    g.add_argument("--use-rope-scaling", action="store_true", help="Llama 3.1's RoPE frequency scaling")
    g.add_argument("--rotary-scaling-factor", type=float, default=None, help="its factor (Llama 3.1: 8, 3.2: 32)")
    g.add_argument("--qk-layernorm", action="store_true", help="RMSNorm on each head's q and k (Qwen3)")
    g.add_argument("--swiglu", action="store_true", help="gated SiLU MLP")
    g.add_argument("--untie-embeddings-and-output-weights", action="store_true",
                   help="separate input embeddings and output layer")
    g.add_argument("--num-experts", type=int, default=None,
                   help="accepted to say no: mixture-of-experts models are not supported")
    # Parallelism.
    g.add_argument("--tensor-model-parallel-size", type=int, default=1,
                   help="--train-backend megatron: processes that split each layer (must divide the trainer's)")
    for flag in ("--pipeline-model-parallel-size", "--context-parallel-size", "--expert-model-parallel-size",
                 "--expert-tensor-parallel-size"):
        g.add_argument(flag, type=int, default=1, help="only 1 (not supported by this project's trainers yet)")
    g.add_argument("--sequence-parallel", action="store_true",
                   help="split the sequence of the non-tensor-parallel regions over the TP ranks (needs TP > 1)")
    g.add_argument("--use-distributed-optimizer", action="store_true",
                   help=f"{_NO_EFFECT} (not implemented: every data-parallel rank keeps the AdamW moments of its "
                        "shard; fsdp shards them anyway)")
    # Numerics and optimizer (upstream's MISC_ARGS / OPTIMIZER_ARGS).
    g.add_argument("--attention-dropout", type=float, default=0.0, help="must be 0: log-probs must be deterministic")
    g.add_argument("--hidden-dropout", type=float, default=0.0, help="must be 0: log-probs must be deterministic")
    g.add_argument("--accumulate-allreduce-grads-in-fp32", action="store_true",
                   help=f"{_NO_EFFECT}: both trainers keep and reduce gradients in float32")
    g.add_argument("--attention-softmax-in-fp32", action="store_true",
                   help=f"{_NO_EFFECT}: the megatron trainer's model always sets it")
    g.add_argument("--attention-backend", choices=("flash", "fused", "unfused", "local", "auto"), default="auto",
                   help=f"{_NO_EFFECT}: megatron uses Transformer Engine's attention when installed, else "
                        "Megatron's local one; fsdp runs transformers' sdpa")
    g.add_argument("--bf16", action="store_true",
                   help=f"{_NO_EFFECT}: both trainers compute in bfloat16 on GPUs (float32 weights), float32 on CPU")
    g.add_argument("--optimizer", choices=("adam", "sgd"), default="adam",
                   help="adam (AdamW: decoupled --weight-decay); sgd is refused")
    g.add_argument("--lr-decay-style", choices=("constant", "linear", "cosine", "inverse-square-root", "WSD"),
                   default="constant", help="only constant is implemented")
    # Megatron-LM's spelling (the hyphenated alias is for docs and shells that mind the underscore).
    g.add_argument("--override-opt_param-scheduler", "--override-opt-param-scheduler", action="store_true",
                   dest="override_opt_param_scheduler",
                   help="--load: this run's --lr, --weight-decay and Adam settings replace the checkpoint's")
    g.add_argument("--use-checkpoint-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler",
                   action="store_true", dest="use_checkpoint_opt_param_scheduler",
                   help="--load: keep the checkpoint's learning rate and optimizer settings, ignoring this run's")
    g.add_argument("--balance-data", action="store_true",
                   help="upstream: balance FLOPs across data-parallel ranks; refused (not implemented)")
    return parser


_UNSUPPORTED_PARALLEL = ("pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size",
                         "expert_tensor_parallel_size")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _validate_parallel(args):
    for name in ("tensor_model_parallel_size",) + _UNSUPPORTED_PARALLEL:
        if getattr(args, name) < 1:
            fail(f"{_flag(name)} must be >= 1, got {getattr(args, name)}")
    for name in _UNSUPPORTED_PARALLEL:
        if getattr(args, name) > 1:
            fail(f"{_flag(name)} {getattr(args, name)}: not supported by this trainer yet (use 1; of Megatron's "
                  "parallelisms only --tensor-model-parallel-size is, with --train-backend megatron)")
    tp = args.tensor_model_parallel_size
    if args.train_backend == "fsdp":
        if tp > 1 or args.sequence_parallel:
            given = f"--tensor-model-parallel-size {tp}" if tp > 1 else "--sequence-parallel"
            fail(f"{given} needs --train-backend megatron (the fsdp backend shards whole layers over all its "
                  "processes instead)")
        return
    world = args.actor_num_nodes * args.actor_num_gpus_per_node
    if world % tp:
        fail(f"--tensor-model-parallel-size {tp} must divide the {world} trainer processes "
              "(--actor-num-nodes x --actor-num-gpus-per-node)")
    if args.advantage_estimator == "ppo" and args.loss_type != "sft_loss":
        fail("--advantage-estimator ppo trains a critic, which --train-backend megatron does not have yet: use "
              "--train-backend fsdp, or a critic-free estimator (grpo, gspo, reinforce_plus_plus, reinforce_plus_plus_baseline)")
    if args.sequence_parallel and tp == 1:
        # Megatron-LM's rule: sequence parallelism needs tensor parallelism, so it is switched off with a warning.
        warnings.warn("--sequence-parallel with --tensor-model-parallel-size 1: disabled (it splits the sequence "
                      "over tensor-parallel ranks, and there is only one)", stacklevel=4)
        args.sequence_parallel = False


def _validate_model(args):
    """Upstream's model-shape and numerics flags, without reading any file (preflight compares the shape
    with the checkpoint's config.json)."""
    for name in ("attention_dropout", "hidden_dropout"):
        if getattr(args, name) != 0:
            fail(f"{_flag(name)} {getattr(args, name)}: dropout must be 0 here: the old-policy, reference and "
                  "training passes must give the same log-probs for the same tokens")
    if args.num_experts:
        fail(f"--num-experts {args.num_experts}: mixture-of-experts models are not supported by this project's "
              "trainers")
    if args.optimizer != "adam":
        fail(f"--optimizer {args.optimizer}: only adam (AdamW) is implemented")
    if args.lr_decay_style != "constant":
        fail(f"--lr-decay-style {args.lr_decay_style}: only constant is implemented (the learning rate stays --lr)")
    if args.override_opt_param_scheduler and args.use_checkpoint_opt_param_scheduler:
        fail("--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler contradict each other "
             "(Megatron-LM refuses both too): keep one")
    if args.balance_data:
        fail("--balance-data is not implemented: each rank trains a contiguous slice of every step "
              "(slime/backends/fsdp_utils/data_plan.py); drop it")
    if args.use_rotary_position_embeddings:
        if args.position_embedding_type not in (None, "rope"):
            fail(f"--use-rotary-position-embeddings contradicts --position-embedding-type "
                  f"{args.position_embedding_type}: keep one")
        args.position_embedding_type = "rope"  # Megatron-LM's legacy rule
    if args.group_query_attention and args.num_query_groups is None:
        args.num_query_groups = 1  # Megatron-LM's default for --num-query-groups
    elif not args.group_query_attention:
        if args.num_query_groups is not None and args.num_query_groups != args.num_attention_heads:
            warnings.warn(f"--num-query-groups {args.num_query_groups} has no effect without "
                          "--group-query-attention (Megatron's rule: every attention head is its own group)",
                          stacklevel=4)
        args.num_query_groups = args.num_attention_heads
    for name in ("norm_epsilon", "rotary_base", "rotary_scaling_factor"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            fail(f"{_flag(name)} must be > 0, got {getattr(args, name)}")
    if args.rotary_percent is not None and not 0 < args.rotary_percent <= 1:
        fail(f"--rotary-percent must lie in (0, 1], got {args.rotary_percent}")
    error = tp_divisibility_error(args.tensor_model_parallel_size, args.num_attention_heads, args.num_query_groups,
                                  "(--num-attention-heads, --num-query-groups)")
    if error:
        fail(error)
    for step in ("ref_ckpt_step", "opd_teacher_ckpt_step"):
        if getattr(args, step) is not None and getattr(args, step) < 0:
            fail(f"{_flag(step)} must be >= 0, got {getattr(args, step)}")
    if args.opd_teacher_ckpt_step is not None and args.opd_teacher_load is None:
        fail("--opd-teacher-ckpt-step needs --opd-teacher-load (a Megatron checkpoint root)")


def validate_megatron_args(args):
    """Parallel layout and model-shape flags, without reading any file (preflight compares the shape with
    the checkpoint's config.json). Raises ArgumentError."""
    _validate_parallel(args)
    _validate_model(args)
