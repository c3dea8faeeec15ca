"""No wait before Ray is silent: a slow check prints ``still checking ...`` lines (one per interval), a quick
refusal prints only its own line, and train.py answers a mistyped flag before importing torch."""

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import train
from slime.launch import prepare
from slime.utils import misc as heartbeat_module
from slime.utils.misc import heartbeat
from slime.utils.tiny_models import save_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def test_heartbeat_prints_while_the_block_runs_and_nothing_for_a_short_one(capsys):
    with heartbeat("waiting", every=0.02):
        time.sleep(0.15)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 2 and all(line.startswith("waiting (") and line.endswith(" s)") for line in lines), lines
    with heartbeat("quick", every=5):
        pass
    assert capsys.readouterr().err == ""
    count = iter(range(100))
    with heartbeat(lambda: f"made {next(count)}", every=0.02):
        time.sleep(0.1)
    assert capsys.readouterr().err.splitlines()[0].startswith("made 0 (")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(save_tiny_checkpoint(tmp_path_factory.mktemp("silent") / "m", hidden_size=16, num_layers=1,
                                    num_heads=2))


def test_a_slow_pre_flight_says_it_is_still_checking(model, tmp_path, monkeypatch, capsys):
    data = tmp_path / "tasks.jsonl"
    data.write_text('{"input": "go", "label": "x"}\n')
    slow, during = prepare.preflight, []

    def slow_preflight(args):  # what is printed while the pre-flight runs, and only then
        capsys.readouterr()
        time.sleep(0.3)
        during.extend(capsys.readouterr().err.splitlines())
        return slow(args)

    monkeypatch.setattr(prepare, "preflight", slow_preflight)
    monkeypatch.setattr(heartbeat_module, "HEARTBEAT_EVERY", 0.05)
    code = train.main(["--hf-checkpoint", model, "--prompt-data", str(data), "--num-rollout", "1",
                       "--allow-no-reward", "--dry-run"])
    assert code == 0
    assert during and all(line.startswith("train.py: still checking the inputs; nothing is started yet (")
                          for line in during), during


def test_a_mistyped_flag_is_answered_before_torch_is_imported():
    code = ("import sys, train\n"
            "try:\n    train.main(['--num-rolout', '1'])\nexcept SystemExit as e:\n    code = e.code\n"
            "print(code, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False"], out.stdout + out.stderr
    assert "error: unrecognized arguments: --num-rolout 1 (--num-rolout: did you mean --num-rollout?)" in out.stderr


def test_an_install_stage_prints_while_pip_runs_and_keeps_its_exit_status():
    # make venv runs each pip install through it: pip -q alone was silent for minutes.
    def stage(command):
        return subprocess.run(["bash", "scripts/with-progress.sh", "make venv: 3/5 torch", "bash", "-c", command],
                              cwd=ROOT, capture_output=True, text=True, timeout=60, env={"PROGRESS_EVERY": "1",
                                                                                          "PATH": "/usr/bin:/bin"})

    out = stage("sleep 2.5")
    lines = [line.split("] ", 1)[1] for line in out.stdout.splitlines()]
    assert out.returncode == 0 and lines[0] == "make venv: 3/5 torch", out.stdout
    assert any(re.fullmatch(r"make venv: 3/5 torch: still running \(\d+ s\)", line) for line in lines), lines
    assert lines[-1].startswith("make venv: 3/5 torch: done in ")
    failed = stage("exit 3")
    assert failed.returncode == 3 and failed.stdout.splitlines()[-1].endswith("make venv: 3/5 torch: failed (exit 3)")
    makefile = (ROOT / "Makefile").read_text()
    # every install: pip, torch, megatron-core, the dependencies, and SGLang's own venv (make sglang-env)
    assert makefile.count("$(PROGRESS) ") == 5


def test_waiting_for_a_server_says_so(monkeypatch, capsys):
    from slime.backends.sglang_utils import wait_healthy

    def slow_wait(host, port, pid, timeout):
        time.sleep(0.2)
        return True

    monkeypatch.setattr(wait_healthy, "wait", slow_wait)
    monkeypatch.setattr(heartbeat_module, "HEARTBEAT_EVERY", 0.05)
    assert wait_healthy.main(["--port", "1234", "--pid", "1"]) == 0
    assert capsys.readouterr().err.splitlines()[0].startswith("wait_healthy: the server on port 1234 is still "
                                                               "loading (")


def test_an_evaluation_says_it_runs_and_what_it_found(monkeypatch, capsys):
    # The demo's last evaluation (96 episodes) held the progress bar at 39/40 for about 50 s without a word.
    class Manager:
        eval_sets = {"gridnav": type("Set", (), {"samples": [object()] * 96})()}

        def evaluate(self, rollout_id):
            time.sleep(0.1)
            return {"eval/gridnav/reward": 0.5, "eval/gridnav/success_rate": 0.5625}

    monkeypatch.setattr(heartbeat_module, "HEARTBEAT_EVERY", 0.03)
    assert train._evaluate(Manager(), 39)["eval/gridnav/success_rate"] == 0.5625  # every digit kept for the row
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "train.py: evaluating after step 39: gridnav (96 tasks)"
    assert lines[1].startswith("train.py: still evaluating after step 39 (") and lines[-2].endswith(" s)"), lines
    assert re.fullmatch(r"train\.py: evaluated after step 39 in \d+ s, gridnav success 0\.56", lines[-1]), lines
    train._evaluate(Manager(), -1)
    assert capsys.readouterr().err.splitlines()[0] == "train.py: evaluating before training: gridnav (96 tasks)"
    # Under the training bar, as in a run: every line starts a line of its own, none lands on the bar's end.
    from tqdm import tqdm

    bar = tqdm(total=2, desc="train", file=sys.stderr)
    bar.update(1)
    train._evaluate(Manager(), 0)
    bar.close()
    err = capsys.readouterr().err
    assert err.count("train.py: still evaluating after step 0") >= 1, err
    assert all(err[i - 1] in "\r\n" for i in (m.start() for m in re.finditer("train.py: ", err))), err
