"""The CPU demo (scripts/run-tiny-tcod.sh) never removes a run: a used OUT_DIR is refused in one line naming a
free one, and a demo that stops early (Ctrl-C, a failure) leaves OUT_DIR as it was, its outputs moved aside and
named. It writes into OUT_DIR itself, so every path it prints is where that file is once the demo has ended
(it used to write a folder it renamed at the end, after printing paths inside it).

The script runs as written with a fake PYTHON that stands in for every Python step (file writes only, in a
second), so what is tested is the script's own handling of OUT_DIR.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAKE_PYTHON = r'''
import json, os, sys, time
from pathlib import Path
argv = sys.argv[1:]
def flag(name):
    return argv[argv.index(name) + 1]
if argv[0] == "-c":  # the scripts' one-liners (module check, free port)
    sys.argv = ["-c", *argv[2:]]
    exec(argv[1])
elif argv[0] == "train.py":
    if "--save" in argv:  # SFT: the two checkpoints and their evaluations
        save, steps, every = Path(flag("--save")), int(flag("--num-rollout")), int(flag("--save-interval"))
        if os.environ.get("FAKE_HANG"):
            save.mkdir(parents=True)
            (save.parent / "sft-started").write_text("")
            time.sleep(60)
        for step in (every - 1, steps - 1):
            (save / f"iter_{step:07d}/model/hf").mkdir(parents=True)
        (save / "metrics.jsonl").write_text(json.dumps({"step": every - 1, "eval/gridnav/success_rate": 0.1}) + "\n"
                                            + json.dumps({"step": steps - 1, "eval/gridnav/success_rate": 0.9}) + "\n")
    else:
        Path(flag("--metrics-dir")).mkdir(parents=True)
        (Path(flag("--metrics-dir")) / "metrics.jsonl").write_text("{}\n")
elif argv[:2] == ["-m", "scripts.sft_eval"]:
    print("0.7083333333333334 0.2916666666666667")  # as the SFT run's metrics hold them
elif argv[:2] == ["-m", "slime.backends.hf_engine"]:
    sys.exit(3 if os.environ.get("FAKE_NO_TEACHER") else 0)
elif argv[:2] == ["-m", "slime.backends.sglang_utils.wait_healthy"]:
    sys.exit(1 if os.environ.get("FAKE_NO_TEACHER") else 0)
elif argv[:2] == ["-m", "scripts.tcod_report"]:
    Path(flag("--md")).write_text("new table\n")
    Path(flag("--png")).write_text("new plot\n")
    print(f"table: {flag('--md')}\nplot: {flag('--png')}")
elif argv[:2] == ["-m", "slime.utils.tiny_models"]:
    Path(flag("--out")).mkdir(parents=True)
elif argv[:2] == ["-m", "examples.agent_envs.make_data"]:
    Path(flag("--out")).write_text("{}\n")
else:
    sys.exit(f"fake python: unexpected {argv}")
'''


def _fake_python(tmp_path: Path) -> Path:
    (tmp_path / "fake_python.py").write_text(FAKE_PYTHON)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "fake_python.py"} "$@"\n')
    python.chmod(0o755)
    return python


def _env(tmp_path: Path, out_dir: Path, **extra) -> dict:
    return {**os.environ, "PYTHON": str(_fake_python(tmp_path)), "OUT_DIR": str(out_dir), "PYTHONPATH": str(ROOT),
            "TEACHER_STEPS": "4", "STUDENT_STEPS": "2", **extra}


def _demo(tmp_path: Path, out_dir: Path, **extra) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/run-tiny-tcod.sh"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=_env(tmp_path, out_dir, **extra))


def _an_earlier_demo(out_dir: Path) -> dict[str, str]:
    (out_dir / "sft/iter_0000019/model/hf").mkdir(parents=True)
    (out_dir / "sft/iter_0000019/model/hf/model.safetensors").write_text("weights")
    (out_dir / "table.md").write_text("old table\n")
    return {str(p.relative_to(out_dir)): p.read_text() for p in out_dir.rglob("*") if p.is_file()}


def _files(out_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(out_dir)): p.read_text() for p in out_dir.rglob("*") if p.is_file()}


def test_a_used_out_dir_is_refused_in_one_line_and_kept(tmp_path):
    out_dir = tmp_path / "tiny-tcod"
    before = _an_earlier_demo(out_dir)
    (tmp_path / "tiny-tcod-2").mkdir()  # taken too: the line names the next free one
    out = _demo(tmp_path, out_dir)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.splitlines() == [
        f"run-tiny-tcod.sh: OUT_DIR={out_dir} already holds a run, which is kept: run again with "
        f"OUT_DIR={tmp_path / 'tiny-tcod-3'}, or remove that folder first"], out.stderr
    assert _files(out_dir) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("tiny-tcod")) == ["tiny-tcod", "tiny-tcod-2"]


def test_a_finished_demo_fills_out_dir_and_a_failed_one_leaves_it_as_it_was(tmp_path):
    out_dir = tmp_path / "tiny-tcod"
    out = _demo(tmp_path, out_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"outputs in {out_dir}" in out.stdout
    # Every path the demo printed is a file or folder there once it has ended (the fake steps print theirs).
    printed = re.findall(rf"{re.escape(str(tmp_path))}\S*", out.stdout + out.stderr)
    assert f"{out_dir}/table.md" in printed and f"{out_dir}/tcod-tiny.png" in printed, printed
    assert all(Path(p.rstrip(".,;:)")).exists() for p in printed), printed
    assert "full-episode eval success (temperature 1.0, 96 held-out tasks): teacher 0.71, student 0.29" in out.stdout
    assert _files(out_dir)["table.md"] == "new table\n" and (out_dir / "sft/metrics.jsonl").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("tiny-tcod")] == ["tiny-tcod"]  # no leftovers

    # An empty OUT_DIR (made by hand) is free; a demo that fails after SFT leaves it empty, its partial
    # outputs named in a folder beside it.
    empty = tmp_path / "empty"
    empty.mkdir()
    out = _demo(tmp_path, empty, FAKE_NO_TEACHER="1")
    assert out.returncode == 1, out.stdout + out.stderr
    assert list(empty.iterdir()) == []
    (partial,) = [p for p in tmp_path.iterdir() if p.name.startswith("empty.partial-")]
    assert (partial / "sft/metrics.jsonl").is_file()
    assert out.stderr.splitlines()[-1] == (f"run-tiny-tcod.sh: stopped before the end; OUT_DIR={empty} is as it was, "
                                           f"this run's partial outputs (logs included; the paths printed above "
                                           f"under OUT_DIR) are in {partial}")


def test_ctrl_c_during_the_demo_leaves_no_out_dir(tmp_path):
    out_dir = tmp_path / "tiny-tcod"
    # Ctrl-C as in a terminal, even when the suite runs in the background: there SIGINT arrives ignored, and bash
    # can neither trap nor reset a signal ignored on entry (the demo then ran on and this test timed out).
    proc = subprocess.Popen(["bash", "scripts/run-tiny-tcod.sh"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(tmp_path, out_dir, FAKE_HANG="1"),
                            preexec_fn=lambda: (os.setsid(), signal.signal(signal.SIGINT, signal.SIG_DFL)))
    deadline = time.monotonic() + 60
    while not (out_dir / "sft-started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole foreground group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert not out_dir.exists()
    (partial,) = tmp_path.glob("tiny-tcod.partial-*")
    assert (partial / "sft-started").exists()
    assert err.splitlines()[-1].endswith(f"are in {partial}"), err
