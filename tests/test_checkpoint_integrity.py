"""Checkpoint integrity: checksums written with every iteration, verified by --load, fall-back to the newest
intact iteration, and readers that name a truncated file."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from safetensors.torch import save_file

from slime.checkpoint.driver import load_checkpoint, save_checkpoint
from slime.checkpoint.files import (MANIFEST, CheckpointError, read_json, read_safetensors, verify_manifest,
                                    write_manifest)
from slime.checkpoint.layout import LATEST, find_checkpoint, iteration_dir


class StubTrainer:
    """Writes and reads a small weights file and a json, as the trainer group does under model/."""

    def __init__(self, value=0.0):
        self.value, self.loaded = value, None

    def save(self, path):
        os.makedirs(os.path.join(path, "hf"))
        save_file({"w": torch.full((256,), self.value)}, os.path.join(path, "hf", "model.safetensors"))
        with open(os.path.join(path, "trainer_meta.json"), "w") as handle:
            json.dump({"value": self.value}, handle)

    def load(self, path):
        self.loaded = read_safetensors(os.path.join(path, "hf", "model.safetensors"))["w"][0].item()


class StubData:
    def __init__(self):
        self.state = {"offset": 0}

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = dict(state)


def save_iterations(root, ids):
    for i in ids:
        save_checkpoint(root, i, trainer=StubTrainer(float(i)), data_source=StubData(),
                        kl_controller=None)


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # same size: only the checksum can tell
    path.write_bytes(bytes(data))


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def weights_file(root, i):
    return iteration_dir(root, i) / "model" / "hf" / "model.safetensors"


# ---------------------------------------------------------------------------- manifest
def test_manifest_lists_every_file_and_detects_truncation_flips_and_loss(tmp_path):
    save_iterations(tmp_path, [0])
    folder = iteration_dir(tmp_path, 0)
    files = read_json(folder / MANIFEST)["files"]
    assert set(files) == {"trainer_state.json", "rng.safetensors", "model/trainer_meta.json",
                          "model/hf/model.safetensors"}
    assert verify_manifest(folder) is True
    flip_a_byte(folder / "rng.safetensors")
    with pytest.raises(CheckpointError, match=r"rng\.safetensors: sha256 differs"):
        verify_manifest(folder)
    write_manifest(folder)
    truncate(folder / "model" / "trainer_meta.json")
    with pytest.raises(CheckpointError, match=r"trainer_meta\.json: \d+ bytes.*truncated"):
        verify_manifest(folder)
    write_manifest(folder)
    (folder / "trainer_state.json").unlink()
    with pytest.raises(CheckpointError, match=r"trainer_state\.json: listed in checksums\.json but missing"):
        verify_manifest(folder)
    (folder / MANIFEST).unlink()
    assert verify_manifest(folder) is False


def test_truncated_files_are_named_by_the_readers(tmp_path):
    json_file, st_file = tmp_path / "meta.json", tmp_path / "w.safetensors"
    json_file.write_text('{"a": [1, 2')
    save_file({"w": torch.zeros(64)}, str(st_file))
    truncate(st_file)
    with pytest.raises(CheckpointError, match=r"meta\.json: not valid JSON"):
        read_json(json_file)
    with pytest.raises(CheckpointError, match=r"w\.safetensors: unreadable safetensors"):
        read_safetensors(st_file)


# ---------------------------------------------------------------------------- --load
def test_load_falls_back_to_the_newest_intact_iteration_with_a_warning(tmp_path, caplog):
    save_iterations(tmp_path, [0, 1, 2])
    flip_a_byte(weights_file(tmp_path, 2))
    with caplog.at_level(logging.WARNING, logger="slime.checkpoint.layout"):
        assert find_checkpoint(tmp_path) == iteration_dir(tmp_path, 1)
    assert "iter_0000002" in caplog.text and "model.safetensors" in caplog.text
    assert "falling back to iter_0000001" in caplog.text
    trainer = StubTrainer()
    state = load_checkpoint(tmp_path, trainer=trainer, data_source=StubData(), kl_controller=None)
    assert state["rollout_id"] == 1 and trainer.loaded == 1.0


def test_load_fails_clearly_when_no_iteration_is_intact(tmp_path):
    save_iterations(tmp_path, [0, 1])
    truncate(weights_file(tmp_path, 0))
    flip_a_byte(iteration_dir(tmp_path, 1) / "trainer_state.json")
    with pytest.raises(CheckpointError, match=r"no intact checkpoint.*iter_0000001.*trainer_state\.json.*"
                                              r"iter_0000000.*model\.safetensors"):
        find_checkpoint(tmp_path)


def test_an_explicit_corrupt_iteration_is_an_error_not_a_fallback(tmp_path):
    save_iterations(tmp_path, [0, 1])
    flip_a_byte(weights_file(tmp_path, 1))
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*save root"):
        find_checkpoint(iteration_dir(tmp_path, 1))
    assert find_checkpoint(iteration_dir(tmp_path, 0)) == iteration_dir(tmp_path, 0)


def test_latest_naming_a_missing_iteration_falls_back(tmp_path):
    save_iterations(tmp_path, [0, 1])
    (tmp_path / LATEST).write_text("5")
    assert find_checkpoint(tmp_path) == iteration_dir(tmp_path, 1)


def test_old_checkpoint_without_checksums_loads_with_a_warning(tmp_path, caplog):
    save_iterations(tmp_path, [0])
    (iteration_dir(tmp_path, 0) / MANIFEST).unlink()
    with caplog.at_level(logging.WARNING, logger="slime.checkpoint.layout"):
        assert find_checkpoint(tmp_path) == iteration_dir(tmp_path, 0)
    assert "no checksums" in caplog.text


def test_missing_load_folder_names_the_flag(tmp_path):
    with pytest.raises(CheckpointError, match="--load .*absent"):
        find_checkpoint(tmp_path / "absent")
