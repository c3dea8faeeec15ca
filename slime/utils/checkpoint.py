"""Driver-side checkpoints: atomic folders that hold everything needed to resume exactly.

Layout of ``{save}/iter_{rollout_id:07d}/``:

* ``model/``               written by the trainer group (HF policy, optimizer, critic; see fsdp_backend.md)
* ``trainer_state.json``   rollout id, data-source position, KL-controller state, python/numpy RNG
* ``rng.safetensors``      torch RNG state of the driver

Everything is first written to ``iter_X.tmp`` and renamed when complete, so a crash never leaves a
half-written checkpoint that ``--load`` would pick up. ``latest_checkpointed_iteration.txt`` (the
Megatron/slime convention) names the newest complete one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

LATEST = "latest_checkpointed_iteration.txt"


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


def save_checkpoint(root, rollout_id: int, *, trainer, data_source, kl_controller, extra: dict | None = None) -> Path:
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
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = Path(root) / (LATEST + ".tmp")
    latest_tmp.write_text(str(rollout_id))
    os.replace(latest_tmp, Path(root) / LATEST)
    return final


def find_checkpoint(load) -> Path:
    """The checkpoint folder ``--load`` points at: an ``iter_*`` folder or a root with the latest file."""
    path = Path(load)
    if (path / "trainer_state.json").exists():
        return path
    latest = path / LATEST
    if not latest.exists():
        raise FileNotFoundError(f"--load {load}: neither a checkpoint folder (trainer_state.json) nor a "
                                f"save root with {LATEST}")
    found = iteration_dir(path, int(latest.read_text().strip()))
    if not (found / "trainer_state.json").exists():
        raise FileNotFoundError(f"--load {load}: {LATEST} names {found.name}, which is incomplete or missing")
    return found


def load_checkpoint(load, *, trainer, data_source, kl_controller) -> dict:
    """Restore trainer, data position, KL controller and RNG; returns the saved state dict."""
    folder = find_checkpoint(load)
    state = json.loads((folder / "trainer_state.json").read_text())
    trainer.load(str(folder / "model"))
    data_source.load_state_dict(state["data_source"])
    kl_controller.load_state_dict(state["kl_controller"])
    _set_rng_state(state["rng"], load_file(str(folder / "rng.safetensors")))
    state["folder"] = str(folder)
    return state
