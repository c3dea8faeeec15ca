"""TCOD's premise gate (benchmarks/tcod_premise.py) and the per-episode turn-KL slopes it reads."""

import json
import sys
from pathlib import Path

import pytest

from slime.utils.step_metrics import per_turn_kl, turn_kl_slopes
from slime.utils.types import Sample

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import tcod_premise  # noqa: E402


def episode(turn_kls, turn_len=2, prefix=0):
    """A sample whose student turns (``turn_len`` tokens each, one masked token between) have these KLs."""
    kl, mask, spans = [], [], []
    for value in turn_kls:
        spans.append([len(kl), len(kl) + turn_len])
        kl += [value] * turn_len + [99.0]  # the masked observation token must not count
        mask += [1] * turn_len + [0]
    sample = Sample(response_length=len(kl), loss_mask=mask, metadata={"turn_spans": spans, "prefix_turns": prefix})
    return sample, kl


def test_slopes_are_taken_within_each_episode():
    # Failing episodes run long and sit at a higher KL, but no episode's KL grows with its turns: the mean
    # per turn index rises (the confound), the within-episode slopes are all 0.
    samples, kls = zip(*[episode([0.5] * 3), episode([0.5] * 3), episode([2.0] * 8), episode([2.0] * 8)])
    by_turn, _ = per_turn_kl(samples, kls)
    assert by_turn[7] > by_turn[0]
    assert turn_kl_slopes(samples, kls) == [0.0] * 4
    rising, kl = episode([1.0, 2.0, 3.0, 4.0], prefix=5)  # turn indices 5..8 after a B2F prefix
    assert turn_kl_slopes([rising], [kl]) == [pytest.approx(1.0)]  # per-token mean, not the turn sum
    short, kl = episode([1.0, 9.0])
    assert turn_kl_slopes([short], [kl]) == []  # fewer than 3 turns: no slope


def write_run(path, slopes_by_step):
    path.mkdir(parents=True)
    rows = [{"step": step, "opd/turn_kl_slopes": slopes, "opd/turn_kl_slope_source": "exact",
             "opd/per_turn_kl": [1.0 + step, None, 3.0][: len(slopes) - 1]}
            for step, slopes in enumerate(slopes_by_step)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_gate_passes_only_on_a_rising_kl_with_a_better_teacher(tmp_path, capsys):
    rising = [write_run(tmp_path / f"r{s}", [[0.2, 0.3, 0.25, 0.35]] * 3 + [[-5.0] * 4]) for s in range(3)]
    argv = ["--runs", *map(str, rising), "--teacher-success", "0.6", "--student-success", "0.2"]
    assert tcod_premise.main(argv + ["--out", str(tmp_path / "gate.json")]) == 0
    line = capsys.readouterr().out
    assert line.startswith("premise gate PASSED: per-turn KL slope +0.2750 per turn") and "36 episodes" in line
    written = json.loads((tmp_path / "gate.json").read_text())
    assert written["passed"]  # step 3's -5 is past --first-steps 3
    assert written["per_turn_kl_by_index"] == [2.0, None, 3.0]  # steps 0..2 at turn 1: 1, 2, 3
    assert tcod_premise.main(argv[:-4] + ["--teacher-success", "0.2", "--student-success", "0.3"]) == 1
    assert "FAILED (teacher_beats_student)" in capsys.readouterr().out
    flat = [write_run(tmp_path / f"f{s}", [[0.4, -0.5, 0.3, -0.3]] * 3) for s in range(3)]
    assert tcod_premise.main(["--runs", *map(str, flat), "--teacher-success", "0.6", "--student-success", "0.2"]) == 1
    assert "FAILED (ci_above_zero, every_seed_positive)" in capsys.readouterr().out
    one_seed_down = rising[:2] + [write_run(tmp_path / "down", [[-0.1, -0.2, -0.1, -0.2]] * 3)]
    assert tcod_premise.main(["--runs", *map(str, one_seed_down), *argv[-4:]]) == 1
    assert "every_seed_positive" in capsys.readouterr().out


def test_a_run_without_slopes_is_named(tmp_path):
    empty = write_run(tmp_path / "none", [])
    with pytest.raises(SystemExit, match="has no opd/turn_kl_slopes"):
        tcod_premise.main(["--runs", str(empty), "--teacher-success", "0.6", "--student-success", "0.2"])
