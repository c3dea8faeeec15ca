"""slime flags this runtime does not implement, each answered with what to use here instead, all in one line.

Two kinds: flags of slime's parser this one does not define (``ABSENT``: argparse would call them unknown and
suggest the closest spelling, e.g. ``--num-epoch``: "did you mean --num-experts?"), and flags it parses but
refuses (``refused_flags``). A command line carried over from slime often has several; each used to cost a
run of its own. ``LaunchParser`` lists every one at once when any absent flag is given, and ``validate_args``
does when two or more refused ones are (a single one keeps its own, longer, refusal).
"""

from __future__ import annotations

_DISJOINT = "drop it: the trainer and the rollout engines always get disjoint devices here"
_NOT_HERE = "not implemented here; drop it"
# Upstream resumes aborted samples in a later step; the example's agent loop asserts it off once rolling out.
PARTIAL_ROLLOUT = "an aborted sample is never resumed in a later step here, and an agent's episode cannot be"

# slime flag -> what this runtime does or takes instead.
ABSENT = {
    "--num-epoch": "use --num-rollout, the number of steps; one pass over the prompts takes their count / "
                   "--rollout-batch-size steps",
    "--start-rollout-id": "use --load: a resumed run starts after its checkpoint's step",
    "--save-hf": "drop it: every checkpoint holds the policy as a HF folder (iter_N/model/hf)",
    "--offload": _DISJOINT, "--offload-train": _DISJOINT, "--offload-rollout": _DISJOINT,
    "--update-weights-interval": "drop it: the engines get the new weights after every step",
    "--rollout-max-prompt-len": "use --rollout-max-context-len (prompt and response together)",
    "--eval-max-prompt-len": "use --eval-max-context-len (prompt and response together)",
    "--eval-top-p": "drop it: evaluation samples with --rollout-top-p (and --eval-temperature)",
    "--eval-top-k": "drop it: evaluation samples with --rollout-top-k (and --eval-temperature)",
    "--wandb-key": "use the WANDB_API_KEY environment variable (W&B flags here: --use-wandb, --wandb-project, "
                   "--wandb-group)",
    "--wandb-team": "W&B flags here: --use-wandb, --wandb-project, --wandb-group",
    "--wandb-mode": "use the WANDB_MODE environment variable",
    "--wandb-dir": "use the WANDB_DIR environment variable",
    "--tb-project-name": "use --use-tensorboard: it writes under the run's metrics folder",
    "--tb-experiment-name": "use --use-tensorboard: it writes under the run's metrics folder",
    "--use-fault-tolerance": "drop it: a stopped run resumes with --load",
    "--debug-rollout-only": _NOT_HERE, "--debug-train-only": _NOT_HERE,
    "--use-tis": _NOT_HERE, "--tis-clip": _NOT_HERE, "--tis-clip-low": _NOT_HERE,
    "--keep-old-actor": _NOT_HERE, "--ref-update-interval": _NOT_HERE,
    "--over-sampling-batch-size": _NOT_HERE, "--dynamic-sampling-filter-path": _NOT_HERE,
    "--custom-loss-function-path": _NOT_HERE, "--custom-advantage-function-path": _NOT_HERE,
    "--loss-mask-type": _NOT_HERE, "--use-routing-replay": _NOT_HERE, "--use-rollout-routing-replay": _NOT_HERE,
}


def absent_flags(words) -> list[str]:
    """``FLAG (what to use instead)`` for each word of ``words`` (unknown arguments) that is a slime flag here."""
    found = []
    for word in words:
        name = word.split("=", 1)[0]
        if name in ABSENT and not any(item.startswith(name + " ") for item in found):
            found.append(f"{name} ({ABSENT[name]})")
    return found


def refused_flags(args) -> list[str]:
    """``FLAG VALUE (what to use instead)`` for each flag this parser defines but the runtime refuses."""
    found = []

    def given(name, default=None):
        return getattr(args, name, default) not in (default, None)

    if getattr(args, "partial_rollout", False):
        found.append(f"--partial-rollout (drop it: not implemented; {PARTIAL_ROLLOUT})")
    if getattr(args, "colocate", False):
        found.append(f"--colocate ({_DISJOINT})")
    if getattr(args, "balance_data", False):
        found.append("--balance-data (drop it: each rank trains a contiguous slice of every step)")
    if getattr(args, "recompute_granularity", None) == "selective":
        found.append("--recompute-granularity selective (use full: the trainers recompute whole layers)")
    for name in ("pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size",
                 "expert_tensor_parallel_size"):
        if (getattr(args, name, 1) or 1) > 1:
            found.append(f"--{name.replace('_', '-')} {getattr(args, name)} (use 1: of Megatron's parallelisms "
                         "only --tensor-model-parallel-size is implemented)")
    if getattr(args, "num_experts", None):
        found.append(f"--num-experts {args.num_experts} (dense models only)")
    if given("optimizer", "adam"):
        found.append(f"--optimizer {args.optimizer} (use adam)")
    if given("lr_decay_style", "constant"):
        found.append(f"--lr-decay-style {args.lr_decay_style} (use constant: the learning rate stays --lr)")
    return found


def one_line(items: list[str]) -> str:
    return (f"{len(items)} slime flag(s) this runtime does not implement, with what to use instead: "
            + "; ".join(items))
