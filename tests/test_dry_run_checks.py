"""--dry-run refuses what a real start refuses before Ray (the model folders, the verified --load), and a real
start refused there leaves no folder or lock behind.

Before: a --hf-checkpoint that does not exist passed --dry-run (plan printed, exit 0), a --load whose files no
longer match their checksums too; the real run refused both, after creating --save and taking its lock there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import train
from slime.checkpoint.files import write_manifest
from slime.launch.output_paths import OutputLock
from slime.utils.tiny_models import save_tiny_checkpoint


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dry_run_checks")
    model = save_tiny_checkpoint(root / "model", hidden_size=16, num_layers=1, num_heads=2)
    data = root / "tasks.jsonl"
    data.write_text(json.dumps({"input": "go", "label": "x"}) + "\n")
    return {"model": str(model), "data": str(data), "root": root}


def argv(inputs, *extra, model=None):
    return ["--hf-checkpoint", model or inputs["model"], "--prompt-data", inputs["data"], "--num-rollout", "1",
            "--allow-no-reward", "--rollout-batch-size", "1", *extra]


def run(monkeypatch, capsys, args):
    monkeypatch.setattr(sys, "argv", ["train.py"])
    code = train.main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_a_missing_model_folder_is_refused_by_the_dry_run_as_by_a_real_start(inputs, monkeypatch, capsys, tmp_path):
    missing = str(tmp_path / "Qwen3-8B")
    code, out, err = run(monkeypatch, capsys, argv(inputs, "--dry-run", model=missing))
    assert code == 2 and out == "", out
    assert err == (f"train.py: error: --hf-checkpoint {missing!r} is not a folder; on the fsdp backend it must be a "
                   "HF model folder with config.json and *.safetensors weights (models are never downloaded: pass a "
                   "local folder, or for a plan made away from the model its config.json as --model-config-json)\n")
    save = tmp_path / "runs" / "new" / "save"
    code, _, err = run(monkeypatch, capsys, argv(inputs, "--save", str(save), model=missing))
    assert code == 2 and err.splitlines()[-1].startswith(f"train.py: error: --hf-checkpoint {missing!r} is not a")
    assert not (tmp_path / "runs").exists()  # neither --save nor the folders above it that the run made


def test_a_plan_made_away_from_the_model_says_what_it_did_not_check(inputs, monkeypatch, capsys, tmp_path):
    missing = str(tmp_path / "Qwen3-8B")
    config = Path(inputs["model"]) / "config.json"
    code, out, _ = run(monkeypatch, capsys, argv(inputs, "--dry-run", "--model-config-json", str(config),
                                                 model=missing))
    assert code == 0
    assert (f"  note: --model-config-json given: the model folders (--hf-checkpoint {missing}) and their tokenizer "
            "were not checked; the real run checks them before Ray") in out.splitlines()


def test_a_refused_start_into_an_existing_save_leaves_it_as_it_was(inputs, monkeypatch, capsys, tmp_path):
    save = tmp_path / "save"
    save.mkdir()
    code, _, _ = run(monkeypatch, capsys, argv(inputs, "--save", str(save), model=str(tmp_path / "nope")))
    assert code == 2
    assert save.is_dir() and list(save.iterdir()) == []  # no lock file left
    assert not (save / OutputLock.NAME).exists()


def _checkpoint(root: Path) -> Path:
    folder = root / "iter_0000000"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"rollout_id": 0}))
    (folder / "weights.bin").write_bytes(b"\0" * 64)
    write_manifest(folder)
    (root / "latest_checkpointed_iteration.txt").write_text("0")
    return folder


def test_the_dry_run_verifies_the_checkpoint_it_would_resume(inputs, monkeypatch, capsys, tmp_path):
    save = tmp_path / "ckpt"
    folder = _checkpoint(save)
    code, _, err = run(monkeypatch, capsys, argv(inputs, "--dry-run", "--save", str(save), "--load", str(folder)))
    assert code == 0, err
    (folder / "weights.bin").write_bytes(b"\1" * 64)  # same size, other bytes: only the checksum tells
    code, out, err = run(monkeypatch, capsys, argv(inputs, "--dry-run", "--save", str(save), "--load", str(folder)))
    assert code == 2 and out == "", out
    (line,) = [line for line in err.splitlines() if line.startswith("train.py: error:")]
    assert f"--load {folder}" in line and "weights.bin" in line, err
