"""The faithful TCOD grid's rows, lr pick and report (benchmarks/tcod_faithful_report.py) on fabricated runs."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import tcod_faithful_report as report  # noqa: E402


def fake_run(path, eval_end, kl_start, kl_end, tokens, turn_kls, t04=None, steps=6):
    path.mkdir(parents=True)
    rows = []
    for step in range(steps):
        kl = kl_start + (kl_end - kl_start) * step / (steps - 1)
        rows.append({"step": step, "opd/trajectory_kl_mean": kl, "rollout/trained_tokens": tokens,
                     "rollout/student_turns": 64 + step % 2, "rollout/episodes": 8, "time/step": 1.0,
                     "opd/per_turn_kl": turn_kls(step), "opd/turn_kl_slopes": [0.1, 0.3]})
    rows[-1]["eval/gridnav-xl/success_rate"] = eval_end
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "process_wall_s.txt").write_text("100\n")
    if t04 is not None:
        (path / "eval_T0.4.txt").write_text(f"{t04}\n")
    return path


def test_pick_lr_takes_the_best_baseline_that_learned(tmp_path, capsys):
    flat = lambda step: [1.0, 2.0]  # noqa: E731
    fake_run(tmp_path / "lr3e-4" / "seed0" / "opd", 0.30, 10.0, 8.0, 100, flat)
    fake_run(tmp_path / "lr1e-3" / "seed0" / "opd", 0.40, 10.0, 6.0, 100, flat)
    fake_run(tmp_path / "lr3e-3" / "seed0" / "opd", 0.50, 10.0, 12.0, 100, flat)  # best eval, but KL rose
    pick = ["pick-lr", "--root", str(tmp_path), "--lrs", "3e-4", "1e-3", "3e-3", "--student-success"]
    assert report.main(pick + ["0.2"]) == 0
    assert capsys.readouterr().out.strip() == "1e-3"
    assert report.main(pick + ["0.45"]) == 1  # 1e-3's KL fell, but its eval did not rise above the student's
    capsys.readouterr()
    (tmp_path / "lr1e-3").rename(tmp_path / "gone")
    (tmp_path / "lr3e-4").rename(tmp_path / "gone2")
    fake_run(tmp_path / "lr3e-4" / "seed0" / "opd", 0.3, 10.0, 11.0, 100, flat)
    fake_run(tmp_path / "lr1e-3" / "seed0" / "opd", 0.3, 10.0, 11.0, 100, flat)
    assert report.main(pick + ["0.2"]) == 1
    assert "a baseline that does not learn measures nothing" in capsys.readouterr().err


def test_rows_and_report(tmp_path):
    results = tmp_path / "results"
    rising = lambda step: [0.5, 1.0, 2.0] if step < 3 else [0.5, 0.6, 0.7]  # noqa: E731
    common = ["--setting", "gridnav-xl", "--lr", "1e-3", "--steps", "6", "--turns", "64", "--eta", "2",
              "--k-max", "16", "--teacher-success", "0.6", "--student-success", "0.2"]
    for seed in range(3):
        for method, eval_end, tokens in (("opd", 0.40 + seed / 100, 1000), ("f2b", 0.45 + seed / 50, 800),
                                         ("b2f", 0.41, 900)):
            run = fake_run(tmp_path / f"s{seed}" / method, eval_end, 10.0, 5.0, tokens, rising, t04=eval_end + 0.1)
            argv = ["row", "--results", str(results / "gridnav-xl.jsonl"), "--run-dir", str(run),
                    "--method", method, "--seed", str(seed), *common]
            assert report.main(argv) == 0
    assert report.main(argv) == 0  # a rerun replaces its row
    rows = [json.loads(line) for line in (results / "gridnav-xl.jsonl").read_text().splitlines()]
    assert len(rows) == 9 and rows[-1]["eval_success_t04"] == 0.51 and rows[0]["series"]["student_turns"][1] == 65
    gate = {"verdict": "premise gate PASSED: ...", "passed": True}
    (results / "gridnav-xl_gate.json").write_text(json.dumps(gate))
    (results / "hanoi-4_gate.json").write_text(json.dumps({"verdict": "premise gate FAILED (ci_above_zero)",
                                                          "passed": False}))
    (results / "hanoi-5_gate.json").write_text(json.dumps({"verdict": "premise gate PASSED: ...", "passed": True}))
    (results / "hanoi-5_lr.txt").write_text("lr 3e-4: eval 0.000, trajectory KL 9.00 -> 8.00\n")
    assert report.main(["report", "--results-dir", str(results), "--png-dir", str(tmp_path / "png")]) == 0
    text = (results / "REPORT.md").read_text()
    assert "| TCOD-F2B | 3 | 0.47 ± 0.02 | 0.57 ± 0.02 |" in text
    assert "| TCOD-F2B | +0.060 (p 0.0091) | +0.060 (p 0.0091) | -1200 (p nan) |" in text  # 200 a step, each seed
    assert "| 9.00 ± 0.00 -> 6.00 ± 0.00 | 0.200 ± 0.000 -> 0.200 ± 0.000 |" in text  # KL, turn-KL slope
    assert "- vanilla OPD: [0.50, 1.00, 2.00] -> [0.50, 0.60, 0.70]" in text
    assert "found no rate at which vanilla OPD learned:\n\n    lr 3e-4: eval 0.000" in text  # its lr note
    assert "## hanoi-4" in text and "no method is compared on this setting" in text
    assert (tmp_path / "png" / "tcod_faithful_gridnav-xl.png").exists()
