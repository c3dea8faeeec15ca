"""benchmarks/adaptive_kl_ppo_report.py and the start rule of benchmarks/adaptive_kl_ppo.py on fabricated runs.

The rows have the shape the benchmark writes (flags plus per-step ``kl`` / ``beta`` / ``reward``); their KL
series are built so that each score, the reference ``beta``, the goal verdict and the measurements are known.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import adaptive_kl_ppo as bench  # noqa: E402
import adaptive_kl_ppo_report as report  # noqa: E402

STEPS, BATCH, HORIZON = 40, 64, 256
FLAGS = {"steps": STEPS, "horizon": HORIZON, "lr": 0.02, "prompts": 8, "samples": 8, "response_len": 8}


def _row(ctrl, coef, seed, kl, target=None, phase="sweep", beta=None, reward=None):
    return {**FLAGS, "name": f"{ctrl}_{coef}_{seed}", "phase": phase, "ctrl": ctrl, "coef": coef,
            "target": target, "seed": seed, "wall_s": 1.0, "kl": kl, "beta": beta or [coef] * len(kl),
            "reward": reward or [0.1] * len(kl)}


def _flat(level):
    return [0.0] + [level] * (STEPS - 1)


def _sweep():
    # beta 0.1 holds 0.1 throughout; beta 0.05 plateaus at 0.4, then runs away (reward 1.0) at step 25.
    away = [0.0] + [0.4] * 24 + [3.7] * 15
    return [_row("fixed", 0.1, s, _flat(0.1)) for s in (1, 2)] + [
        _row("fixed", 0.05, s, away, reward=[0.3] * 25 + [1.0] * 15) for s in (1, 2)]


def test_reference_beta_is_the_swept_one_whose_plateau_is_nearest_the_target():
    sweep = _sweep()
    assert bench.plateau(sweep[2]) == 0.4  # steps 4..12: before the runaway
    assert bench.reference_beta(sweep, 0.1) == 0.1
    assert bench.reference_beta(sweep, 0.4) == 0.05
    assert bench.reference_beta(sweep, 0.25) == 0.05


def test_scores_goal_and_fixed_verdict():
    rows = _sweep()
    # Adaptive toward 0.1: seed 1 holds it exactly (score 0), seed 2 sits at 0.14 in the second half (0.4).
    rows += [_row("adaptive", 0.01, 1, _flat(0.1), target=0.1, phase="start"),
             _row("adaptive", 0.01, 2, [0.0] * 20 + [0.14] * 20, target=0.1, phase="start")]
    rows += [_row("adaptive", 0.5, s, _flat(0.11), target=0.1, phase="start") for s in (1, 2)]
    summary = report.analyse(rows, {"targets": [0.1], "start_factor": 10.0, "wall_s": 5.0})
    entry = summary["targets"]["0.1"]
    assert entry["best_fixed"] == 0.1 and entry["reference_beta"] == 0.1
    low = entry["runs"]["adaptive from 0.01"]
    assert low["dev"] == pytest.approx([0.0, 0.4])
    assert low["dev_max"] == pytest.approx(0.4)
    assert entry["runs"]["adaptive from 0.5"]["dev"] == pytest.approx([0.1, 0.1])
    assert entry["goal_met"] is False and summary["goal_met"] is False  # seed 2 from the low start: 0.4 > 0.3
    assert summary["fixed"]["0.05"]["runaway_step"] == [25, 25]
    # Only one target: fixed 0.1 is within 0.3 of every target, so the goal's second half fails too.
    assert summary["fixed_within_goal_of_all_targets"] == ["0.1"]

    rows[5] = _row("adaptive", 0.01, 2, _flat(0.12), target=0.1, phase="start")
    summary = report.analyse(rows, {"targets": [0.1]})
    assert summary["targets"]["0.1"]["goal_met"] is True
    assert summary["goal_met"] is False  # every adaptive run within 0.3, but so is fixed 0.1


def test_no_adaptive_runs_meet_no_goal():
    summary = report.analyse(_sweep(), {"targets": [0.1, 0.4]})
    assert [e["goal_met"] for e in summary["targets"].values()] == [False, False]


def test_goal_needs_no_fixed_beta_within_reach_of_both_targets():
    rows = _sweep()
    for target, level in ((0.1, 0.1), (0.4, 0.4)):
        rows += [_row("adaptive", c, s, _flat(level), target=target, phase="start") for c in (0.01, 1.0)
                 for s in (1, 2)]
    summary = report.analyse(rows, {"targets": [0.1, 0.4]})
    assert all(e["goal_met"] for e in summary["targets"].values())
    assert summary["fixed_within_goal_of_all_targets"] == []
    assert summary["goal_met"] is True


def test_measurements():
    # Alternating 0.08 / 0.12: on the plateau window (steps 4..12: five 0.08, four 0.12) every step moves 0.04,
    # so the white noise is 0.04 / sqrt(2) over a mean of 0.88 / 9.
    kl = [0.0] + [0.12 if i % 2 else 0.08 for i in range(1, STEPS)]
    assert report.noise(_row("fixed", 0.1, 1, kl)) == pytest.approx(0.04 / math.sqrt(2) / (0.88 / 9), rel=1e-9)
    assert report.rise_step(_row("fixed", 0.1, 1, [0.0, 0.02, 0.05, 0.08] + [0.1] * 36)) == 3
    # ln KL follows -ln beta three steps later: the most negative correlation is at lag 3.
    beta = [0.1 * math.exp(0.5 * math.sin(i / 3.0)) for i in range(STEPS)]
    kl = [0.1] * 3 + [0.1 * (0.1 / b) ** 2 for b in beta[:-3]]
    lag, corr = report.xcorr_lag(_row("adaptive", 0.1, 1, kl, target=0.1, beta=beta))
    assert lag == 3 and corr == pytest.approx(-1.0, abs=1e-6)
    # 5% a step at most (0.2 * 64 / 256): ln(10) / ln(1.05) = 47.2 -> 48 steps.
    assert report.climb_steps(10.0, BATCH, HORIZON) == 48


def test_report_writes_tables_summary_and_plot(tmp_path):
    rows = _sweep() + [_row("adaptive", c, s, _flat(0.1), target=0.1, phase="start") for c in (0.01, 1.0)
                       for s in (1, 2)]
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "invocation.json").write_text(json.dumps({"targets": [0.1], "start_factor": 10.0, "wall_s": 9.0}))
    plot = tmp_path / "plot.png"
    assert report.main(["--results", str(tmp_path), "--plot", str(plot)]) == 0
    tables = (tmp_path / "tables.md").read_text()
    assert "| adaptive from 0.01 | 0.00 (0.00 / 0.00) | yes |" in tables
    assert json.loads((tmp_path / "summary.json").read_text())["climb_steps"] == 48
    assert plot.stat().st_size > 10_000


def test_report_without_runs_says_what_to_run(tmp_path, capsys):
    assert report.main(["--results", str(tmp_path), "--plot", str(tmp_path / "p.png")]) == 1
    assert "run benchmarks/adaptive_kl_ppo.py first" in capsys.readouterr().err
