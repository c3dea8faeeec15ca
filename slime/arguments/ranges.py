"""Signs, ranges and finiteness of the numeric flags, checked first by ``validate_args``.

Split from ``slime/utils/arguments.py``: these rules are generic over the flag values (counts at least 1,
probabilities in range, AdamW's own limits), where the rest of ``validate_args`` relates flags to each other.
"""

from __future__ import annotations

import math

from slime.arguments.argument_error import fail as _fail


def validate_finite(args):
    """Every float flag must be a finite number: ``nan <= 0`` is False, so range checks alone let NaN through.

    Generic over the namespace (custom flags included). No flag takes infinity as a meaning: a limit is
    switched off with 0 or by leaving the flag out, never with ``inf``.
    """
    for name, value in vars(args).items():
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if isinstance(item, float) and not math.isfinite(item):
                _fail(f"--{name.replace('_', '-')} must be a finite number, got {item}")


# Integer flags that count something: at least 1 (optional ones only when set).
_AT_LEAST_ONE = ("n_samples_per_eval_prompt", "rollout_concurrency", "rollout_num_gpus_per_engine",
                 "num_gpus_per_node")
_AT_LEAST_ONE_IF_SET = ("eval_interval", "rollout_num_gpus", "num_steps_per_rollout", "rollout_max_context_len",
                        "eval_max_context_len", "eval_max_response_len", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                        "num_query_groups", "kv_channels", "vocab_size", "make_vocab_size_divisible_by",
                        "max_position_embeddings", "seq_length")


def _evaluation_only(args) -> bool:
    """``--num-rollout 0`` with evaluation sets: evaluate the checkpoint at step -1 and train nothing."""
    return bool(args.eval_prompt_data) and bool(args.eval_interval) and not args.skip_eval_before_train


def validate_ranges(args):
    """Signs and ranges that would otherwise fail late (in the trainer) or silently do nothing."""
    for name in _AT_LEAST_ONE:
        if getattr(args, name) < 1:
            _fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in _AT_LEAST_ONE_IF_SET:
        if getattr(args, name) is not None and getattr(args, name) < 1:
            _fail(f"--{name.replace('_', '-')} must be >= 1 when set, got {getattr(args, name)}")
    if args.num_rollout is not None and (args.num_rollout < 0 or (args.num_rollout == 0 and not _evaluation_only(args))):
        _fail(f"--num-rollout must be >= 1 (got {args.num_rollout}); 0 is accepted only for an evaluation-only run "
              "(--eval-prompt-data and --eval-interval, without --skip-eval-before-train)")
    for name in ("eps_clip", "eps_clip_high", "value_clip"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            _fail(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    # torch.optim.AdamW's own rules, checked here instead of after Ray and the engines have started.
    for name in ("lr", "critic_lr", "weight_decay", "adam_eps"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            _fail(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0 <= getattr(args, name) < 1:
            _fail(f"--{name.replace('_', '-')} must lie in [0, 1), got {getattr(args, name)}")
    for name in ("gamma", "lambd"):
        if not 0 <= getattr(args, name) <= 1:
            _fail(f"--{name} must lie in [0, 1], got {getattr(args, name)}")
    if args.sglang_mem_fraction_static is not None and not 0 < args.sglang_mem_fraction_static <= 1:
        _fail("--sglang-mem-fraction-static must lie in (0, 1]")
