"""Input checks ``train.py`` runs before Ray or any engine starts: every local path and data file.

``validate_args`` checks flag values only (tools, tests and ``--dry-run`` use it with paths that need
not exist). This module checks what the run will read, so a typo costs a second instead of a Ray
start-up, engine loads, or 55 s of retrying a model hub this project never downloads from:

* model folders (``--hf-checkpoint``, ``--ref-load``, ``--critic-load``, ``--opd-teacher-load``) exist
  locally as HF folders;
* the teacher and the reference share the policy's tokenizer and model vocabulary (a teacher server
  is asked at ``--rm-url``);
* prompt files (``--prompt-data``, ``--eval-prompt-data``) exist and parse, errors as ``file:line``;
* ``--load`` holds an intact checkpoint (checksums verified; see ``slime.utils.checkpoint``).

Every failure is an :class:`ArgumentError` naming the flag.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slime.utils.arguments import ArgumentError

# The rollout functions of this tree all take their prompts from the data source (--prompt-data); a
# custom one may generate its own, so it is left to decide.
BUILT_IN_ROLLOUT_PREFIX = "slime.rollout."


@dataclass
class Inputs:
    tokenizer: object
    load_folder: Path | None  # the verified checkpoint --load resolves to (None without --load)


def preflight(args) -> Inputs:
    if args.num_rollout is None:
        raise ArgumentError("--num-rollout is required (number of rollout/train steps)")
    check_model_folders(args)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.hf_checkpoint)  # a local folder by now: no hub access
    check_data(args, tokenizer)
    check_vocabularies(args, tokenizer)
    return Inputs(tokenizer=tokenizer, load_folder=resolve_load(args))


def check_model_folders(args) -> None:
    from slime.backends.fsdp_utils.model_io import validate_hf_folder

    folders = [("--hf-checkpoint", args.hf_checkpoint), ("--ref-load", args.ref_load),
               ("--critic-load", args.critic_load), ("--opd-teacher-load", args.opd_teacher_load)]
    for flag, path in folders:
        if path is None and flag != "--hf-checkpoint":
            continue
        try:
            validate_hf_folder(path, flag)
        except (FileNotFoundError, ValueError) as err:
            raise ArgumentError(f"{err} (models are never downloaded: pass a local folder)") from None


def check_data(args, tokenizer) -> None:
    from slime.utils.data import Dataset, DataError

    trains = args.num_rollout > 0
    if trains and not args.prompt_data and args.rollout_function_path.startswith(BUILT_IN_ROLLOUT_PREFIX):
        raise ArgumentError(f"--prompt-data is required: the rollout function {args.rollout_function_path} takes "
                            "its prompts from it")
    pairs = [("--prompt-data", args.prompt_data)] if args.prompt_data else []
    eval_pairs = args.eval_prompt_data or []
    pairs += [(f"--eval-prompt-data {name}", path) for name, path in zip(eval_pairs[0::2], eval_pairs[1::2])]
    for flag, path in pairs:
        try:
            Dataset(path, input_key=args.input_key, label_key=args.label_key, metadata_key=args.metadata_key,
                    tokenizer=tokenizer, apply_chat_template=args.apply_chat_template)
        except DataError as err:
            raise ArgumentError(f"{flag}: {err}") from None


def check_vocabularies(args, tokenizer) -> None:
    from slime.utils import teacher_vocab

    policy_vocab = tokenizer.get_vocab()
    local = [("--ref-load", args.ref_load)]
    if args.use_opd and args.opd_type == "megatron":
        local.append(("--opd-teacher-load", args.opd_teacher_load))
    try:
        for flag, path in local:
            if path:
                teacher_vocab.check_local_vocab(args.hf_checkpoint, path, flag, policy_vocab=policy_vocab)
        if args.use_opd and args.opd_type == "sglang":
            from slime.rollout.sglang_rollout import run_async
            from slime.utils.http_utils import close_session

            try:
                run_async(teacher_vocab.check_teacher_vocab(args, tokenizer))
            finally:
                run_async(close_session())  # the rollouts open their own; none is left unclosed on failure
    except ValueError as err:
        raise ArgumentError(str(err)) from None


def resolve_load(args) -> Path | None:
    if not args.load:
        return None
    from slime.utils.checkpoint import find_checkpoint
    from slime.utils.checkpoint_files import CheckpointError

    try:
        return find_checkpoint(args.load)
    except CheckpointError as err:
        raise ArgumentError(str(err)) from None
