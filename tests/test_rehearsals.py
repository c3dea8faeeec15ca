"""CPU rehearsals of the shipped GPU launches: each runs its own train.py flags for 2 rollouts with tiny models
and the hf_engine standing in for the checkpoints and SGLang (scripts/rehearsal.py lists the swaps)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.rehearsal import rewrite, split_flags
from slime.utils.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]


def test_rewrite_swaps_drops_and_adds_and_says_so():
    argv = ["--a", "1", "--b", "x", "y", "--flag", "--c", "-1"]
    out, changes = rewrite(argv, {"--b": ["z"], "--c": ["-1"], "--new": ["v"]}, drop={"--flag"})
    assert split_flags(out) == [["--a", "1"], ["--b", "z"], ["--c", "-1"], ["--new", "v"]]
    assert changes == ["--b x y -> z", "dropped --flag", "added --new v"]


def _rows(folder: Path) -> dict:
    rows = {row["step"]: row for row in read_metrics(folder / "metrics.jsonl")}
    assert set(rows) == {-1, 0, 1}, sorted(rows)  # evaluation before training, then 2 rollouts
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["b2f", "f2b"])
def test_runtime_gpu_script_rehearses_on_cpu(tmp_path, mode):
    env = {**os.environ, "REHEARSAL": "1", "REHEARSAL_DIR": str(tmp_path), "PYTHON": sys.executable}
    env.pop("TCOD_MODE", None)
    if mode == "f2b":  # b2f is the script's default: the quick start's command as written
        env["TCOD_MODE"] = "f2b"
    out = subprocess.run(["bash", "scripts/run-qwen3-8B-tcod-runtime.sh"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "--rollout-num-gpus 3 -> 1" in out.stdout and "--rollout-backend sglang -> hf_engine" in out.stdout
    assert "Traceback" not in out.stderr and "skipped" not in out.stderr
    rows = _rows(tmp_path)
    assert rows[1]["tcod/depth"] == 1  # the script's curriculum (eta 6 for f2b, 5 for b2f) at step 1
    assert "eval/scienceworld/success_rate" in rows[1]
    for step in (0, 1):  # every step trained: the teacher server scored the episodes
        assert rows[step]["rollout/kept"] == 2 and rows[step]["opd/reverse_kl_seq_sum"] != 0
    if mode == "b2f":
        assert rows[0]["tcod/prefix_source_expert"] == 2 and rows[0]["tcod/prefix_len"] > 0  # expert prefixes replayed


@pytest.mark.slow
def test_slime_launch_script_rehearses_on_cpu(tmp_path):
    out = subprocess.run([sys.executable, "tools/slime_pr/rehearse_launch.py", "--mode", "b2f", "--dir", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "upstream-only flags dropped: none" in out.stdout
    rows = _rows(tmp_path)
    assert rows[0]["tcod/prefix_source_expert"] == 2  # B2F replayed expert prefixes
    assert "tcod/prefix_turns" in rows[0]  # the PR's rollout-log hook ran
    assert "eval/gridnav/success_rate" in rows[1]


def test_a_folder_that_holds_an_earlier_rehearsal_is_refused_before_any_setup(tmp_path, capsys):
    from scripts.rehearsal import main

    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')
    assert main(["--task-env", "gridnav", "--dir", str(tmp_path), "--", "--num-rollout", "250"]) == 2
    assert capsys.readouterr().err.startswith(f"rehearsal: error: {tmp_path} holds an earlier rehearsal")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no models or tasks made
