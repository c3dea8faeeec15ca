"""Driver-side checkpoints: atomic folders that hold everything needed to resume exactly.

Layout of ``{save}/iter_{rollout_id:07d}/`` (which folder ``--load`` resumes: ``slime.checkpoint.layout``):

* ``model/``               written by the trainer group (HF policy, optimizer, critic; see fsdp_backend.md)
* ``trainer_state.json``   rollout id, data-source position, python/numpy RNG
* ``kl_ctrl/kl_ctrl_state_dict_{rollout_id}.json``  ``--kl-ctrl adaptive`` only: the controller's state,
                           written by the slime PR's ``save_kl_controller`` (the same file slime writes to
                           ``{save}/kl_ctrl/``, kept here inside the iteration folder)
* ``rng.safetensors``      torch RNG state of the driver
* ``tcod_teacher_episodes.json``  B2F with ``--tcod-prefix-source teacher``: the teacher's recorded
                           episodes (``slime.rollout.teacher_prefix.CACHE``, handed in by ``train.py``), so a
                           resumed run replays the very episodes the interrupted one did instead of asking
                           the teacher again
* ``run_config.json``      the run's flags (``slime.checkpoint.run_config``), so ``--load`` can refuse a run
                           whose flags would change what the checkpoint's run means

* ``checksums.json``      size and sha256 of every file above, written last (``slime.checkpoint.files``)

Everything is first written to ``iter_X.tmp`` and renamed when complete, so a crash never leaves a
half-written checkpoint that ``--load`` would pick up; ``latest_checkpointed_iteration.txt`` is replaced
after the rename.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from slime.checkpoint.files import read_json, read_safetensors, write_manifest
from slime.checkpoint.layout import LATEST, find_checkpoint, iteration_dir
from slime.checkpoint.run_config import RUN_CONFIG, run_config
from slime.utils.kl_controller import kl_controller_state_path, save_kl_controller

TEACHER_EPISODES = "tcod_teacher_episodes.json"


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


def save_checkpoint(root, rollout_id: int, *, trainer, data_source, kl_controller, teacher_episodes=None,
                    extra: dict | None = None, args=None) -> Path:
    """``args``: the run's flags for ``run_config.json`` (default: the trainer group's ``args``);
    ``kl_controller``: the adaptive controller, None with ``--kl-ctrl fixed``.

    ``teacher_episodes``: the rollout side's cache of teacher-played episodes (``state_dict()`` /
    ``load_state_dict()``, ``entries``), passed in by the caller because it lives above this package.
    """
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
        "rng": rng_json,
        **(extra or {}),
    }
    (tmp / "trainer_state.json").write_text(json.dumps(state, indent=1))
    save_file(rng_tensors, str(tmp / "rng.safetensors"))
    if kl_controller is not None:
        save_kl_controller(kl_controller, str(tmp), rollout_id)
    # The rollout side's state beyond the data position: only runs with teacher prefixes have any.
    if teacher_episodes is not None and teacher_episodes.entries:
        (tmp / TEACHER_EPISODES).write_text(json.dumps(teacher_episodes.state_dict()))
    args = args if args is not None else getattr(trainer, "args", None)
    if args is not None:
        (tmp / RUN_CONFIG).write_text(json.dumps(run_config(args), indent=1))
    write_manifest(tmp)  # last: a folder with a manifest is complete, and --load can verify every file
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = Path(root) / (LATEST + ".tmp")
    latest_tmp.write_text(str(rollout_id))
    os.replace(latest_tmp, Path(root) / LATEST)
    return final


def load_checkpoint(load, *, trainer, data_source, kl_controller, teacher_episodes=None, verify: bool = True) -> dict:
    """Restore trainer, data position, KL controller, RNG and ``teacher_episodes`` (as for
    :func:`save_checkpoint`); returns the saved state dict.

    ``verify=False`` when ``load`` is a folder ``layout.find_checkpoint`` has already verified (train.py
    does that before anything starts, so the engines and the trainer load the same iteration).
    """
    folder = find_checkpoint(load, verify=verify)
    state = read_json(folder / "trainer_state.json")
    trainer.load(str(folder / "model"))
    data_source.load_state_dict(state["data_source"])
    if kl_controller is not None:  # the checkpoint has its state: slime.checkpoint.resume checked before Ray
        kl_controller.load_state_dict(read_json(Path(kl_controller_state_path(str(folder), state["rollout_id"]))))
    _set_rng_state(state["rng"], read_safetensors(folder / "rng.safetensors"))
    # Replaced, not merged: what this process may have cached belongs to no step of the loaded run.
    if teacher_episodes is not None:
        episodes = folder / TEACHER_EPISODES
        teacher_episodes.load_state_dict(read_json(episodes) if episodes.exists() else None)
    state["folder"] = str(folder)
    return state
