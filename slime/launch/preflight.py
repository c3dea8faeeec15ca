"""Input checks ``train.py`` runs before Ray or any engine starts: every local path and data file.

``validate_args`` checks flag values only (tools, tests and ``--dry-run`` use it with paths that need
not exist). This module checks what the run will read, so a typo costs a second instead of a Ray
start-up, engine loads, or 55 s of retrying a model hub this project never downloads from:

* model folders (``--hf-checkpoint``, ``--ref-load``, ``--critic-load``, ``--opd-teacher-load``) exist
  locally as HF folders; ``--ref-load`` and ``--opd-teacher-load`` may instead be Megatron checkpoint
  roots with ``--train-backend megatron`` (``megatron_utils.load_paths``), which needs megatron-core;
* upstream's model-shape flags (``--num-layers`` ...) agree with ``--hf-checkpoint``'s config.json, and
  ``--tensor-model-parallel-size`` divides its attention heads and query groups (``megatron_shape``);
* the teacher and the reference share the policy's tokenizer and model vocabulary (a teacher server
  is asked at ``--rm-url``);
* prompt files (``--prompt-data``, ``--eval-prompt-data``) exist and parse, errors as ``file:line``;
* ``--load`` holds an intact checkpoint (checksums verified; see ``slime.checkpoint.driver``), or
  nothing yet (a missing or empty folder: the run starts from step 0).

``--dry-run`` runs them all too, so a plan is printed only for a run that would start; with
``--model-config-json`` (a plan made on a machine without the models) it skips the model folders and their
tokenizer, and says so in the plan. A dry run never asks the teacher server (scripts start it after the plan).

Every failure is an :class:`ArgumentError` naming the flag.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from slime.ray.failures import who_is
from slime.utils.arguments import ArgumentError
from slime.utils.http_utils import HTTPRequestError


@dataclass
class Inputs:
    tokenizer: object
    load_folder: Path | None  # the verified checkpoint --load resolves to (None without --load)


def preflight(args) -> Inputs:
    if args.num_rollout is None:
        raise ArgumentError("--num-rollout is required (number of rollout/train steps)")
    check_backend(args)
    if args.dry_run and args.model_config_json:
        # A plan made away from the models (--model-config-json stands in for --hf-checkpoint's config):
        # the checkpoint to resume is still verified; the real run checks the models before Ray.
        return Inputs(tokenizer=None, load_folder=resolve_load(args))
    megatron_loads = check_model_folders(args)
    check_model_shape(args)
    from slime.rollout.sglang_rollout import GenerateState

    # A local folder by now: no hub access. GenerateState's: the one the generate functions then share.
    tokenizer = GenerateState(args).tokenizer
    check_data(args, tokenizer)
    check_vocabularies(args, tokenizer, skip=megatron_loads)
    return Inputs(tokenizer=tokenizer, load_folder=resolve_load(args))


def check_backend(args) -> None:
    if args.train_backend != "megatron":
        return
    try:
        found = importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise ArgumentError("--train-backend megatron needs megatron-core, which is not installed here "
                            "(docs/en/megatron_backend.md, Installs)")


def check_model_folders(args) -> set[str]:
    """Every model flag's folder; returns the flags that name a Megatron checkpoint (whose vocabulary the
    trainer checks when it loads them: there is no config.json or tokenizer to read here)."""
    from slime.backends.fsdp_utils.model_io import validate_hf_folder
    from slime.backends.megatron_utils.load_paths import resolve_load

    sources = {}
    try:
        for flag, path in (("--hf-checkpoint", args.hf_checkpoint), ("--critic-load", args.critic_load)):
            if path is not None or flag == "--hf-checkpoint":
                validate_hf_folder(path, flag)
        for flag, path, step in (("--ref-load", args.ref_load, args.ref_ckpt_step),
                                 ("--opd-teacher-load", args.opd_teacher_load, args.opd_teacher_ckpt_step)):
            if path is not None:
                sources[flag] = resolve_load(path, flag, step)
    except (FileNotFoundError, ValueError) as err:
        away = ", or for a plan made away from the model its config.json as --model-config-json" \
            if args.dry_run else ""
        raise ArgumentError(f"{err} (models are never downloaded: pass a local folder{away})") from None
    megatron = {flag: source.folder for flag, source in sources.items() if source.kind == "megatron"}
    for flag, folder in megatron.items():
        if args.train_backend != "megatron":
            raise ArgumentError(f"{flag} {folder} is a Megatron checkpoint: it needs --train-backend megatron "
                                "(the fsdp backend loads HF folders: config.json + *.safetensors)")
    return set(megatron)


def check_model_shape(args) -> None:
    """Upstream's model-shape flags against ``--hf-checkpoint``'s config.json, and the heads against TP."""
    from slime.arguments.megatron_shape import shape_mismatches, tp_divisibility_error
    from slime.utils.hf_config import read_config

    config = read_config(args.hf_checkpoint)  # check_model_folders found it
    source = f"--hf-checkpoint {os.path.join(args.hf_checkpoint, 'config.json')}"
    problems = shape_mismatches(args, config, source)
    text = config.get("text_config") or config
    tp_error = tp_divisibility_error(args.tensor_model_parallel_size, text.get("num_attention_heads"),
                                     text.get("num_key_value_heads"), f"of {source}")
    problems += [tp_error] if tp_error else []
    if problems:
        raise ArgumentError("; ".join(problems))


def check_data(args, tokenizer) -> None:
    from slime.launch.checks import data_files
    from slime.utils.data import Dataset, DataError

    for flag, path in data_files(args):
        try:
            Dataset(path, input_key=args.input_key, label_key=args.label_key, metadata_key=args.metadata_key,
                    tokenizer=tokenizer, apply_chat_template=args.apply_chat_template)
        except DataError as err:
            raise ArgumentError(f"{flag}: {err}") from None


def check_vocabularies(args, tokenizer, skip: set[str] = frozenset()) -> None:
    """``skip``: flags whose folder is a Megatron checkpoint (no tokenizer or config.json to compare)."""
    from slime.backends import teacher_vocab

    policy_vocab = tokenizer.get_vocab()
    local = [("--ref-load", args.ref_load)]
    if args.use_opd and args.opd_type == "megatron":
        local.append(("--opd-teacher-load", args.opd_teacher_load))
    try:
        for flag, path in local:
            if path and flag not in skip:
                teacher_vocab.check_local_vocab(args.hf_checkpoint, path, flag, policy_vocab=policy_vocab)
        # A dry run does not ask the teacher server: scripts start it after their plan (the real run asks).
        if args.use_opd and args.opd_type == "sglang" and not args.dry_run:
            from slime.rollout.sglang_rollout import run_async
            from slime.utils.http_utils import close_session

            try:
                run_async(teacher_vocab.check_teacher_vocab(args, tokenizer))
            finally:
                run_async(close_session())  # the rollouts open their own; none is left unclosed on failure
    except ValueError as err:
        raise ArgumentError(str(err)) from None
    except HTTPRequestError as err:
        raise ArgumentError(f"{who_is(args, err.url)} did not answer before the run: {err}. Start it first, "
                            "or fix the URL") from None


def resolve_load(args) -> Path | None:
    """The verified iteration to resume; None without --load or when its folder holds none yet (the
    resume checks of ``check_launch`` found it already in a real run)."""
    from slime.checkpoint.resume import checkpoint_to_resume

    return checkpoint_to_resume(args, verify=True)
