"""CPU rehearsal of a GPU launch: the script's own train.py flags, end to end, for 2 rollouts.

    python -m scripts.rehearsal --task-env scienceworld [--dir DIR] -- TRAIN_PY_FLAGS...

(``REHEARSAL=1 bash scripts/run-qwen3-8B-tcod-runtime.sh`` calls it.) Only what needs a GPU or the
cluster's files is swapped, and each swap is printed:

* checkpoints: tiny Qwen3-shaped models made here stand in for the student and the teacher;
* SGLang: this project's ``hf_engine`` serves the teacher (and the rollout engine);
* devices: 1 trainer process and 1 engine; Megatron's model-shape flags are dropped (the tiny model's
  own config.json describes it);
* data: a few tasks of the same environment made with ``make_data``, in the same format;
* sizes: 2 rollouts of 2 episodes, at most 3 turns of 16 tokens (a 2-core CPU must finish in minutes), in
  a response budget of 3072 tokens: the tiny tokenizer spends a token per character, so a B2F step's replayed
  expert prefix (ScienceWorld observations run to some hundred characters a turn) needs that much room before
  the student's first turn, or every episode is removed and the step skipped.

Everything else runs as written: the environment path, the generate / rollout / reward / log hooks,
the curriculum flags, the evaluation. Outputs (``metrics.jsonl`` included) go under ``--dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Megatron's flags that describe the real model's shape; the tiny model's config.json replaces them.
SHAPE_FLAGS = {
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
    "--kv-channels", "--vocab-size", "--rotary-base", "--norm-epsilon", "--max-position-embeddings",
    "--seq-length", "--make-vocab-size-divisible-by",
}
MAX_TURNS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def split_flags(argv: list[str]) -> list[list[str]]:
    """``[flag, value...]`` groups; a value is any token that does not start with ``--``."""
    groups: list[list[str]] = []
    for token in argv:
        if token.startswith("--") or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    return groups


def rewrite(argv: list[str], replace: dict[str, list[str]], drop: set[str]) -> tuple[list[str], list[str]]:
    """``argv`` with the values of ``replace``'s flags swapped (added if absent) and ``drop``'s flags removed.

    Returns the new argv and one line per change, for the user to see what the rehearsal altered."""
    out, changes, seen = [], [], set()
    for flag, *values in split_flags(argv):
        if flag in drop:
            changes.append(f"dropped {flag} {' '.join(values)}".rstrip())
        elif flag in replace:
            seen.add(flag)
            out += [flag, *replace[flag]]
            if values != replace[flag]:
                changes.append(f"{flag} {' '.join(values)} -> {' '.join(replace[flag])}")
        else:
            out += [flag, *values]
    for flag, values in replace.items():
        if flag not in seen:
            out += [flag, *values]
            changes.append(f"added {flag} {' '.join(values)}")
    return out, changes


class RehearsalError(RuntimeError):
    pass


def _run(cmd: list[str]) -> None:
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        raise RehearsalError(f"{' '.join(cmd[1:4])} ... exited {out.returncode}: " + " | ".join(tail))


def prepare(work: Path, task_env: str, python: str) -> dict[str, Path]:
    """Tiny student and teacher, and a few train / eval tasks of ``task_env``."""
    paths = {"student": work / "student", "teacher": work / "teacher", "train": work / "train.jsonl",
             "eval": work / "eval.jsonl"}
    for name, seed in (("student", 0), ("teacher", 1)):
        _run([python, "-m", "slime.utils.tiny_models", "--out", str(paths[name]), "--hidden-size", "32",
              "--num-layers", "1", "--num-heads", "2", "--seed", str(seed)])
    # Held-out tasks from later seeds (a few environments have only some hundred task variants).
    for name, n, seed in (("train", 4, 0), ("eval", 2, 50)):
        _run([python, "-m", "examples.agent_envs.make_data", "--env", task_env, "--n", str(n), "--seed", str(seed),
              "--out", str(paths[name])])
    return paths


def rehearsal_max_turns(groups: dict[str, list[str]], train: Path) -> int:
    """MAX_TURNS student turns; under B2F the replayed expert prefix counts against --max-turns too (the official
    cap), so the limit leaves MAX_TURNS - 1 student turns after the longest prefix the rehearsal's tasks replay."""
    if groups.get("--tcod-mode") != ["b2f"]:
        return MAX_TURNS
    longest = max(len(json.loads(line).get("metadata", {}).get("expert_actions") or [])
                  for line in train.read_text().splitlines() if line.strip())
    return max(MAX_TURNS, longest + MAX_TURNS - 1)


def _small_config(path: str, work: Path, max_turns: int = MAX_TURNS) -> str:
    """A copy of the ``--custom-config-path`` YAML with the turn settings at the rehearsal's sizes."""
    import yaml

    data = yaml.safe_load((ROOT / path).read_text()) or {}  # an absolute path replaces ROOT
    for key, value in (("max_turns", max_turns), ("max_turn_response_len", 16)):
        if key in data:
            data[key] = value
    out = work / Path(path).name
    out.write_text(yaml.safe_dump(data))
    return str(out)


def _wait_stopping_on_ctrl_c(proc: subprocess.Popen, grace: float = 120.0) -> int:
    """train.py's exit code. On Ctrl-C it is given ``grace`` s to stop its engines, trainers and Ray itself:
    ``subprocess.run`` would SIGKILL it at once and leave its Ray processes behind."""
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)  # a terminal's Ctrl-C reached it already; train.py ignores a second
        try:
            return proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


def rehearse(argv: list[str], task_env: str, work: Path, python: str = sys.executable,
             extra_replace: dict[str, list[str]] | None = None, drop: set[str] = frozenset()) -> int:
    """Run ``argv`` (a launch's train.py flags) with the swaps above; ``extra_replace`` / ``drop``: more."""
    work.mkdir(parents=True, exist_ok=True)
    print(f"rehearsal: tiny models and {task_env} tasks under {work}", flush=True)
    paths = prepare(work, task_env, python)
    port = _free_port()
    groups = {g[0]: g[1:] for g in split_flags(argv)}
    max_turns = rehearsal_max_turns(groups, paths["train"])
    replace = {
        "--hf-checkpoint": [str(paths["student"])],
        "--prompt-data": [str(paths["train"])],
        "--num-rollout": ["2"],
        "--rollout-batch-size": ["2"],
        "--global-batch-size": ["2"],
        "--actor-num-gpus-per-node": ["1"],
        "--rollout-num-gpus": ["1"],
        "--rollout-backend": ["hf_engine"],
        "--max-turn-response-len": ["16"],
        "--rollout-max-response-len": ["3072"],
        "--save": [str(work / "ckpt")],
        "--metrics-dir": [str(work)],
    }
    if "--ref-load" in groups:
        replace["--ref-load"] = [str(paths["student"])]
    if "--rm-url" in groups or groups.get("--opd-type") == ["sglang"]:
        replace["--rm-url"] = [f"http://127.0.0.1:{port}/generate"]
    if "--opd-teacher-load" in groups:
        replace["--opd-teacher-load"] = [str(paths["teacher"])]
    if "--eval-prompt-data" in groups:
        replace["--eval-prompt-data"] = [groups["--eval-prompt-data"][0], str(paths["eval"])]
    for flag in ("--max-turns", "--tcod-k-max"):
        if flag in groups:
            replace[flag] = [str(max_turns)]
    for flag in ("--max-tokens-per-gpu", "--log-probs-max-tokens-per-gpu", "--eval-max-response-len"):
        if flag in groups:
            replace[flag] = ["1024"]
    if "--tensor-model-parallel-size" in groups:
        replace["--tensor-model-parallel-size"] = ["1"]
    if "--custom-config-path" in groups:
        replace["--custom-config-path"] = [_small_config(groups["--custom-config-path"][0], work, max_turns)]
    replace.update(extra_replace or {})
    new_argv, changes = rewrite(argv, replace, drop=SHAPE_FLAGS | {"--load"} | set(drop))
    for change in changes:
        print(f"rehearsal: {change}")
    teacher = None
    if "--rm-url" in replace:
        log = work / "teacher_server.log"
        teacher = subprocess.Popen([python, "-m", "slime.backends.hf_engine", "--model-path", str(paths["teacher"]),
                                    "--port", str(port), "--random-seed", "0"], cwd=ROOT,
                                   stdout=open(log, "w"), stderr=subprocess.STDOUT)
        _run([python, "-m", "slime.backends.sglang_utils.wait_healthy", "--port", str(port), "--pid", str(teacher.pid)])
        print(f"rehearsal: teacher = hf_engine on 127.0.0.1:{port} (log {log})", flush=True)
    try:
        rc = _wait_stopping_on_ctrl_c(subprocess.Popen([python, "train.py", *new_argv], cwd=ROOT))
    finally:
        if teacher is not None:
            teacher.terminate()
            teacher.wait(timeout=30)
    metrics = work / "metrics.jsonl"
    print(f"rehearsal: train.py exited {rc}; metrics {metrics if metrics.exists() else 'missing'}")
    return rc if rc or metrics.exists() else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task-env", required=True, help="environment of the tasks (make_data --env)")
    parser.add_argument("--dir", default=None, help="where outputs go (default: a new temporary folder)")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then the script's train.py flags")
    ns = parser.parse_args(argv)
    train_args = ns.train_args[1:] if ns.train_args[:1] == ["--"] else ns.train_args
    work = Path(ns.dir) if ns.dir else Path(tempfile.mkdtemp(prefix="slime-rehearsal-"))
    if (work / "metrics.jsonl").exists():  # train.py would refuse to mix two runs' rows there, after the setup
        print(f"rehearsal: error: {work} holds an earlier rehearsal (metrics.jsonl): choose a new folder "
              "(REHEARSAL_DIR, or leave it unset for a new temporary one)", file=sys.stderr)
        return 2
    try:
        return rehearse(train_args, ns.task_env, work, python=os.environ.get("PYTHON", sys.executable))
    except RehearsalError as err:
        print(f"rehearsal: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
