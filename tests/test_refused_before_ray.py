"""What the runtime or the example cannot honour is refused before Ray, in one line naming the fix, by ``--dry-run``
as by the run; the GPU script refuses at once on a machine that cannot run it.

Before: ``--partial-rollout`` passed ``--dry-run`` and met the agent loop's ``assert`` once Ray was up; PPO with
``--kl-ctrl adaptive`` named its missing flags one per try; ``bash scripts/run-qwen3-8B-tcod-runtime.sh`` on a
machine without a GPU ended "teacher server died; see <SAVE>.teacher.log", a file that was never written.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from slime.arguments.argument_error import ArgumentError
from slime.launch.checks import MULTI_TURN_GENERATE, check_launch
from slime.utils.arguments import get_parser, parse_args, validate_args

ROOT = Path(__file__).resolve().parents[1]
GPU_SCRIPT = ROOT / "scripts/run-qwen3-8B-tcod-runtime.sh"
BASE = ["--hf-checkpoint", "m", "--num-rollout", "1"]
PPO = [*BASE, "--advantage-estimator", "ppo", "--kl-ctrl", "adaptive"]


def _error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv=argv)
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    return line.split(": error: ", 1)[1]


def test_partial_rollout_is_refused_naming_the_fix(capsys):
    assert _error(capsys, [*BASE, "--partial-rollout"]) == (
        "--partial-rollout is not implemented by this runtime (an aborted sample is never resumed in a later step "
        "here, and an agent's episode cannot be): drop --partial-rollout")


def test_partial_rollout_is_listed_with_the_other_refused_flags(capsys):
    line = _error(capsys, [*BASE, "--partial-rollout", "--colocate"])
    assert line.startswith("2 slime flag(s) this runtime does not implement, with what to use instead: "
                           "--partial-rollout (drop it: not implemented;"), line
    assert "; --colocate (drop it" in line


@pytest.mark.parametrize("given,named", [
    ([], "--kl-coef > 0 (got 0) and --kl-target > 0 (not given)"),
    (["--kl-horizon", "0"], "--kl-coef > 0 (got 0), --kl-target > 0 (not given) and --kl-horizon > 0 (got 0)"),
    (["--kl-coef", "0.05"], "--kl-target > 0 (not given)"),
    (["--kl-target", "0.1", "--kl-coef", "-0"], "--kl-coef > 0 (got -0)"),
])
def test_ppo_with_the_adaptive_controller_names_every_missing_flag_at_once(capsys, given, named):
    line = _error(capsys, [*PPO, *given])
    assert line == (f"--kl-ctrl adaptive needs {named}: set {'them' if ' and ' in named else 'it'} "
                    "(docs/en/advanced/adaptive-kl-controller.md says how to choose)")


def test_ppo_with_the_adaptive_controller_runs_once_both_are_set():
    args = parse_args(argv=[*PPO, "--kl-coef", "0.05", "--kl-target", "0.1"])
    assert args.kl_horizon == 10000.0


def test_the_agent_loop_named_by_hand_needs_turns_and_an_environment(tmp_path):
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps({"input": "x", "label": "{}", "metadata": {"env": "gridnav", "seed": 0}}) + "\n")
    argv = ["--num-rollout", "1", "--prompt-data", str(tasks), "--allow-no-reward",
            "--custom-generate-function-path", MULTI_TURN_GENERATE]
    with pytest.raises(ArgumentError) as err:
        check_launch(validate_args(get_parser().parse_args(argv)))
    assert str(err.value) == (
        f"--custom-generate-function-path {MULTI_TURN_GENERATE} plays multi-turn episodes and needs --max-turns N (or "
        "max_turns in the --custom-config-path YAML) and --rollout-interaction-env-path MODULE (the environment): "
        "add them")
    # Both given: the launch checks pass (nothing else is missing).
    check_launch(validate_args(get_parser().parse_args(
        [*argv, "--max-turns", "3", "--rollout-interaction-env-path", "examples.agent_envs"])))


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_train_py_refuses_partial_rollout_before_ray(tmp_path, dry_run):
    argv = [sys.executable, "train.py", *(["--dry-run"] if dry_run else []), "--hf-checkpoint", str(tmp_path),
            "--prompt-data", str(tmp_path / "t.jsonl"), "--num-rollout", "1", "--max-turns", "3",
            "--rollout-interaction-env-path", "examples.agent_envs", "--partial-rollout"]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip() == ("train.py: error: --partial-rollout is not implemented by this runtime (an aborted "
                                  "sample is never resumed in a later step here, and an agent's episode cannot be): "
                                  "drop --partial-rollout")
    assert "Ray" not in out.stdout


# ---------------------------------------------------------------- the GPU script, without DRY_RUN


def _fake_tools(tmp_path: Path, gpus: int, sglang: bool) -> dict:
    """PATH with an ``nvidia-smi`` listing ``gpus`` devices; with ``sglang``, a package on PYTHONPATH whose
    ``launch_server`` writes a line and exits 1, as a server that fails to load does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {i}: Fake (UUID: GPU-{i})'\n" for i in range(gpus)))
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if k not in {"DRY_RUN", "REHEARSAL", "STUDENT", "TEACHER", "DATA", "EVAL_DATA", "SAVE", "NUM_GPUS"}}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    if sglang:
        package = tmp_path / "site" / "sglang"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "launch_server.py").write_text("print('fake sglang: CUDA error: no device')\nraise SystemExit(1)\n")
        env["PYTHONPATH"] = f"{package.parent}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def _run_script(env: dict, **variables) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(GPU_SCRIPT)], cwd=ROOT, env={**env, **variables}, capture_output=True,
                          text=True, timeout=180)


def test_the_gpu_script_without_a_gpu_names_dry_run_at_once(tmp_path):
    out = _run_script(_fake_tools(tmp_path, gpus=0, sglang=True))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == ("run-qwen3-8B-tcod-runtime.sh: NUM_GPUS=8 but this machine shows 0 GPU(s) (nvidia-smi -L): "
                          "DRY_RUN=1 checks the flags and prints the plan without a GPU (REHEARSAL=1 runs them on "
                          "CPU)\n")


def test_the_gpu_script_without_sglang_names_dry_run_at_once(tmp_path):
    env = _fake_tools(tmp_path, gpus=8, sglang=False)
    python = str(ROOT / ".venv/bin/python") if (ROOT / ".venv/bin/python").exists() else sys.executable
    probe = subprocess.run([python, "-c", "import importlib.util; print(importlib.util.find_spec('sglang'))"],
                           env=env, capture_output=True, text=True)
    if probe.stdout.strip() != "None":
        pytest.skip("SGLang is installed in this Python")
    out = _run_script(env, PYTHON=python)
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert line.startswith(f"run-qwen3-8B-tcod-runtime.sh: PYTHON={python} has no SGLang"), line
    assert line.endswith("DRY_RUN=1 checks the flags and prints the plan without it"), line


def test_a_teacher_server_that_dies_points_to_a_log_that_exists(tmp_path):
    env = _fake_tools(tmp_path, gpus=8, sglang=True)
    data = tmp_path / "data"
    data.mkdir()
    row = {"input": "task", "label": "{}", "metadata": {"env": "scienceworld", "task": "t", "variation": 0,
                                                        "expert_actions": ["look around"]}}
    for split in ("train", "eval"):
        (data / f"scienceworld_{split}.jsonl").write_text(json.dumps(row) + "\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    save = tmp_path / "not" / "yet" / "run"  # its parent folder does not exist yet
    out = _run_script(env, STUDENT=str(tmp_path), TEACHER=str(tmp_path), DATA_DIR=str(data), SAVE=str(save),
                      TEACHER_PORT=str(port))
    log = Path(f"{save}.teacher.log")
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"its log: {log}" in out.stdout
    assert out.stderr == (f"run-qwen3-8B-tcod-runtime.sh: the teacher server exited before it was healthy; its log: "
                          f"{log} (last line: fake sglang: CUDA error: no device)\n")
    assert log.read_text() == "fake sglang: CUDA error: no device\n"
