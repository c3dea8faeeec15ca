"""benchmarks/tcod_regimes_report.py: rows from synthetic metrics and the regime x method interaction."""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import tcod_regimes_report as rep  # noqa: E402

# (regime, method) -> per-seed final eval success, seeds 0..2.
EVAL = {("tuned", "opd"): [0.40, 0.50, 0.45], ("tuned", "f2b"): [0.41, 0.49, 0.46],
        ("unstable", "opd"): [0.20, 0.30, 0.10], ("unstable", "f2b"): [0.40, 0.45, 0.40],
        ("official", "opd"): [0.30, 0.40, 0.35], ("official", "f2b"): [0.30, 0.40, 0.36]}


def _metrics(path: Path, final_eval: float) -> None:
    rows = [{"step": s, "opd/trajectory_kl_mean": 5.0 - s, "opd/per_turn_kl": [1.0, 2.0 + s],
             "rollout/trained_tokens": 100, "time/step": 1.5, "multi_turn/success_rate": 0.3} for s in range(4)]
    rows[-1]["eval/gridnav/success_rate"] = final_eval
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_rows_and_interaction(tmp_path):
    results = tmp_path / "results" / "toy.jsonl"
    for (regime, method), values in EVAL.items():
        for seed, value in enumerate(values):
            run = tmp_path / regime / f"seed{seed}" / method
            _metrics(run / "metrics.jsonl", value)
            (run / "loadavg.txt").write_text("before 0.5 0.4 0.3 1/80 1\nafter 1.0 0.8 0.6 1/80 2\n")
            (run / "process_wall_s.txt").write_text("7\n")
            assert rep.main(["row", "--results", str(results), "--run-dir", str(run), "--setting", "toy",
                             "--regime", regime, "--method", method, "--seed", str(seed), "--episodes", "16",
                             "--global-batch", "16", "--lr", "1e-3", "--opd-loss", "full", "--steps", "4",
                             "--teacher", "t", "--student", "s", "--teacher-success", "0.6",
                             "--student-success", "0.3"]) == 0
    # Recording a run again replaces its row.
    assert rep.main(["row", "--results", str(results), "--run-dir", str(tmp_path / "tuned/seed0/opd"),
                     "--setting", "toy", "--regime", "tuned", "--method", "opd", "--seed", "0", "--episodes", "16",
                     "--global-batch", "16", "--lr", "1e-3", "--opd-loss", "full", "--steps", "4", "--teacher", "t",
                     "--student", "s", "--teacher-success", "0.6", "--student-success", "0.3"]) == 0
    rows = rep.load_rows(results)
    assert len(rows) == 18
    assert rows[0]["loadavg_before"].startswith("0.5") and rows[0]["process_wall_s"] == 7.0
    # Per-turn KL over the last 3 steps: the mean of [1, 2 + s] for s = 1, 2, 3.
    assert rows[0]["summary"]["turn_kl_end"] == pytest.approx((2.0 + 2.5 + 3.0) / 3)
    by_cell = rep.cells(rows)
    got = rep.interaction(by_cell, "f2b")
    gains_tuned = [0.01, -0.01, 0.01]
    gains_unstable = [0.20, 0.15, 0.30]
    d = [u - t for u, t in zip(gains_unstable, gains_tuned)]
    assert got["seeds"] == [0, 1, 2]
    assert got["per_seed"] == pytest.approx(d)
    assert got["interaction"] == pytest.approx(sum(d) / 3)
    assert got["gain_tuned"] == pytest.approx(sum(gains_tuned) / 3)
    # The interaction's paired test is the one-sample t-test of d.
    assert got["p_paired"] == pytest.approx(rep.stats.paired(d, [0.0] * 3)[1])
    assert got["p_paired"] < 0.05
    assert rep.interaction(by_cell, "b2f") is None
    # Each non-tuned regime is compared with tuned on its own: official's gains minus tuned's.
    official = rep.interaction(by_cell, "f2b", regime="official")
    assert official["per_seed"] == pytest.approx([0.0 - 0.01, 0.0 + 0.01, 0.01 - 0.01])
    assert official["p_paired"] > 0.05
    within = rep.method_vs_opd(by_cell, "unstable", "f2b")
    assert within["diff"] == pytest.approx((1.25 - 0.60) / 3)
    # The report runs end to end on the rows (tables + plot).
    assert rep.main(["report", "--results-dir", str(results.parent), "--png-dir", str(tmp_path / "png")]) == 0
    assert (tmp_path / "png" / "tcod_regimes_toy.png").exists()
    tables = (results.parent / "tables.md").read_text()
    assert "| official | TCOD-F2B | eval success, end |" in tables and "| unstable | TCOD-F2B |" in tables
