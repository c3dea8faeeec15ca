"""``--load``: what a resume resumes, and the refusal of a resume whose flags would change what the run means.

``slime.launch`` calls :func:`check_resume` before Ray, ``--dry-run`` included, and prints its lines
(``slime.launch.resume_notes``). Every checkpoint holds the run's flags (``run_config.json``,
``slime.checkpoint.run_config``); a resume compares them with the new run's:

* flags that define the run (TCOD's curriculum, ``max_turns``, batch sizes, the algorithm) and the
  model's shape (the checkpoint's ``model/hf/config.json`` against the new ``--hf-checkpoint``'s) must
  not change: the curriculum would jump, ``metrics.jsonl`` would mix two runs, or the trainer would fail
  after Ray and the engines are up. One ``ArgumentError`` names each change with both values;
* the optimizer's settings (``--lr``, ``--weight-decay``, Adam's) are restored with its state, so a new
  value would be silently ignored. They are compared with what the checkpoint's optimizer holds
  (``model/optimizer/meta.json``); a change needs Megatron-LM's ``--override-opt_param-scheduler`` (the
  new values replace the restored ones) or ``--use-checkpoint-opt_param-scheduler`` (the checkpoint's win);
* ``--kl-ctrl`` must be the checkpoint's: an adaptive run's iteration holds its controller's state
  (``kl_ctrl/``, ``slime.checkpoint.driver``), which a fixed run would drop and a fixed run's iteration lacks.
  A new ``--kl-target`` / ``--kl-horizon`` is allowed, as in the slime PR: the saved coefficient goes on with it;
* everything else (``--num-rollout``, intervals, paths, logging) may change freely.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from slime.arguments.argument_error import ArgumentError
from slime.checkpoint.files import CheckpointError, read_json
from slime.checkpoint.layout import find_checkpoint, holds_checkpoint
from slime.checkpoint.run_config import RUN_CONFIG
from slime.utils.hf_config import read_config
from slime.utils.kl_controller import build_kl_controller, kl_controller_state_path

OVERRIDE = "--override-opt_param-scheduler"
KEEP = "--use-checkpoint-opt_param-scheduler"
# Flags that define the run: (attribute, flag). max_turns may come from the --custom-config-path YAML.
RUN_FLAGS = (
    ("train_backend", "--train-backend"), ("loss_type", "--loss-type"),
    ("advantage_estimator", "--advantage-estimator"), ("use_opd", "--use-opd"),
    ("rollout_batch_size", "--rollout-batch-size"), ("n_samples_per_prompt", "--n-samples-per-prompt"),
    ("global_batch_size", "--global-batch-size"), ("max_turns", "--max-turns"), ("use_tcod", "--use-tcod"),
)
# Compared when both runs use TCOD: without --use-tcod they have no effect.
TCOD_FLAGS = (("tcod_mode", "--tcod-mode"), ("tcod_eta", "--tcod-eta"), ("tcod_k_start", "--tcod-k-start"),
              ("tcod_k_max", "--tcod-k-max"))
# Compared when both runs are B2F (validation sets it for b2f only).
B2F_FLAGS = (("tcod_prefix_source", "--tcod-prefix-source"),)
# What the restored optimizer state carries: (attribute, flag, key of its saved param group, index).
OPTIMIZER_FLAGS = (("lr", "--lr", "lr", None), ("weight_decay", "--weight-decay", "weight_decay", None),
                   ("adam_beta1", "--adam-beta1", "betas", 0), ("adam_beta2", "--adam-beta2", "betas", 1),
                   ("adam_eps", "--adam-eps", "eps", None))
# The model's shape, as a HF config.json names it (text_config for multimodal configs).
MODEL_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "vocab_size", "tie_word_embeddings")


def checkpoint_to_resume(args, verify: bool = True) -> Path | None:
    """The iteration ``--load`` resumes (None: nothing to resume). Verified once per run: preflight and
    this module share the result, so the checksums are hashed once and both name the same iteration."""
    if verify and hasattr(args, "_resume_folder"):
        return args._resume_folder
    folder = None
    if args.load and holds_checkpoint(args.load):
        try:
            folder = find_checkpoint(args.load, verify=verify)
        except CheckpointError as err:
            raise ArgumentError(str(err)) from None
    if verify:
        args._resume_folder = folder
    return folder


@dataclass
class Resume:
    """What a ``--load`` resumes, once :func:`check_resume` has accepted it."""

    folder: Path  # the iteration folder
    step: int  # its rollout id: the run goes on at step + 1
    optimizer: list  # (flag, checkpoint's value, this run's) the optimizer flags allow to differ
    has_run_config: bool  # False: written before run_config.json existed, so no flags were compared
    kl_settings: dict  # --kl-target / --kl-horizon: (checkpoint's, this run's) for those that differ


def check_resume(args) -> Resume | None:
    """Refuse (``ArgumentError``, one line) a resume that changes the run; None when there is nothing to resume."""
    if not args.load:
        return None
    # A plan may be printed where the checkpoints are not: the real run verifies them (preflight).
    folder = checkpoint_to_resume(args, verify=not args.dry_run)
    if folder is None:
        return None
    try:
        step = int(read_json(folder / "trainer_state.json")["rollout_id"])
        saved = read_json(folder / RUN_CONFIG) if (folder / RUN_CONFIG).is_file() else None
    except (CheckpointError, KeyError, ValueError) as err:
        raise ArgumentError(f"--load {args.load}: {err}") from None
    saved_args = (saved or {}).get("args") or {}
    changed = flag_changes(saved_args, args) if saved else []
    changed += model_changes(_saved_model_config(folder, saved), args)
    optimizer = optimizer_changes(folder, saved_args, args)
    kl_problem, kl_settings = kl_controller_changes(folder, step, args)
    problems = [kl_problem] if kl_problem else []
    if changed:
        problems.append("this run changes what the checkpoint's run means: " + ", ".join(changed) +
                        " (start a new --save folder, or restore the flags)")
    if optimizer and not (args.override_opt_param_scheduler or args.use_checkpoint_opt_param_scheduler):
        problems.append("the optimizer's settings change: " + ", ".join(arrow(*c) for c in optimizer) +
                        f", but the checkpoint's optimizer state would keep its own; pass {OVERRIDE} to train "
                        f"with this run's values, or {KEEP} to keep the checkpoint's")
    if problems:
        raise ArgumentError(f"--load {args.load}: " + "; ".join(problems))
    return Resume(folder=folder, step=step, optimizer=optimizer, has_run_config=saved is not None,
                  kl_settings=kl_settings)


def kl_controller_changes(folder: Path, step: int, args) -> tuple[str | None, dict]:
    """(the problem when this run's ``--kl-ctrl`` is not the checkpoint's, the changed ``--kl-target`` /
    ``--kl-horizon``). An iteration holds a controller state iff its run was adaptive."""
    path = Path(kl_controller_state_path(str(folder), step))
    if not path.is_file():
        if args.kl_ctrl == "adaptive":
            return (f"--kl-ctrl adaptive: the checkpoint has no KL controller state file (kl_ctrl/{path.name}); "
                    "its run kept --kl-coef fixed or predates the kl_ctrl state files, so there is no coefficient to "
                    "resume (start a new --save folder, or drop --kl-ctrl adaptive)"), {}
        return None, {}
    try:
        state = read_json(path)
    except CheckpointError as err:
        raise ArgumentError(f"--load {args.load}: {err}") from None
    if args.kl_ctrl != "adaptive":
        return (f"--kl-ctrl adaptive -> fixed: the checkpoint's run adapted the KL coefficient (now "
                f"{state['value']:.6g}, target {state['target']:g}); resume it with --kl-ctrl adaptive "
                f"--kl-target {state['target']:g}, or start a new --save folder"), {}
    return None, build_kl_controller(args).changed_settings(state)


def flag_changes(saved: dict, args) -> list[str]:
    """``--flag OLD -> NEW`` for each run-defining flag the new run changes (flags the saved run lacks
    are not compared: a checkpoint of an older runtime)."""
    pairs = list(RUN_FLAGS)
    if saved.get("use_tcod") and args.use_tcod:
        pairs += TCOD_FLAGS
        pairs += B2F_FLAGS if saved.get("tcod_mode") == args.tcod_mode == "b2f" else ()
    return [arrow(flag, saved[name], getattr(args, name, None)) for name, flag in pairs
            if name in saved and not _same(saved[name], getattr(args, name, None))]


def model_changes(saved_config: dict | None, args) -> list[str]:
    """The shape keys in which ``--hf-checkpoint``'s config.json differs from the checkpoint's model."""
    new_config = read_config(args.hf_checkpoint)
    if not saved_config or not new_config:
        return []  # a plan printed where the model is not
    old, new = saved_config.get("text_config") or saved_config, new_config.get("text_config") or new_config
    diffs = [f"{key} {show(old[key])} -> {show(new[key])}" for key in MODEL_KEYS
             if key in old and key in new and not _same(old[key], new[key])]
    if not diffs:
        return []
    return [f"the model (--hf-checkpoint {args.hf_checkpoint}) is another architecture than the checkpoint's: "
            + ", ".join(diffs)]


def optimizer_changes(folder: Path, saved_args: dict, args) -> list[tuple[str, object, object]]:
    """(flag, checkpoint's value, this run's) for each optimizer setting that differs. The checkpoint's
    value is what its optimizer state holds (what a resume restores), else its run_config.json's."""
    group = _saved_param_group(folder / "model" / "optimizer")
    out = []
    for name, flag, key, index in OPTIMIZER_FLAGS:
        old = group.get(key) if group else saved_args.get(name)
        if group and index is not None and old is not None:
            old = old[index]
        if old is not None and not _same(old, getattr(args, name)):
            out.append((flag, old, getattr(args, name)))
    critic = _saved_param_group(folder / "model" / "critic_optimizer")
    if critic and "lr" in critic and not _same(critic["lr"], args.critic_lr or args.lr):
        out.append(("--critic-lr", critic["lr"], args.critic_lr or args.lr))
    if "lr_decay_style" in saved_args and saved_args["lr_decay_style"] != args.lr_decay_style:
        out.append(("--lr-decay-style", saved_args["lr_decay_style"], args.lr_decay_style))
    return out


def _saved_param_group(folder: Path) -> dict | None:
    """The first param group the trainer saved (one group per optimizer in both backends)."""
    meta = folder / "meta.json"
    if not meta.is_file():
        return None
    try:
        groups = read_json(meta).get("param_groups") or []
    except CheckpointError as err:
        raise ArgumentError(f"--load: {err}") from None
    return groups[0] if groups else None


def _saved_model_config(folder: Path, saved: dict | None) -> dict | None:
    """The policy the checkpoint holds (its HF export), else the model its run started from."""
    return read_config(str(folder / "model" / "hf")) or (saved or {}).get("model_config")


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def show(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return "unset" if value is None else str(value)


def arrow(flag: str, old, new) -> str:
    return f"{flag} {show(old)} -> {show(new)}"
