"""Driver-side checkpoints: atomic folders that hold everything needed to resume exactly.

Layout of ``{save}/iter_{rollout_id:07d}/``:

* ``model/``               written by the trainer group (HF policy, optimizer, critic; see fsdp_backend.md)
* ``trainer_state.json``   rollout id, data-source position, KL-controller state, python/numpy RNG
* ``rng.safetensors``      torch RNG state of the driver
* ``tcod_teacher_episodes.json``  B2F with ``--tcod-prefix-source teacher``: the teacher's recorded
                           episodes (``slime.rollout.teacher_prefix.CACHE``), so a resumed run replays
                           the very episodes the interrupted one did instead of asking the teacher again
* ``run_config.json``      the run's flags (``resume_checks.run_config``), so ``--load`` can refuse a run whose
                           flags would change what the checkpoint's run means

* ``checksums.json``      size and sha256 of every file above, written last (``checkpoint_files``)

Everything is first written to ``iter_X.tmp`` and renamed when complete, so a crash never leaves a
half-written checkpoint that ``--load`` would pick up. ``latest_checkpointed_iteration.txt`` (the
Megatron/slime convention) names the newest complete one.

``--load ROOT`` verifies the checksums of the newest iteration and, if a file is corrupt, warns naming
it and falls back to the newest intact older iteration (an error if none is intact). ``--load
ROOT/iter_X`` asks for that iteration only: a corrupt file there is an error. Iterations written before
checksums existed load with a warning. A missing or empty ``--load`` folder holds nothing to resume
(:func:`holds_checkpoint`): upstream's ``--load $SAVE --save $SAVE`` then starts from step 0.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from slime.rollout import teacher_prefix
from slime.utils import resume_checks
from slime.utils.checkpoint_files import CheckpointError, read_json, read_safetensors, verify_manifest, write_manifest

LATEST = "latest_checkpointed_iteration.txt"
TEACHER_EPISODES = "tcod_teacher_episodes.json"
RUN_CONFIG = resume_checks.RUN_CONFIG
_ITER = re.compile(r"iter_(\d{7})$")
logger = logging.getLogger(__name__)


def iteration_dir(root, rollout_id: int) -> Path:
    return Path(root) / f"iter_{rollout_id:07d}"


def _rng_state() -> tuple[dict, dict]:
    py_version, py_state, py_gauss = random.getstate()
    np_state = np.random.get_state()
    json_part = {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    return json_part, {"torch_cpu": torch.get_rng_state()}


def _set_rng_state(json_part: dict, tensors: dict) -> None:
    version, state, gauss = json_part["python"]
    random.setstate((version, tuple(state), gauss))
    name, keys, pos, has_gauss, cached = json_part["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch_cpu"])


def save_checkpoint(root, rollout_id: int, *, trainer, data_source, kl_controller, extra: dict | None = None,
                    args=None) -> Path:
    """``args``: the run's flags for ``run_config.json`` (default: the trainer group's ``args``)."""
    final = iteration_dir(root, rollout_id)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    trainer.save(str(tmp / "model"))
    rng_json, rng_tensors = _rng_state()
    state = {
        "rollout_id": rollout_id,
        "data_source": data_source.state_dict(),
        "kl_controller": kl_controller.state_dict(),
        "rng": rng_json,
        **(extra or {}),
    }
    (tmp / "trainer_state.json").write_text(json.dumps(state, indent=1))
    save_file(rng_tensors, str(tmp / "rng.safetensors"))
    # The rollout side's state beyond the data position: only runs with teacher prefixes have any.
    if teacher_prefix.CACHE.entries:
        (tmp / TEACHER_EPISODES).write_text(json.dumps(teacher_prefix.CACHE.state_dict()))
    args = args if args is not None else getattr(trainer, "args", None)
    if args is not None:
        (tmp / RUN_CONFIG).write_text(json.dumps(resume_checks.run_config(args), indent=1))
    write_manifest(tmp)  # last: a folder with a manifest is complete, and --load can verify every file
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = Path(root) / (LATEST + ".tmp")
    latest_tmp.write_text(str(rollout_id))
    os.replace(latest_tmp, Path(root) / LATEST)
    return final


def _candidates(root: Path) -> list[Path]:
    """Iteration folders of a save root, newest first; the one ``LATEST`` names leads."""
    found = sorted((p for p in root.iterdir() if p.is_dir() and _ITER.match(p.name)), reverse=True)
    latest = root / LATEST
    if latest.exists():
        named = iteration_dir(root, int(latest.read_text().strip()))
        found = [named] + [p for p in found if p != named]
    return found


def holds_checkpoint(load) -> bool:
    """Whether ``--load`` names something to resume; False for a missing or empty folder (a first run).

    A missing ``iter_*`` folder asked for by name, a file, or a root whose iterations are all broken
    count as checkpoints, so :func:`find_checkpoint` reports them instead of the run starting over.
    """
    path = Path(load)
    if not path.exists():
        return bool(_ITER.match(path.name))
    if not path.is_dir() or (path / "trainer_state.json").exists() or (path / LATEST).exists():
        return True
    return bool(_candidates(path))


def _verified(folder: Path) -> Path:
    """``folder`` if its checksums match; a checkpoint without a manifest passes with a warning."""
    if not (folder / "trainer_state.json").exists():
        raise CheckpointError(f"{folder}: incomplete or missing (no trainer_state.json)")
    if not verify_manifest(folder):
        logger.warning("%s has no checksums (written before they were recorded): loading it unverified", folder)
    return folder


def find_checkpoint(load, verify: bool = True) -> Path:
    """The checkpoint folder ``--load`` points at: an ``iter_*`` folder, or the newest intact one of a root.

    With ``verify`` every file is checked against the checkpoint's checksums (see the module docstring for
    the fall-back). Raises :class:`CheckpointError` (a ``RuntimeError``) naming the bad file.
    """
    path = Path(load)
    check = _verified if verify else (lambda folder: folder)
    if (path / "trainer_state.json").exists():
        try:
            return check(path)
        except CheckpointError as err:
            raise CheckpointError(f"--load {load}: {err}. Pass the save root instead of one iteration to fall "
                                  "back to the newest intact iteration") from None
    if not path.is_dir() or not (_candidates(path) or (path / LATEST).exists()):
        raise CheckpointError(f"--load {load}: neither a checkpoint folder (trainer_state.json) nor a "
                              f"save root with {LATEST} or iter_* folders")
    problems = []
    for folder in _candidates(path):
        try:
            found = check(folder)
        except CheckpointError as err:
            problems.append(str(err))
            logger.warning("--load %s: skipping %s: %s", load, folder.name, err)
            continue
        if problems:
            logger.warning("--load %s: falling back to %s, the newest intact iteration", load, found.name)
        return found
    raise CheckpointError(f"--load {load}: no intact checkpoint: " + "; ".join(problems))


def load_checkpoint(load, *, trainer, data_source, kl_controller, verify: bool = True) -> dict:
    """Restore trainer, data position, KL controller and RNG; returns the saved state dict.

    ``verify=False`` when ``load`` is a folder :func:`find_checkpoint` has already verified (train.py
    does that before anything starts, so the engines and the trainer load the same iteration).
    """
    folder = find_checkpoint(load, verify=verify)
    state = read_json(folder / "trainer_state.json")
    trainer.load(str(folder / "model"))
    data_source.load_state_dict(state["data_source"])
    kl_controller.load_state_dict(state["kl_controller"])
    _set_rng_state(state["rng"], read_safetensors(folder / "rng.safetensors"))
    # Replaced, not merged: what this process may have cached belongs to no step of the loaded run.
    episodes = folder / TEACHER_EPISODES
    teacher_prefix.CACHE.load_state_dict(read_json(episodes) if episodes.exists() else None)
    state["folder"] = str(folder)
    return state
