"""The inference side of ``train_cpu.py``: the student engines slime's train.py rolls out on and the OPD teacher
server, as real SGLang 0.5.15.post1 servers (``engine="sglang"``, slime's image's version, run by the harness venv's
Python on the CPU) or as this repository's hf_engine (``engine="hf_engine"``, faster to start); the tiny student and
teacher checkpoints; the example's gridnav tasks.

slime's ``train.py`` meets them only through its own flags (:func:`rollout_flags`):

* ``--rollout-external-engine-addrs``: N servers of the student. slime reads each one's ``/server_info``, starts
  sglang-router in front of them (the harness venv has the real router; it runs on a CPU) and registers them there,
  then syncs weights with ``--update-weight-transport disk``: pause, flush, reload the HF checkpoint the trainer
  wrote, continue.
* ``--rm-url``: one more server of the teacher, which slime's OPD ``reward_func`` asks to score every trajectory
  (``--opd-type sglang``).

SGLang on a CPU (SGLang's own server, scheduler, Qwen3 model class, radix cache, sampler and log-prob processor, every
layer on its ``forward_native`` path) needs ``SGLANG_USE_CPU_ENGINE=1`` and the settings in :data:`SGLANG_CPU_ARGS`;
fp32 so that its log-probs match transformers' (the checks recompute them). SGLang has no ``--parent-pid``: the
servers carry train_cpu's reaper token, and the reaper ends them with the case.

The checkpoints are Qwen3-shaped (``slime.utils.tiny_models``: ChatML, a character-level tokenizer), the teacher
a different initialisation of the same shape, so the student-teacher reverse KL is far from zero. The tasks come
from the example itself (``python -m examples.multi_turn_tcod.envs.make_data`` run inside SLIME_DIR), so a
change there is what the cases run.

Command line (starts everything, prints the flags, serves until Ctrl-C)::

    python tools/slime_pr/train_cpu_engines.py SLIME_DIR --out DIR [--students 2] [--engine sglang|hf_engine]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
# hf_engine starts in ~20 s; SGLang in 50-94 s alone on 2 cores (its imports), and 3 servers start together here.
START_TIMEOUT_S = {"hf_engine": 240, "sglang": 900}
# SGLang's CPU path (its server_args names): the CPU device, the torch-native attention and sampling, no CUDA graph,
# no overlap scheduler (it needs CUDA streams), no warm-up request, a small KV pool. fp32 keeps its log-probs
# within ~1e-6 of transformers'. --sleep-on-idle: an idle scheduler otherwise polls, and three of them took ~15% of a
# core each while train.py started beside them on 2 cores. On a CPU SGLang checks its fraction against the machine's
# free memory before and after loading the weights, so other processes allocating meanwhile count as the model's:
# 0.05 failed ("Loaded weights leave no GPU memory for the KV cache ... above 0.098") with 3 servers starting
# beside other work. The KV pool itself is --max-total-tokens, whatever the fraction.
SGLANG_CPU_ARGS = ("--device", "cpu", "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
                   "--disable-cuda-graph", "--disable-overlap-schedule", "--skip-server-warmup", "--sleep-on-idle",
                   "--max-total-tokens", "8192", "--mem-fraction-static", "0.5", "--dtype", "float32")


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
    engine: str = "hf_engine"

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
                engine.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                engine.process.kill()
                engine.process.wait()
            if engine.engine == "sglang":  # its scheduler and detokenizer share its session: none is left behind
                try:
                    os.killpg(engine.process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _launch(role: str, model_path: Path, log_dir: Path, seed: int, python: str, engine: str,
            sglang_python: str | None) -> Engine:
    port = find_free_port(HOST)
    log = Path(log_dir) / f"{engine}_{role}.log"
    if engine == "sglang":
        if not sglang_python:
            raise RuntimeError("engine sglang needs the harness venv's python (train_cpu_env.build_venv())")
        cmd = [sglang_python, "-m", "sglang.launch_server", "--model-path", str(model_path), *SGLANG_CPU_ARGS,
               "--host", HOST, "--port", str(port), "--random-seed", str(seed)]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "CUDA_"))}
        env.update(SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   TOKENIZERS_PARALLELISM="false", PATH=f"{Path(sglang_python).parent}{os.pathsep}{env['PATH']}")
        cwd = log_dir
    else:
        cmd = [python, "-m", "slime.backends.hf_engine", "--model-path", str(model_path), "--host", HOST,
               "--port", str(port), "--random-seed", str(seed), "--threads", "1", "--parent-pid", str(os.getpid())]
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        cwd = REPO
    with open(log, "w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        process = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=engine == "sglang")
    return Engine(role, Path(model_path), port, process, log, engine)


def _wait_healthy(engine: Engine, deadline: float, timeout_s: int, progress=None, t0: float = 0.0) -> None:
    last_said = time.monotonic()
    while time.monotonic() < deadline:
        if progress and time.monotonic() - last_said >= 15:
            progress(f"  still starting: {engine.engine} {engine.role} not healthy yet ({time.monotonic() - t0:.0f}s)")
            last_said = time.monotonic()
        if engine.process.poll() is not None:
            tail = engine.log.read_text(errors="replace")[-1500:]
            raise RuntimeError(f"{engine.engine} {engine.role} exited with {engine.process.returncode}; "
                               f"{engine.log}:\n{tail}")
        try:
            with urllib.request.urlopen(f"{engine.url}/health_generate", timeout=30) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"{engine.engine} {engine.role} not healthy after {timeout_s} s; see {engine.log}")


def start_engines(student: Path, teacher: Path | None, log_dir: Path, *, students: int = 2,
                  python: str = sys.executable, engine: str = "hf_engine", sglang_python: str | None = None,
                  progress=None) -> Engines:
    """Start ``students`` engines on ``student`` (one seed each, as slime seeds its engines) and, unless
    ``teacher`` is None (``--opd-type megatron``), one on ``teacher``; return once all answer
    ``/health_generate``. hf_engine exits with this process (``--parent-pid``); SGLang, which has no such flag,
    is stopped by :meth:`Engines.stop` or, if this process dies first, by train_cpu's reaper."""
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    launched = [_launch(f"student{i}", student, log_dir, i, python, engine, sglang_python) for i in range(students)]
    teacher_engine = (_launch("teacher", teacher, log_dir, 1000, python, engine, sglang_python)
                      if teacher is not None else None)
    engines = Engines(launched, teacher_engine, launched + ([teacher_engine] if teacher_engine else []))
    t0 = time.monotonic()
    if progress:
        progress(f"{len(engines.all)} {engine} server(s) starting (logs in {log_dir})")
    try:
        deadline = t0 + START_TIMEOUT_S[engine]
        for each in engines.all:
            _wait_healthy(each, deadline, START_TIMEOUT_S[engine], progress, t0)
    except BaseException:
        engines.stop()
        raise
    if progress:
        progress(f"{len(engines.all)} {engine} server(s) healthy after {time.monotonic() - t0:.0f}s")
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
    parser.add_argument("--engine", choices=("sglang", "hf_engine"), default="sglang")
    args = parser.parse_args(argv)
    student, teacher = make_checkpoints(args.out / "models")
    train, evaluation = make_gridnav_data(args.slime_dir, args.out / "data")
    sglang_python = None
    if args.engine == "sglang":
        from tools.slime_pr.train_cpu_env import build_venv

        sglang_python = str(build_venv() / "bin/python")
    with start_engines(student, None if args.no_teacher else teacher, args.out / "logs", students=args.students,
                       engine=args.engine, sglang_python=sglang_python, progress=print) as engines:
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
