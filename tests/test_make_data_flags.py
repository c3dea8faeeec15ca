"""make_data checks its length flags when it reads them and says which settings hold which lengths; a long
generation prints progress; too few tasks in the lengths asked for is one line, not a traceback.

Before: ``--min-len 8 --max-len 4`` was not checked, and impossible lengths for the grid ended in a traceback
after thousands of seeds; ScienceWorld's 150 tasks printed nothing for minutes.
"""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from examples.agent_envs import make_data
from examples.agent_envs.task_lengths import length_flags_problem

ROOT = Path(__file__).resolve().parents[1]


def refusal(tmp_path, *flags) -> str:
    out = subprocess.run([sys.executable, "-m", "examples.agent_envs.make_data", "--n", "5", "--out",
                          str(tmp_path / "t.jsonl"), *flags], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "t.jsonl").exists() and not (tmp_path / "t.jsonl.tmp").exists()
    return out.stderr.splitlines()[-1]


def test_contradictory_lengths_are_refused_at_once(tmp_path):
    assert refusal(tmp_path, "--env", "gridnav", "--min-len", "8", "--max-len", "4") == (
        "make_data.py: error: --min-len 8 is above --max-len 4: no task can be kept")
    assert refusal(tmp_path, "--env", "gridnav", "--min-len", "0").endswith("--min-len 0 must be >= 1 (an expert "
                                                                             "path has at least one move)")


@pytest.mark.parametrize("flags,line", [
    (("--env", "gridnav", "--size", "4", "--walls", "0", "--min-len", "8"),
     "--min-len 8: gridnav --size 4 --walls 0 has optimal paths of at most 6 moves (2 x (size - 1)), so no task is "
     "kept; --size 5 or more holds 8"),
    (("--env", "gridnav", "--min-len", "30"),  # the defaults: size 5, walls 0.2
     "--min-len 30: gridnav --size 5 --walls 0.2 has optimal paths of at most 19 moves (its free cells - 1), so no "
     "task is kept; --size 7 or more holds 30"),
    (("--env", "hanoi", "--disks", "3", "--min-len", "9"),
     "--min-len 9: hanoi --disks 3 has optimal paths of at most 7 moves (2^disks - 1), so no task is kept; --disks 4 "
     "or more holds 9"),
])
def test_lengths_the_tasks_cannot_have_are_refused_naming_what_holds_them(tmp_path, flags, line):
    assert refusal(tmp_path, *flags) == f"make_data.py: error: {line}"


def test_every_length_a_task_can_have_passes_the_check():
    # Without walls the bound is exact: a 6x6 grid's corner-to-corner path has 10 moves.
    assert length_flags_problem("gridnav", {"size": 6, "walls": 0}, 10, 10) is None
    assert length_flags_problem("hanoi", {"disks": 4}, 15, None) is None
    assert length_flags_problem("scienceworld", {}, 50, None) is None  # no known bound: never refused


def test_too_few_tasks_in_range_is_one_line(tmp_path):
    line = refusal(tmp_path, "--env", "gridnav", "--size", "5", "--walls", "0.2", "--min-len", "17")
    assert line.startswith("make_data.py: error: gridnav: only ") and "--min-len/--max-len" in line, line


def test_a_long_generation_prints_progress(tmp_path, monkeypatch, capsys):
    def slow_rows(env, n, seed, params, min_len, max_len, stats, exclude):
        for i in range(n):
            time.sleep(0.05)
            stats["last_seed"] = seed + i
            yield {"input": f"t{i}", "label": str(i), "metadata": {"expert_actions": ["a"]}}

    monkeypatch.setattr(make_data, "task_rows", slow_rows)
    monkeypatch.setattr(make_data, "PROGRESS_EVERY", 0.02)
    assert make_data.main(["--env", "gridnav", "--n", "6", "--seed", "10", "--out", str(tmp_path / "t.jsonl")]) == 0
    lines = capsys.readouterr().err.splitlines()
    progress = [line for line in lines if line.startswith("make_data: ")]
    assert progress and progress[-1].startswith("make_data: ") and " of 6 gridnav tasks, seeds 10.." in progress[-1] and progress[-1].split(" (")[0].endswith("tried")
    assert lines[-1].startswith(f"wrote 6 gridnav tasks to {tmp_path / 't.jsonl'}")
