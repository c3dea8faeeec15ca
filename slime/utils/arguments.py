"""Command-line arguments with slime's flag names, grouped as slime groups them, and one validation step.

``parse_args(add_custom_arguments=None)`` keeps slime's entry point: a plugin may pass a function that
adds its own flags to the parser. Validation happens once, after parsing, in :func:`validate_args`;
every rejection raises :class:`ArgumentError` whose message names the flag(s) and says what to do.
Defaults leave plain behaviour unchanged: no OPD, no TCOD, a fixed reward-side KL coefficient.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# Split out (with their validation); importable from here as before.
from slime.arguments.algorithm_arguments import (  # noqa: F401
    ESTIMATORS,
    add_algorithm_arguments,
    add_kl_controller_arguments,
    add_on_policy_distillation_arguments,
    add_optimizer_arguments,
    validate_kl_args,
    validate_opd_args,
)
from slime.arguments.argument_error import ArgumentError, fail as _fail
from slime.arguments.cli_parser import LaunchParser
from slime.arguments.custom_config import apply_custom_config
from slime.arguments.megatron_arguments import add_megatron_arguments, validate_megatron_args
from slime.arguments.multi_turn_arguments import add_multi_turn_arguments, add_tcod_group, validate_multi_turn_tcod_args
from slime.arguments.ranges import validate_finite, validate_ranges
from slime.arguments.unsupported_flags import PARTIAL_ROLLOUT, one_line, refused_flags
# The two names upstream's arguments.py gets from port.py, importable from here as there.
from slime.utils.tcod_arguments import add_tcod_arguments, validate_tcod_args  # noqa: F401

# Positions per LM-head chunk: a few [chunk, vocab] float32 buffers (~0.6 MB per position each at Qwen3's
# 151,936 tokens), large enough that each chunk is one efficient matmul on a GPU.
DEFAULT_LOG_PROBS_CHUNK_SIZE = 256


def needs_reference(args) -> bool:
    """Whether the trainer loads a reference model: some KL term to it is on."""
    return args.kl_coef > 0 or args.use_kl_loss or getattr(args, "kl_ctrl", "fixed") == "adaptive"


# ---------------------------------------------------------------------------- groups
def add_cluster_arguments(parser):
    g = parser.add_argument_group("cluster")
    g.add_argument("--actor-num-nodes", type=int, default=1,
                   help="nodes of trainer processes: this x --actor-num-gpus-per-node processes in all")
    g.add_argument("--actor-num-gpus-per-node", type=int, default=1,
                   help="trainer processes per node (on CPU: number of processes)")
    g.add_argument("--rollout-num-gpus", type=int, default=None, help="total devices for rollout engines")
    g.add_argument("--rollout-num-gpus-per-engine", type=int, default=1,
                   help="devices per rollout engine (SGLang --tp-size); engines started: --rollout-num-gpus / this")
    g.add_argument("--num-gpus-per-node", type=int, default=8,
                   help="devices per node; only checked: --actor-num-gpus-per-node and "
                        "--rollout-num-gpus-per-engine may not exceed it")
    g.add_argument("--colocate", action="store_true",
                   help="upstream: trainer and engines share devices; refused here (not implemented: they always "
                        "get disjoint devices)")
    g.add_argument("--ray-address", type=str, default=None,
                   help="join an existing Ray cluster (default: RAY_ADDRESS or a local instance)")
    g.add_argument("--train-backend", choices=("fsdp", "megatron"), default="fsdp",
                   help="trainer: fsdp (FSDP2 over the HF model) or megatron (Megatron-core GPT, tensor "
                        "parallel; docs/en/megatron_backend.md)")
    g.add_argument("--rollout-backend", choices=("hf_engine", "sglang"), default="hf_engine",
                   help="engine servers to start: the project's CPU server or real SGLang")
    g.add_argument("--sglang-python", type=str, default=None,
                   help="Python interpreter that runs the SGLang servers (--rollout-backend sglang), e.g. the one "
                        "`python -m slime.backends.sglang_utils.sglang_env` builds: SGLang pins its own torch and "
                        "transformers (default: this interpreter)")
    g.add_argument("--sglang-router-ip", type=str, default=None,
                   help="an existing slime / SGLang router: rollouts go through it, weights go to the workers it "
                        "lists (GET /workers), and no engines are started here")
    g.add_argument("--sglang-router-port", type=int, default=None, help="port of the --sglang-router-ip router")
    g.add_argument("--sglang-mem-fraction-static", type=float, default=None,
                   help="passed to started SGLang engines as --mem-fraction-static (--rollout-backend sglang; "
                        "unset: SGLang's own default)")
    g.add_argument("--sglang-disable-radix-cache", action="store_true",
                   help="engines prefill every request from scratch (no prefix / radix cache)")
    g.add_argument("--sglang-enable-deterministic-inference", action="store_true",
                   help="started engines get --enable-deterministic-inference: a request's result does not depend "
                        "on what it is batched with, so reruns repeat (slower)")
    g.add_argument("--engine-host", type=str, default="127.0.0.1", help="bind address of started engines")
    g.add_argument("--seed", type=int, default=1234,
                   help="passed to started engines as --random-seed; seeds the megatron trainer's model-parallel "
                        "RNG (per-request sampling seeds come from --rollout-seed)")
    g.add_argument("--dry-run", action="store_true", help="parse, validate, print the plan, start nothing")
    return parser


def add_checkpoint_arguments(parser):
    g = parser.add_argument_group("checkpoint")
    g.add_argument("--hf-checkpoint", type=str, default=None, help="HF folder of the policy (and tokenizer)")
    g.add_argument("--load", type=str, default=None, help="checkpoint folder to resume from")
    g.add_argument("--save", type=str, default=None,
                   help="checkpoint folder (iter_XXXXXXX/ per save); also holds weight_sync/ for the engines "
                        "and, unless --metrics-dir is set, metrics.jsonl")
    g.add_argument("--save-interval", type=int, default=None,
                   help="checkpoint every N rollout steps and after the last one (unset: no checkpoints)")
    g.add_argument("--ref-load", type=str, default=None,
                   help="reference model (default: --hf-checkpoint): a HF folder, or with --train-backend megatron "
                        "also a Megatron checkpoint root (docs/en/megatron_backend.md, Load paths)")
    g.add_argument("--ref-ckpt-step", type=int, default=None,
                   help="iteration of a Megatron --ref-load root to load (default: the one its "
                        "latest_checkpointed_iteration.txt names)")
    g.add_argument("--critic-load", type=str, default=None,
                   help="--advantage-estimator ppo: HF folder the critic (value model) starts from "
                        "(default: --hf-checkpoint)")
    return parser


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON ({err})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def add_data_arguments(parser):
    g = parser.add_argument_group("data")
    g.add_argument("--prompt-data", type=str, default=None, help="jsonl or parquet file of prompts")
    g.add_argument("--input-key", type=str, default="input",
                   help="field of each data row holding the prompt: a string or a list of {role, content} messages")
    g.add_argument("--label-key", type=str, default=None,
                   help="field holding the label (sample.label, e.g. for --rm-type); unset: no label")
    g.add_argument("--metadata-key", type=str, default="metadata",
                   help="field holding a JSON object kept as sample.metadata (missing: empty)")
    g.add_argument("--apply-chat-template", action="store_true",
                   help="render each prompt with the tokenizer's chat template (a string becomes one user message)")
    g.add_argument("--apply-chat-template-kwargs", type=_json_object, default={},
                   help="JSON object of keyword arguments for every chat-template render, in the agent loop too "
                        "(e.g. '{\"enable_thinking\": false}': Qwen3 without thinking); default {}")
    g.add_argument("--rollout-shuffle", action="store_true",
                   help="shuffle --prompt-data every epoch (seeded by --rollout-seed and the epoch)")
    g.add_argument("--eval-prompt-data", type=str, nargs="*", default=None,
                   help="name path [name path ...] of evaluation sets")
    g.add_argument("--eval-interval", type=int, default=None,
                   help="evaluate every N rollout steps, after the last one and, on a fresh start, before training "
                        "(step -1, unless --skip-eval-before-train); unset: never")
    g.add_argument("--n-samples-per-eval-prompt", type=int, default=1, help="samples generated per evaluation prompt")
    g.add_argument("--eval-temperature", type=float, default=None,
                   help="sampling temperature for evaluation (default: --rollout-temperature)")
    g.add_argument("--eval-max-response-len", type=int, default=None,
                   help="response budget of an evaluation sample, a whole trajectory in the multi-turn agent loop "
                        "(default: --rollout-max-response-len)")
    g.add_argument("--eval-max-context-len", type=int, default=None,
                   help="prompt + response tokens an evaluation sequence may reach, as --rollout-max-context-len for "
                        "rollouts (unset: lowered to the rollout engines' context once they are up)")
    g.add_argument("--skip-eval-before-train", action="store_true",
                   help="no evaluation at step -1 (e.g. an SFT run from a random init)")
    return parser


def add_rollout_arguments(parser):
    g = parser.add_argument_group("rollout")
    g.add_argument("--rollout-batch-size", type=int, default=8, help="prompts per rollout step")
    g.add_argument("--n-samples-per-prompt", type=int, default=1,
                   help="samples per prompt: one group, for grpo, gspo and reinforce_plus_plus_baseline")
    g.add_argument("--rollout-max-response-len", type=int, default=256,
                   help="token budget of one sample's response; in multi-turn rollouts the whole trajectory's "
                        "budget, observations included (one turn is also capped by --max-turn-response-len)")
    g.add_argument("--rollout-max-context-len", type=int, default=None,
                   help="prompt + response tokens a sequence may reach; passed to started engines as "
                        "--context-length (unset: the engine's own context)")
    g.add_argument("--rollout-temperature", type=float, default=1.0, help="sampling temperature of rollouts (> 0)")
    g.add_argument("--rollout-top-p", type=float, default=1.0, help="nucleus sampling: top-p in (0, 1]")
    g.add_argument("--rollout-top-k", type=int, default=-1, help="top-k sampling (-1: off)")
    g.add_argument("--rollout-stop", type=str, nargs="*", default=None,
                   help="stop strings sent with every generation request")
    g.add_argument("--rollout-stop-token-ids", type=int, nargs="*", default=None,
                   help="stop token ids sent with every generation request (the agent loop adds its action stop)")
    g.add_argument("--rollout-seed", type=int, default=42,
                   help="base of the per-request sampling seeds (with the sample index: a resumed run regenerates "
                        "the same rollouts) and of --rollout-shuffle")
    g.add_argument("--num-rollout", type=int, default=None, help="number of rollout/train steps")
    g.add_argument("--global-batch-size", type=int, default=None, help="samples per optimizer step")
    g.add_argument("--micro-batch-size", type=int, default=1,
                   help="samples per training micro-batch on each rank (without --use-dynamic-batch-size); losses "
                        "are normalised over the whole optimizer step, so it changes memory, not the update")
    g.add_argument("--num-steps-per-rollout", type=int, default=None,
                   help="optimizer steps per rollout, its samples split evenly among them (default: "
                        "--rollout-batch-size x --n-samples-per-prompt / --global-batch-size)")
    g.add_argument("--custom-generate-function-path", type=str, default=None,
                   help="async generate(args, sample, sampling_params, evaluation=False) run per sample instead of "
                        "the single-turn one (default with --max-turns or --use-tcod: the multi-turn agent loop)")
    g.add_argument("--rollout-function-path", type=str, default="slime.rollout.sglang_rollout.generate_rollout",
                   help="generate_rollout(args, rollout_id, data_source, evaluation=False) -> groups of samples")
    g.add_argument("--rollout-concurrency", type=int, default=64, help="samples generated at once")
    g.add_argument("--partial-rollout", action="store_true",
                   help="upstream's partial rollout (aborted samples resume in a later step); refused here before "
                        "Ray: not implemented, and the multi-turn agent loop cannot resume an episode")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="run code shipped with the checkpoint: passed to SGLang servers and to the agent "
                        "loop's HF tokenizer loader (off: such checkpoints fail to load instead)")
    return parser


def add_reward_arguments(parser):
    g = parser.add_argument_group("reward")
    g.add_argument("--rm-type", type=str, default=None,
                   help="built-in task reward rule; this runtime has exact_match (response == label), kept in "
                        "metadata['task_reward'] (unset: no rule)")
    g.add_argument("--rm-url", type=str, default=None,
                   help="reward server URL; here the teacher server's /generate for --opd-type sglang (and "
                        "--tcod-prefix-source teacher)")
    g.add_argument("--custom-rm-path", type=str, default=None,
                   help="async reward_func(args, sample) for samples without a reward (default with --opd-type "
                        "sglang: slime.rollout.on_policy_distillation.reward_func)")
    g.add_argument("--custom-reward-post-process-path", type=str, default=None,
                   help="post_process_rewards(args, samples) -> (raw, rewards) over every training sample (default "
                        "with --opd-type sglang: slime.rollout.on_policy_distillation.post_process_rewards)")
    g.add_argument("--allow-no-reward", action="store_true",
                   help="train although nothing supplies a reward (no --use-opd, reward model or environment): reward 0")
    g.add_argument("--reward-key", type=str, default=None,
                   help="when sample.reward is a dict: the key of the scalar to train on")
    return parser


def add_performance_arguments(parser):
    """Trainer memory: slime's / Megatron's names where they exist (see docs/en/fsdp_backend.md)."""
    g = parser.add_argument_group("performance")
    g.add_argument("--log-probs-chunk-size", type=int, default=DEFAULT_LOG_PROBS_CHUNK_SIZE,
                   help="positions per LM-head chunk when taking log-probs, entropies and OPD KLs, so no "
                        "[sequence, vocab] float32 logits are held (<= 0: whole rows at once, the old path)")
    g.add_argument("--gradient-checkpointing", action="store_true",
                   help="recompute every decoder layer in backward instead of keeping its activations")
    g.add_argument("--recompute-granularity", choices=("full", "selective"), default=None,
                   help="Megatron's name: 'full' turns on --gradient-checkpointing (neither backend implements "
                        "selective recompute)")
    g.add_argument("--recompute-method", choices=("uniform", "block"), default=None,
                   help="accepted for upstream's scripts; no effect in this runtime: both backends recompute each "
                        "layer on its own (uniform, 1 layer; block is refused)")
    g.add_argument("--recompute-num-layers", type=int, default=None,
                   help="accepted for upstream's scripts; no effect in this runtime (only 1; see --recompute-method)")
    g.add_argument("--use-dynamic-batch-size", action="store_true",
                   help="pack micro-batches by tokens (--max-tokens-per-gpu) instead of --micro-batch-size samples")
    g.add_argument("--max-tokens-per-gpu", type=int, default=None,
                   help="padded tokens per training micro-batch with --use-dynamic-batch-size")
    g.add_argument("--log-probs-max-tokens-per-gpu", type=int, default=None,
                   help="the same for the no-grad log-prob pass (default: --max-tokens-per-gpu)")
    g.add_argument("--gpu-memory-gb", type=float, default=80.0,
                   help="device memory the --dry-run memory plan checks the estimate against")
    g.add_argument("--model-config-json", type=str, default=None,
                   help="HF config.json for the --dry-run memory plan when --hf-checkpoint is not on this machine")
    return parser


def add_logging_arguments(parser):
    g = parser.add_argument_group("logging")
    g.add_argument("--metrics-dir", type=str, default=None,
                   help="where metrics.jsonl goes (default: --save, else a new folder outputs/run-DATE-TIME, "
                        "named at start); a folder that holds another run's rows is refused unless --load resumes it")
    g.add_argument("--use-tensorboard", action="store_true",
                   help="also log every step's metrics to TensorBoard (tensorboard/ in the --metrics-dir folder)")
    g.add_argument("--use-wandb", action="store_true", help="also log every step's metrics to Weights & Biases")
    g.add_argument("--wandb-project", type=str, default=None, help="W&B project (unset: slime-tcod)")
    g.add_argument("--wandb-group", type=str, default=None, help="W&B run group")
    g.add_argument("--save-debug-rollout-data", type=str, default=None,
                   help="path template with {rollout_id}: save each training rollout's samples (torch.save of "
                        "Sample.to_dict()s, upstream's layout) for offline study")
    return parser


GROUPS = (
    add_cluster_arguments,
    add_checkpoint_arguments,
    add_data_arguments,
    add_rollout_arguments,
    add_reward_arguments,
    add_algorithm_arguments,
    add_optimizer_arguments,
    add_performance_arguments,
    add_megatron_arguments,
    add_on_policy_distillation_arguments,
    add_multi_turn_arguments,
    add_tcod_group,
    add_kl_controller_arguments,
    add_logging_arguments,
)


def get_parser(add_custom_arguments=None) -> argparse.ArgumentParser:
    # Every flag's default shows once in --help; errors are one line; no abbreviated flags (as upstream).
    parser = LaunchParser(description="slime: on-policy distillation of multi-turn agents")
    for add in GROUPS:
        add(parser)
    if add_custom_arguments is not None:
        # Upstream's contract: the hook returns the parser (a hook that forgets to keeps the old one).
        parser = add_custom_arguments(parser) or parser
    return parser


def parse_args(add_custom_arguments=None, argv=None):
    """Parse (``argv`` or ``sys.argv``) and validate; exits with the validation message on bad input."""
    parser = get_parser(add_custom_arguments)
    args = parser.parse_args(argv)
    try:
        # The YAML first, with the parser: its keys take their flags' types; overrides are named.
        for line in apply_custom_config(args, parser, sys.argv[1:] if argv is None else argv):
            print(f"{parser.prog}: warning: {line}", file=sys.stderr)
        validate_args(args)
    except ArgumentError as err:
        # One line naming the flag and the fix; argparse's usage block would bury it.
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    return args


# ---------------------------------------------------------------------------- validation
def _validate_batching(args):
    for name in ("rollout_batch_size", "n_samples_per_prompt", "rollout_max_response_len", "micro_batch_size"):
        if getattr(args, name) < 1:
            _fail(f"--{name.replace('_', '-')} must be >= 1")
    per_rollout = args.rollout_batch_size * args.n_samples_per_prompt
    if args.global_batch_size is None:
        args.global_batch_size = per_rollout
    if args.global_batch_size < 1 or per_rollout % args.global_batch_size:
        _fail(f"--global-batch-size ({args.global_batch_size}) must divide --rollout-batch-size x "
              f"--n-samples-per-prompt ({per_rollout})")
    if args.num_steps_per_rollout is None:
        args.num_steps_per_rollout = per_rollout // args.global_batch_size
    if args.eval_temperature is None:
        args.eval_temperature = args.rollout_temperature
    if args.eval_temperature < 0:
        _fail("--eval-temperature must be >= 0")
    if not 0 < args.rollout_top_p <= 1:
        _fail("--rollout-top-p must lie in (0, 1]")
    if args.eval_prompt_data is not None and len(args.eval_prompt_data) % 2:
        _fail("--eval-prompt-data takes pairs: NAME PATH [NAME PATH ...]")


def _validate_memory(args):
    if args.recompute_granularity == "selective":
        _fail("--recompute-granularity selective is not implemented: both trainers (fsdp, megatron) recompute "
              "whole layers: use --recompute-granularity full (or --gradient-checkpointing)")
    if args.recompute_granularity == "full":
        args.gradient_checkpointing = True
    if (args.recompute_method or args.recompute_num_layers is not None) and not args.gradient_checkpointing:
        _fail("--recompute-method / --recompute-num-layers need --recompute-granularity full")
    if args.recompute_method == "block" or args.recompute_num_layers not in (None, 1):
        _fail("both trainers (fsdp, megatron) recompute every layer on its own: use --recompute-method uniform "
              "--recompute-num-layers 1 (or leave both out)")
    for name in ("max_tokens_per_gpu", "log_probs_max_tokens_per_gpu"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            _fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.use_dynamic_batch_size:
        if args.max_tokens_per_gpu is None:
            _fail("--use-dynamic-batch-size needs --max-tokens-per-gpu N (padded tokens per micro-batch)")
        if args.log_probs_max_tokens_per_gpu is None:
            args.log_probs_max_tokens_per_gpu = args.max_tokens_per_gpu
    elif args.max_tokens_per_gpu is not None or args.log_probs_max_tokens_per_gpu is not None:
        _fail("--max-tokens-per-gpu / --log-probs-max-tokens-per-gpu take effect only with "
              "--use-dynamic-batch-size: add it, or drop them to batch by --micro-batch-size")
    if args.gpu_memory_gb <= 0:
        _fail(f"--gpu-memory-gb must be > 0, got {args.gpu_memory_gb}")
    if args.model_config_json is not None and not os.path.isfile(args.model_config_json):
        _fail(f"--model-config-json {args.model_config_json!r} is not a file")


def validate_args(args):
    """Check cross-flag rules and fill derived defaults in place. Raises ArgumentError."""
    refused = refused_flags(args)
    if len(refused) > 1:  # all in one line (a single one gets its own refusal below)
        _fail(one_line(refused))
    if args.partial_rollout:  # refused here, before Ray, not by the agent loop's assert once rolling out
        _fail(f"--partial-rollout is not implemented by this runtime ({PARTIAL_ROLLOUT}): drop --partial-rollout")
    validate_finite(args)
    if args.rollout_temperature <= 0:
        _fail("--rollout-temperature must be > 0 (on-policy training needs a sampling distribution)")
    if args.actor_num_nodes < 1 or args.actor_num_gpus_per_node < 1:
        _fail("--actor-num-nodes and --actor-num-gpus-per-node must be >= 1")
    if args.save_interval is not None and args.save_interval < 1:
        _fail("--save-interval must be >= 1")
    if args.eps_clip_c is not None and args.eps_clip_c <= 1:
        _fail("--eps-clip-c (dual clip) must be > 1")
    if args.eps_clip_high is None:
        args.eps_clip_high = args.eps_clip
    if args.ref_load is None:
        args.ref_load = args.hf_checkpoint
    validate_ranges(args)
    _validate_batching(args)
    _validate_memory(args)
    validate_megatron_args(args)
    validate_opd_args(args)
    validate_multi_turn_tcod_args(args)
    validate_kl_args(args)
    return args
