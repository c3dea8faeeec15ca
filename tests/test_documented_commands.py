"""The commands the docs give run as written, and the scripts say what is missing in one line.

* Every ``DRY_RUN=1 ...`` command of README.md and this repository's own docs pages (docs/en, without
  the pull request's page docs/en/advanced/multi-turn-tcod.md) runs from the repository root, with the
  set-up lines of its code block before it (a ``config.json`` written by a heredoc, say; not other
  script runs), and exits 0 with a plan and no traceback. The block's ``make_data`` lines are not run
  (ScienceWorld's take seconds per task and need Java): they must write where the script looks by
  default, and the test puts its own small task files there (``DATA_DIR``) instead. PYTHON is not set:
  the scripts find it themselves.
* The GPU script picks its Python (PYTHON=, else the repository's .venv, else python3), refuses one
  without torch, and names a missing DATA / EVAL_DATA file with the make_data command that writes it:
  one line, exit 2.
* The CPU demo warns after SFT when the teacher is not better than the student.

Each dry run imports torch once (a few seconds); the rest starts no model.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.sft_eval import gap_warning, main as sft_eval_main, sft_successes

ROOT = Path(__file__).resolve().parents[1]
# This repository's pages; the PR's (docs/*/advanced/multi-turn-tcod.md, docs/zh) are upstream's.
OWN_DOCS = sorted(
    p for p in [ROOT / "README.md", *(ROOT / "docs/en").glob("*.md"), *(ROOT / "docs/en").glob("*/*.md")]
    if p != ROOT / "docs/en/advanced/multi-turn-tcod.md"
)
GPU_SCRIPT = "scripts/run-qwen3-8B-tcod-runtime.sh"
FENCE = re.compile(r"^\s*(```|~~~)\s*(\w*)")
HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)'?\"?")
ENVS = ("scienceworld", "alfworld", "webshop")


def _statements(lines: list[str]) -> list[str]:
    """Logical shell statements of a code block: continuations joined, a heredoc kept with its body."""
    out, i = [], 0
    while i < len(lines):
        text = lines[i]
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1] + " " + lines[i].strip()
        heredoc = HEREDOC.search(text)
        if heredoc:
            while i + 1 < len(lines):
                i += 1
                text += "\n" + lines[i]
                if lines[i].strip() == heredoc.group(1):
                    break
        out.append(text)
        i += 1
    return out


def _strip_comment(statement: str) -> str:
    return re.split(r"\s+#\s", statement, maxsplit=1)[0].strip()


def documented_dry_runs() -> list[tuple[str, str, list[str]]]:
    """(where, command, set-up statements before it in its code block) for every documented dry run."""
    found = []
    for path in OWN_DOCS:
        rel = path.relative_to(ROOT).as_posix()
        lines = path.read_text().splitlines()
        block, start, lang = None, 0, ""
        for no, line in enumerate(lines, 1):
            fence = FENCE.match(line)
            if fence and block is None:
                block, start, lang = [], no, fence.group(2).lower()
                continue
            if fence:
                if lang in ("", "bash", "sh", "shell", "console"):
                    statements = [_strip_comment(s) for s in _statements(block)]
                    for i, statement in enumerate(statements):
                        if "DRY_RUN=1" in statement:
                            found.append((f"{rel}:{start}", statement, [s for s in statements[:i] if s]))
                block = None
                continue
            if block is not None:
                block.append(line)
            else:
                for span in re.findall(r"`([^`]*DRY_RUN=1[^`]*)`", line):
                    found.append((f"{rel}:{no}", span, []))
    return found


DRY_RUNS = documented_dry_runs()


def _make_data_outputs(statement: str) -> str | None:
    """The --out of a make_data statement (None for other statements)."""
    if "make_data" not in statement:
        return None
    return re.search(r"--out\s+(\S+)", statement).group(1)


def _task_files(folder: Path) -> Path:
    """One task row per file, shaped as make_data writes it (B2F, the script's default, reads its expert
    actions), at the GPU script's default paths for every TASK_ENV."""
    folder.mkdir(parents=True, exist_ok=True)
    for env in ENVS:
        meta = {"env": env, "task": "find-non-living-thing", "variation": 0}
        row = {"input": "Task Description: find a non-living thing.", "label": json.dumps(meta),
               "metadata": {**meta, "expert_actions": ["look around", "focus on painting"]}}
        for split in ("train", "eval"):
            (folder / f"{env}_{split}.jsonl").write_text(json.dumps(row) + "\n")
    return folder


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in {"PYTHON", "DATA", "EVAL_DATA", "DATA_DIR", "STUDENT", "TEACHER", "TASK_ENV", "TCOD_MODE",
                        "TRAIN_BACKEND", "TP", "DRY_RUN", "REHEARSAL"}}
    return {**env, **extra}


def _python_on_path(tmp_path: Path) -> dict:
    """PATH with this test's Python as python3 when the repository has no .venv for the scripts to find."""
    if (ROOT / ".venv/bin/python").exists():
        return {}
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "python3").symlink_to(sys.executable)
    return {"PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}


def test_the_docs_have_dry_runs_to_check():
    pages = {where.split(":")[0] for where, _, _ in DRY_RUNS}
    assert {"README.md", "docs/en/get_started/quick_start.md", "docs/en/demo.md",
            "docs/en/megatron_backend.md"} <= pages, DRY_RUNS
    assert all(GPU_SCRIPT in command for _, command, _ in DRY_RUNS), DRY_RUNS


@pytest.mark.parametrize("where,command,setup", DRY_RUNS, ids=[f"{w}:{i}" for i, (w, _, _) in enumerate(DRY_RUNS)])
def test_documented_dry_run_runs_as_written(tmp_path, where, command, setup):
    # make_data lines are replaced by this test's task files: they must write the script's default paths.
    script = []
    for statement in setup:
        if "bash scripts/" in statement:  # another documented run (the CPU rehearsal: minutes), not set-up
            continue
        out = _make_data_outputs(statement)
        if out is None:
            script.append(statement)
            continue
        assert re.fullmatch(rf"data/(?:{'|'.join(ENVS)})_(?:train|eval)\.jsonl", out), (
            f"{where}: {statement!r} writes {out}, not where {GPU_SCRIPT} looks (data/TASK_ENV_train.jsonl, _eval.jsonl)")
    script.append(command)
    env = _clean_env(DATA_DIR=str(_task_files(tmp_path / "data")), **_python_on_path(tmp_path))
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(script)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, f"{where}: {command}\n{text[-3000:]}"
    assert "Traceback" not in text, f"{where}: {command}\n{text[-3000:]}"
    assert "TCOD      :" in out.stdout and "memory    :" in out.stdout, f"{where}: no plan printed\n{out.stdout}"


def test_every_documented_eval_file_leaves_out_its_training_tasks():
    # Two ScienceWorld variations can open with the same observation: without --exclude the eval file shared 5
    # of its 75 tasks with training. Every documented make_data line writing an eval file excludes the train one.
    lines = [(p.relative_to(ROOT).as_posix(), line) for p in OWN_DOCS for line in p.read_text().splitlines()
             if re.search(r"make_data .*--out \S*_eval\.jsonl", line)]
    assert len(lines) >= 2, lines
    for where, line in lines:
        out = re.search(r"--out (\S*)_eval\.jsonl", line).group(1)
        assert f"--exclude {out}_train.jsonl" in line, f"{where}: {line.strip()}"


def _gpu_script(env: dict, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / GPU_SCRIPT)], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=_clean_env(DRY_RUN="1", **env))


def _one_line(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and out.stdout == "", out.stdout + out.stderr
    (line,) = out.stderr.splitlines()
    return line


def test_a_missing_task_file_is_named_with_the_command_that_makes_it(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    line = _one_line(_gpu_script({"DATA_DIR": str(empty), "PYTHON": sys.executable}))
    train = empty / "scienceworld_train.jsonl"
    assert line == (f"run-qwen3-8B-tcod-runtime.sh: DATA={train} does not exist; make it with: {sys.executable} "
                    f"-m examples.agent_envs.make_data --env scienceworld --n 150 --seed 0 --out {train}")
    # With the training file there, the evaluation file (ScienceWorld's dev variations, disjoint) is next.
    shutil.copy(_task_files(tmp_path / "data") / "scienceworld_train.jsonl", train)
    line = _one_line(_gpu_script({"DATA_DIR": str(empty), "PYTHON": sys.executable}))
    assert line.startswith(f"run-qwen3-8B-tcod-runtime.sh: EVAL_DATA={empty / 'scienceworld_eval.jsonl'} does not")
    assert f"--n 75 --seed 150 --exclude {train} --out" in line  # held out: no task of the training file
    # A relative DATA is the caller's path, though the script runs train.py from the repository root.
    # From elsewhere, the command it prints goes to the repository first (make_data is a module of it).
    line = _one_line(_gpu_script({"DATA": "train.jsonl", "PYTHON": sys.executable}, cwd=tmp_path))
    assert f"DATA={tmp_path / 'train.jsonl'} does not exist; make it with: cd {ROOT} && {sys.executable} -m" in line
    # ALFWorld and WebShop tasks cannot be generated from seeds: the line says where they come from.
    line = _one_line(_gpu_script({"DATA_DIR": str(empty), "TASK_ENV": "alfworld", "PYTHON": sys.executable}))
    assert "alfworld tasks are rows written from its downloaded data" in line and "make_data" not in line


def _fake_repo(tmp_path: Path, venv: bool) -> Path:
    """A copy of the GPU script in a repository of its own, whose pythons are fakes: the data line then
    names the Python the script picked, without importing anything."""
    repo = tmp_path / ("with-venv" if venv else "no-venv")
    (repo / "scripts").mkdir(parents=True)
    for name in ("run-qwen3-8B-tcod-runtime.sh", "find-python.sh"):
        shutil.copy(ROOT / "scripts" / name, repo / "scripts" / name)
    fake = "#!/bin/sh\nexit 0\n"  # the module check prints nothing: every module is there
    if venv:
        (repo / ".venv/bin").mkdir(parents=True)
        (repo / ".venv/bin/python").write_text(fake)
        (repo / ".venv/bin/python").chmod(0o755)
    (tmp_path / "bin").mkdir(exist_ok=True)
    (tmp_path / "bin/python3").write_text(fake)
    (tmp_path / "bin/python3").chmod(0o755)
    return repo


@pytest.mark.parametrize("venv,override,picked", [
    (True, None, "{repo}/.venv/bin/python"),
    (False, None, "python3"),
    (True, "{bin}/python3", "{bin}/python3"),
], ids=["repo-venv", "python3", "PYTHON="])
def test_the_gpu_script_finds_its_python(tmp_path, venv, override, picked):
    repo = _fake_repo(tmp_path, venv)
    env = {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    if override:
        env["PYTHON"] = override.format(bin=tmp_path / "bin")
    out = subprocess.run(["bash", str(repo / "scripts" / GPU_SCRIPT.split("/")[1])], cwd=repo, capture_output=True,
                         text=True, timeout=60, env=_clean_env(DRY_RUN="1", **env))
    line = _one_line(out)
    assert f"make it with: {picked.format(repo=repo, bin=tmp_path / 'bin')} -m examples.agent_envs.make_data" in line


def test_a_python_without_torch_is_refused_in_one_line(tmp_path):
    # -S: this very interpreter without its site-packages, so without torch (the repository is on its path).
    bare = tmp_path / "python"
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    line = _one_line(_gpu_script({"PYTHON": str(bare)}))
    assert line.startswith(f"run-qwen3-8B-tcod-runtime.sh: {bare} cannot import torch")
    assert "slime" not in line.split(":")[1] and "make venv" in line
    line = _one_line(_gpu_script({"PYTHON": str(tmp_path / "no-such-python")}))
    assert line.startswith(f"run-qwen3-8B-tcod-runtime.sh: no Python at PYTHON={tmp_path / 'no-such-python'}")


# ---------------------------------------------------------------- the demo's teacher-student check

def _sft_metrics(path: Path, evals: dict[int, float]) -> Path:
    rows = [{"step": s, "train/loss": 1.0} for s in range(max(evals) + 1)]
    rows += [{"step": s, "eval/gridnav/success_rate": v} for s, v in evals.items()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sft_eval_reads_both_checkpoints_and_warns_when_the_teacher_is_not_ahead(tmp_path, capsys):
    metrics = _sft_metrics(tmp_path / "metrics.jsonl", {4: 0.125, 9: 0.0})
    assert sft_successes(str(metrics), 9, 4) == (0.0, 0.125)
    assert sft_eval_main([str(metrics), "--teacher-step", "9", "--student-step", "4", "--tasks", "96"]) == 0
    out = capsys.readouterr()
    assert out.out.split() == ["0.0", "0.125"]
    assert out.err.splitlines() == [
        "run-tiny-tcod.sh: warning: the teacher (0.00) is not better than the student (0.12) on the 96 held-out"
        " tasks; distillation has nothing to close: raise TEACHER_STEPS"]
    assert gap_warning(0.5, 0.5, 32) is not None  # a tie closes nothing either
    assert gap_warning(0.86, 0.22, 96) is None


def test_sft_eval_names_a_missing_evaluation(tmp_path, capsys):
    metrics = _sft_metrics(tmp_path / "metrics.jsonl", {9: 0.5})
    assert sft_eval_main([str(metrics), "--teacher-step", "9", "--student-step", "4", "--tasks", "96"]) == 1
    assert "no eval/gridnav/success_rate at step 4" in capsys.readouterr().err


FAKE_PYTHON = r'''
import json, os, runpy, sys
from pathlib import Path
argv = sys.argv[1:]
def flag(name):
    return argv[argv.index(name) + 1]
if argv[0] == "-c":  # the scripts' own one-liners (module check, free port)
    sys.argv = ["-c", *argv[2:]]
    exec(argv[1])
elif argv[0] == "train.py":  # SFT: both checkpoints, and the evaluations this test is about
    save, steps, every = Path(flag("--save")), int(flag("--num-rollout")), int(flag("--save-interval"))
    for step in (every - 1, steps - 1):
        (save / f"iter_{step:07d}/model/hf").mkdir(parents=True)
    evals = json.loads(os.environ["FAKE_EVALS"])
    (save / "metrics.jsonl").write_text("".join(
        json.dumps({"step": int(s), "eval/gridnav/success_rate": v}) + "\n" for s, v in evals.items()))
elif argv[:2] == ["-m", "scripts.sft_eval"]:
    sys.argv = argv[1:]
    runpy.run_module("scripts.sft_eval", run_name="__main__")
elif argv[:2] == ["-m", "slime.backends.hf_engine"]:
    sys.exit(3)  # the test ends at the teacher server: what follows SFT is not its business
elif argv[:2] == ["-m", "slime.backends.sglang_utils.wait_healthy"]:
    sys.exit(1)
elif argv[:2] == ["-m", "slime.utils.tiny_models"] or argv[:2] == ["-m", "examples.agent_envs.make_data"]:
    pass
else:
    sys.exit(f"fake python: unexpected {argv}")
'''


def _demo_until_the_teacher_server(tmp_path: Path, evals: dict[str, float], **env) -> subprocess.CompletedProcess:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "fake_python.py").write_text(FAKE_PYTHON)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "fake_python.py"} "$@"\n')
    python.chmod(0o755)
    return subprocess.run(["bash", "scripts/run-tiny-tcod.sh"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": str(python), "OUT_DIR": str(tmp_path / "out"),
                               "PYTHONPATH": str(ROOT), "FAKE_EVALS": json.dumps(evals), **env})


def test_the_demo_warns_after_sft_when_the_teacher_is_not_better(tmp_path):
    out = _demo_until_the_teacher_server(tmp_path, {"4": 0.125, "9": 0.0},
                                         TEACHER_STEPS="10", STUDENT_STEPS="5", EVAL_N="32")
    assert "teacher server did not come up" in out.stderr, out.stdout + out.stderr  # got past SFT
    warning = ("run-tiny-tcod.sh: warning: the teacher (0.00) is not better than the student (0.12) on the 32"
               " held-out tasks; distillation has nothing to close: raise TEACHER_STEPS")
    assert warning in out.stderr.splitlines()
    assert "teacher 0.00, student 0.12" in out.stdout  # rounded for people (the SFT metrics keep 0.125)
    fine = _demo_until_the_teacher_server(tmp_path / "fine", {"4": 0.125, "9": 0.5},
                                          TEACHER_STEPS="10", STUDENT_STEPS="5", EVAL_N="32")
    assert "teacher 0.50, student 0.12" in fine.stdout and "warning" not in fine.stderr, fine.stderr


def test_the_demo_refuses_a_student_that_is_not_earlier_than_the_teacher(tmp_path):
    out = _demo_until_the_teacher_server(tmp_path, {}, TEACHER_STEPS="20", STUDENT_STEPS="20")
    assert out.returncode == 2 and out.stderr.splitlines() == [
        "run-tiny-tcod.sh: STUDENT_STEPS (20) must be below TEACHER_STEPS (20)"], out.stderr


def test_the_demo_refuses_an_unknown_or_empty_methods_list(tmp_path):
    # METHODS picks phase 4's runs; a typo must stop the demo before its SFT, not after ten minutes.
    out = _demo_until_the_teacher_server(tmp_path, {}, METHODS="opd tcod")
    assert out.returncode == 2 and out.stderr.splitlines() == [
        "run-tiny-tcod.sh: METHODS: unknown method 'tcod' (choose from: opd f2b b2f)"], out.stderr
    empty = _demo_until_the_teacher_server(tmp_path / "empty", {}, METHODS=" ")
    assert empty.returncode == 2 and empty.stderr.splitlines() == [
        "run-tiny-tcod.sh: METHODS is empty (choose from: opd f2b b2f)"], empty.stderr
