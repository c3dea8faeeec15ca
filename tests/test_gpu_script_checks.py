"""scripts/run-qwen3-8B-tcod-runtime.sh checks its own variables first and names them (exit 2, one line).

Before: NUM_GPUS=2 TEACHER_GPUS=2 reached train.py, which named --actor-num-gpus-per-node, a flag the user
never typed. Valid variables get past the checks to the script's next one (the task file, named by DATA).
"""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "run-qwen3-8B-tcod-runtime.sh"


def run(**variables):
    env = {k: v for k, v in os.environ.items() if k not in ("TCOD_MODE", "NUM_GPUS", "TEACHER_GPUS", "TP")}
    out = subprocess.run(["bash", f"scripts/{SCRIPT}"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**env, "DRY_RUN": "1", "DATA": "/nonexistent/train.jsonl", **variables})
    return out.returncode, out.stderr.strip().splitlines()


def _gpu_host(tmp_path: Path) -> dict:
    """PATH and PYTHONPATH of a machine with 8 GPUs and SGLang, as far as the script's first checks can tell."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/nvidia-smi").write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {i}: Fake'\n" for i in range(8)))
    (tmp_path / "bin/nvidia-smi").chmod(0o755)
    (tmp_path / "site/sglang").mkdir(parents=True)
    (tmp_path / "site/sglang/__init__.py").write_text("")
    return {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(tmp_path / "site")}


@pytest.mark.parametrize("variables,line", [
    ({"NUM_GPUS": "2", "TEACHER_GPUS": "2"}, "NUM_GPUS=2 with TEACHER_GPUS=2 leaves 0 GPU(s) for training; it needs 2 "
     "(the trainer and the rollout engines get GPUs of their own): raise NUM_GPUS or lower TEACHER_GPUS"),
    ({"NUM_GPUS": "3", "TEACHER_GPUS": "2"}, "NUM_GPUS=3 with TEACHER_GPUS=2 leaves 1 GPU(s) for training; it needs 2"),
    ({"NUM_GPUS": "6", "TRAIN_BACKEND": "megatron", "TP": "4"}, "NUM_GPUS=6 with TEACHER_GPUS=2 leaves 4 GPU(s) for "
     "training; it needs 5"),
    ({"NUM_GPUS": "eight"}, "NUM_GPUS=eight must be a whole number >= 1"),
    ({"TEACHER_GPUS": "0"}, "TEACHER_GPUS=0 must be a whole number >= 1"),
    ({"TP": "-2"}, "TP=-2 must be a whole number >= 1"),
    ({"TEACHER_PORT": "70000"}, "TEACHER_PORT=70000 must be a port number (1-65535)"),
    ({"TCOD_MODE": "B2F"}, "TCOD_MODE=B2F must be f2b or b2f"),
    # A real run (DRY_RUN=0) on a machine with the GPUs and SGLang it needs (faked: tests/test_refused_before_ray.py)
    ({"DRY_RUN": "0", "STUDENT": "/nonexistent/Qwen3-8B", "GPU_HOST": "1"},
     "STUDENT=/nonexistent/Qwen3-8B is not a folder"),
])
def test_a_bad_variable_is_named_before_anything_runs(tmp_path, variables, line):
    variables = dict(variables)
    if variables.pop("GPU_HOST", None):
        variables = {**_gpu_host(tmp_path), **variables}
    code, err = run(**variables)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"{SCRIPT}: {line}"), err


@pytest.mark.parametrize("variables", [{}, {"NUM_GPUS": "4", "TEACHER_GPUS": "2"},
                                       {"NUM_GPUS": "5", "TRAIN_BACKEND": "megatron", "TP": "2"}])
def test_good_variables_pass_to_the_next_check(variables):
    code, err = run(**variables)
    assert code == 2 and err[-1].startswith(f"{SCRIPT}: DATA=/nonexistent/train.jsonl does not exist"), err
