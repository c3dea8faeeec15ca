"""What a model-loading flag (``--ref-load``, ``--opd-teacher-load``) points at: a HF folder or a Megatron root.

Pure Python (no megatron, no torch), so the start-up checks (``slime.launch.preflight``) and the trainer
resolve a path the same way:

* a **HF folder** holds ``config.json`` and ``*.safetensors`` weights -> ``LoadSource("hf", path, None)``;
* a **Megatron checkpoint root** holds ``latest_checkpointed_iteration.txt`` (an iteration number, or
  ``release``) and ``iter_{:07d}/`` folders (or ``release/``) -> ``LoadSource("megatron", that folder,
  iteration)``. A checkpoint step (``--ref-ckpt-step``, ``--opd-teacher-ckpt-step``) picks ``iter_{step}``
  instead of the named one, as Megatron's ``--ckpt-step`` does (the txt is then not needed).

This project's own save root (``--save``) has the same layout (``slime/checkpoint/driver.py``); the
trainer's files of an iteration are under ``iter_X/model/``. Megatron is looked for first, so a root that
also holds a config.json is read as Megatron's.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Literal

TRACKER = "latest_checkpointed_iteration.txt"  # Megatron's name, also written by slime.checkpoint.driver
RELEASE = "release"
HF_EXPECTED = "a HF model folder (config.json + *.safetensors)"
MEGATRON_EXPECTED = f"a Megatron checkpoint root ({TRACKER} + iter_XXXXXXX/ folders)"


@dataclass(frozen=True)
class LoadSource:
    kind: Literal["hf", "megatron"]
    folder: str  # the HF folder, or the Megatron iteration folder (iter_XXXXXXX or release)
    iteration: int | None  # the Megatron iteration; None for a HF folder and for ``release``


def iteration_folder(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:07d}")


def is_hf_folder(path: str) -> bool:
    return os.path.isdir(path) and not _hf_missing(path)


def _hf_missing(path: str) -> list[str]:
    missing = [] if os.path.isfile(os.path.join(path, "config.json")) else ["config.json"]
    return missing + ([] if glob.glob(os.path.join(path, "*.safetensors")) else ["*.safetensors weights"])


def _tracked(root: str, flag: str) -> tuple[str, int | None]:
    """(iteration folder, iteration) named by the root's tracker file."""
    tracker = os.path.join(root, TRACKER)
    with open(tracker) as fh:
        text = fh.read().strip()
    if text == RELEASE:
        return os.path.join(root, RELEASE), None
    try:
        iteration = int(text)
    except ValueError:
        raise ValueError(f"{flag} {root!r}: {TRACKER} holds {text!r}, not an iteration number or "
                         f"{RELEASE!r}") from None
    return iteration_folder(root, iteration), iteration


def resolve_load(path: str | None, flag: str, ckpt_step: int | None = None) -> LoadSource:
    """Where ``flag``'s ``path`` loads from. ``ckpt_step``: the iteration to take from a Megatron root.

    Raises FileNotFoundError (no such folder, neither kind, the iteration folder absent) or ValueError
    (an unreadable tracker file, a checkpoint step given for a HF folder), naming ``flag`` and ``path``.
    """
    if not path:
        raise FileNotFoundError(f"{flag} is not set: it must name {HF_EXPECTED} or {MEGATRON_EXPECTED}")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{flag} {path!r} is not a folder: expected {HF_EXPECTED} or {MEGATRON_EXPECTED}")
    has_tracker = os.path.isfile(os.path.join(path, TRACKER))
    if ckpt_step is not None and (has_tracker or os.path.isdir(iteration_folder(path, ckpt_step))):
        folder, iteration = iteration_folder(path, ckpt_step), ckpt_step
    elif has_tracker:
        folder, iteration = _tracked(path, flag)
    else:
        missing = _hf_missing(path)
        if missing:
            raise FileNotFoundError(f"{flag} {path!r} is neither {HF_EXPECTED} (missing {' and '.join(missing)}) "
                                    f"nor {MEGATRON_EXPECTED}")
        if ckpt_step is not None:
            raise ValueError(f"{flag} {path!r} is {HF_EXPECTED}, which has no iterations: checkpoint step "
                             f"{ckpt_step} applies only to {MEGATRON_EXPECTED}")
        return LoadSource("hf", path, None)
    if not os.path.isdir(folder):
        asked = f"checkpoint step {ckpt_step}" if ckpt_step is not None else TRACKER
        raise FileNotFoundError(f"{flag} {path!r}: {asked} names {os.path.basename(folder)}/, which is not there "
                                f"(expected {MEGATRON_EXPECTED})")
    return LoadSource("megatron", folder, iteration)
