"""The inference side of ``train_cpu.py``: this repository's hf_engine as slime's external SGLang engines and as
the OPD teacher server, the tiny student and teacher checkpoints, and the example's gridnav tasks.

slime's ``train.py`` meets them only through its own flags (:func:`rollout_flags`):

* ``--rollout-external-engine-addrs``: N hf_engine processes serving the student. slime reads each one's
  ``/server_info``, starts sglang-router in front of them (the harness venv has the real router; it runs on a CPU)
  and registers them there, then syncs weights with ``--update-weight-transport disk``: pause, flush, reload the
  HF checkpoint the trainer wrote, continue (``tests/test_hf_engine_external.py`` tests those endpoints).
* ``--rm-url``: one more hf_engine serving the teacher, which slime's OPD ``reward_func`` asks to score every
  trajectory (``--opd-type sglang``).

The checkpoints are Qwen3-shaped (``slime.utils.tiny_models``: ChatML, a character-level tokenizer), the teacher
a different initialisation of the same shape, so the student-teacher reverse KL is far from zero. The tasks come
from the example itself (``python -m examples.multi_turn_tcod.envs.make_data`` run inside SLIME_DIR), so a
change there is what the cases run.

Command line (starts everything, prints the flags, serves until Ctrl-C)::

    python tools/slime_pr/train_cpu_engines.py SLIME_DIR --out DIR [--students 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from slime.backends.sglang_utils.launcher import find_free_port  # noqa: E402
from slime.utils.tiny_models import build_tiny_model, build_tokenizer, save_tiny_checkpoint  # noqa: E402

HOST = "127.0.0.1"
# The model shape both checkpoints share (2 layers of 64, 4 heads): the trainer converts it to Megatron and back.
MODEL_SHAPE = {"hidden_size": 64, "num_layers": 2, "num_heads": 4}
STUDENT_SEED, TEACHER_SEED = 0, 1
# A freshly initialised tiny model predicts nearly uniformly (log p ~ -log(vocab) everywhere), so two of them differ
# by ~0.02 nats a token: too little for an advantage check to see a misaligned teacher. The teacher's output layer is
# scaled up, which makes it confident (logits ~16x wider) and its reverse KL to the student large.
TEACHER_LOGIT_SCALE = 16.0
# gridnav tasks as the TCOD GPU test makes them (4x4 grids, expert paths of 2..MAX_TURNS moves, so B2F replays
# a prefix at every depth), fewer of them; with a reward for every step closer to the goal, so that B2F's replayed
# expert steps earn an environment return that pure OPD must keep out of the reward.
GRIDNAV = {"size": 4, "min_len": 2, "shaping": 0.1}
START_TIMEOUT_S = 180


def make_checkpoints(out: Path, **shape) -> tuple[Path, Path]:
    """``out/student`` and ``out/teacher``: HF folders (safetensors, tokenizer, chat template) of one shape."""
    import torch

    shape = {**MODEL_SHAPE, **shape}
    student = save_tiny_checkpoint(Path(out) / "student", seed=STUDENT_SEED, **shape)
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, seed=TEACHER_SEED, **shape)
    with torch.no_grad():
        model.lm_head.weight.mul_(TEACHER_LOGIT_SCALE)
    teacher = save_tiny_checkpoint(Path(out) / "teacher", model=model, tokenizer=tokenizer)
    return student, teacher


def make_gridnav_data(slime_dir: Path, out: Path, *, n_train: int = 16, n_eval: int = 4, max_len: int = 4,
                      python: str = sys.executable) -> tuple[Path, Path]:
    """``out/train.jsonl`` and ``out/eval.jsonl`` (eval tasks disjoint from training ones), written by the
    example's ``make_data`` in ``slime_dir``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "train.jsonl", out / "eval.jsonl"
    for path, n, seed, extra in ((paths[0], n_train, 0, []), (paths[1], n_eval, 100000, ["--exclude", str(paths[0])])):
        cmd = [python, "-m", "examples.multi_turn_tcod.envs.make_data", "--n", str(n), "--seed", str(seed),
               "--size", str(GRIDNAV["size"]), "--min-len", str(GRIDNAV["min_len"]), "--max-len", str(max_len),
               "--shaping", str(GRIDNAV["shaping"]),
               "--out", str(path), *extra]
        done = subprocess.run(cmd, cwd=slime_dir, env=_env_without_pythonpath(), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"make_data failed in {slime_dir} ({' '.join(cmd[1:4])}): {done.stderr.strip()[-800:]}")
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if len(rows) != n or not all(row["metadata"].get("expert_actions") for row in rows):
            raise RuntimeError(f"{path}: expected {n} gridnav tasks with expert actions, got {len(rows)}")
    return paths


def _env_without_pythonpath() -> dict:
    # The example must import from SLIME_DIR (the cwd), not from this repository's copy of it.
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@dataclass
class Engine:
    role: str
    model_path: Path
    port: int
    process: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


@dataclass
class Engines:
    """Running hf_engine processes: ``students`` (slime's external rollout engines) and the ``teacher``."""

    students: list[Engine]
    teacher: Engine | None
    all: list[Engine] = field(default_factory=list)

    def stop(self) -> None:
        for engine in self.all:
            if engine.process.poll() is None:
                engine.process.terminate()
        for engine in self.all:
            try:
                engine.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                engine.process.kill()
                engine.process.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _launch(role: str, model_path: Path, log_dir: Path, seed: int, python: str) -> Engine:
    port = find_free_port(HOST)
    log = Path(log_dir) / f"hf_engine_{role}.log"
    cmd = [python, "-m", "slime.backends.hf_engine", "--model-path", str(model_path), "--host", HOST,
           "--port", str(port), "--random-seed", str(seed), "--threads", "1", "--parent-pid", str(os.getpid())]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    with open(log, "w") as out:
        process = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    return Engine(role, Path(model_path), port, process, log)


def _wait_healthy(engine: Engine, deadline: float) -> None:
    while time.monotonic() < deadline:
        if engine.process.poll() is not None:
            tail = engine.log.read_text()[-1500:]
            raise RuntimeError(f"hf_engine {engine.role} exited with {engine.process.returncode}; "
                               f"{engine.log}:\n{tail}")
        try:
            with urllib.request.urlopen(f"{engine.url}/health_generate", timeout=30) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"hf_engine {engine.role} not healthy after {START_TIMEOUT_S} s; see {engine.log}")


def start_engines(student: Path, teacher: Path | None, log_dir: Path, *, students: int = 2,
                  python: str = sys.executable) -> Engines:
    """Start ``students`` engines on ``student`` (one seed each, as slime seeds its engines) and, unless
    ``teacher`` is None (``--opd-type megatron``), one on ``teacher``; return once all answer
    ``/health_generate``. They exit with this process (``--parent-pid``)."""
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    launched = [_launch(f"student{i}", student, log_dir, i, python) for i in range(students)]
    teacher_engine = _launch("teacher", teacher, log_dir, 1000, python) if teacher is not None else None
    engines = Engines(launched, teacher_engine, launched + ([teacher_engine] if teacher_engine else []))
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        for engine in engines.all:
            _wait_healthy(engine, deadline)
    except BaseException:
        engines.stop()
        raise
    return engines


def rollout_flags(engines: Engines) -> list[str]:
    """slime's flags for these engines: external rollout engines, and the teacher server when there is one."""
    flags = ["--rollout-external-engine-addrs", *(f"{HOST}:{e.port}" for e in engines.students)]
    if engines.teacher is not None:
        flags += ["--rm-url", f"{engines.teacher.url}/generate"]
    return flags


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Start hf_engine student engines and teacher for slime's train.py.")
    parser.add_argument("slime_dir", type=Path, help="slime checkout with the TCOD PR (its example makes the tasks)")
    parser.add_argument("--out", type=Path, required=True, help="folder for checkpoints, tasks and engine logs")
    parser.add_argument("--students", type=int, default=2, help="student engines (slime's external engines)")
    parser.add_argument("--no-teacher", action="store_true", help="no teacher server (--opd-type megatron)")
    args = parser.parse_args(argv)
    student, teacher = make_checkpoints(args.out / "models")
    train, evaluation = make_gridnav_data(args.slime_dir, args.out / "data")
    with start_engines(student, None if args.no_teacher else teacher, args.out / "logs",
                       students=args.students) as engines:
        print(" ".join(["--hf-checkpoint", str(student), "--prompt-data", str(train), *rollout_flags(engines)]))
        print(f"eval tasks: {evaluation}; teacher checkpoint: {teacher}; Ctrl-C stops the engines", flush=True)
        try:
            while all(e.process.poll() is None for e in engines.all):
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
