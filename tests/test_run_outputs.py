"""Runs never mix their outputs: a fresh run into a folder that holds a run, or into one a run is using, is
refused before Ray; without --save / --metrics-dir each run writes to a new folder it names at start.

The refusals run train.py's own checks on real inputs (a tiny model, gridnav tasks); the lock is held by a
second Python process, as a concurrent run holds it, and that process is then killed as a crash would.
"""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import train
from examples.agent_envs.make_data import task_rows
from slime.launch.output_paths import OutputLock
from slime.utils.metrics import MetricsLogger, read_metrics
from slime.utils.tiny_models import save_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("outputs")
    model = save_tiny_checkpoint(root / "model", hidden_size=16, num_layers=1, num_heads=2)
    data = root / "tasks.jsonl"
    rows = task_rows("gridnav", 2, 0, {"size": 4, "walls": 0.0}, min_len=2, max_len=4)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    yield {"model": str(model), "data": str(data)}
    import ray

    ray.shutdown()


def argv(inputs, *extra):
    return ["--hf-checkpoint", inputs["model"], "--prompt-data", inputs["data"], "--rollout-batch-size", "1",
            "--n-samples-per-prompt", "1", "--num-rollout", "1", "--max-turns", "2", "--max-turn-response-len", "4",
            "--rollout-max-response-len", "64", "--rollout-interaction-env-path", "examples.agent_envs",
            "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", inputs["model"], *extra]


def an_earlier_run(folder: Path) -> None:
    """What a run leaves in its --save: its metrics rows (written by the run's own logger)."""
    class Args:
        metrics_dir, save, use_tensorboard, use_wandb = None, str(folder), False, False

    logger = MetricsLogger(Args())
    logger.log(0, {"loss": 1.0})
    logger.close()


def test_a_fresh_run_into_a_save_that_holds_a_run_is_refused_before_ray(inputs, tmp_path, capsys):
    import ray

    an_earlier_run(tmp_path)
    for extra in ((), ("--dry-run",)):
        assert train.main(argv(inputs, "--save", str(tmp_path), *extra)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == (f"train.py: error: --save {tmp_path} already holds a run (metrics.jsonl rows): resume it "
                           f"with --load {tmp_path}, or choose a new --save folder"), err
    assert not ray.is_initialized()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0]  # untouched
    # Resuming it is what the line offers: the checks pass.
    assert train.main(argv(inputs, "--save", str(tmp_path), "--load", str(tmp_path), "--dry-run")) == 0


def test_a_metrics_dir_that_holds_a_run_is_refused_too(inputs, tmp_path, capsys):
    an_earlier_run(tmp_path / "m")
    assert train.main(argv(inputs, "--metrics-dir", str(tmp_path / "m"), "--dry-run")) == 2
    assert "--metrics-dir" in capsys.readouterr().err


def test_a_second_run_into_a_save_in_use_is_refused_and_a_crashed_run_leaves_no_lock(inputs, tmp_path, capsys):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from types import SimpleNamespace as N; "
         "from slime.launch.output_paths import OutputLock; "
         f"lock = OutputLock(N(save={str(tmp_path)!r}, metrics_dir=None)); print('held', flush=True); time.sleep(300)"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert train.main(argv(inputs, "--save", str(tmp_path))) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == (f"train.py: error: --save {tmp_path} is in use by another run (pid {holder.pid}): wait "
                           "for it to end, or choose a new --save folder"), err
    finally:
        holder.send_signal(signal.SIGKILL)  # a crash: no cleanup runs in the holder
        holder.wait()
    from types import SimpleNamespace

    OutputLock(SimpleNamespace(save=str(tmp_path), metrics_dir=None)).release()  # free again


def test_without_save_or_metrics_dir_each_run_writes_to_a_new_folder_it_names(inputs, tmp_path, monkeypatch,
                                                                              capfd):
    monkeypatch.chdir(tmp_path)
    folders = []
    for _ in range(2):
        assert train.main(argv(inputs)) == 0
        err = capfd.readouterr().err
        named = re.findall(r"^train\.py: no --save or --metrics-dir: this run writes to (\S+)$", err, re.M)
        assert len(named) == 1, err[-2000:]
        folders.append(tmp_path / named[0])
    assert folders[0] != folders[1] and all(f.parent == tmp_path / "outputs" for f in folders)
    assert all([r["step"] for r in read_metrics(f / "metrics.jsonl")] == [0] for f in folders)
    assert not (tmp_path / "outputs" / "metrics.jsonl").exists()
    assert sorted(os.listdir(tmp_path / "outputs")) == [f.name for f in folders]  # dated names sort in run order


def test_a_run_refused_after_its_folder_was_named_leaves_no_folder(inputs, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "not_a_model").mkdir()
    assert train.main(argv(inputs, "--hf-checkpoint", str(tmp_path / "not_a_model"))) == 2
    err = capfd.readouterr().err
    assert re.search(r"^train\.py: no --save or --metrics-dir: this run writes to outputs/run-", err, re.M), err[-2000:]
    assert "is not a HF model folder" in err.strip().splitlines()[-1]
    assert os.listdir(tmp_path / "outputs") == []  # the refused attempt's folder (lock file only) is gone
