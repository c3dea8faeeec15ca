"""TCOD's premise gate: does vanilla OPD's per-turn KL grow with turn depth on this setting?

TCOD exists because, in vanilla OPD, a student that compounds its errors drifts out of the teacher's
support late in an episode, so the per-turn KL rises with the turn index (the paper's Fig. 2). A
setting where it does not rise cannot test the curriculum. The gate, fixed before any TCOD run
(docs/en/benchmarks.md, "TCOD on its own premise"):

* statistic: for every trained episode of vanilla OPD's first ``--first-steps`` rollout steps (every
  seed given), the least-squares slope of its per-token mean KL per student turn against the turn
  index (``opd/turn_kl_slopes``, logged by ``slime.utils.step_metrics``; episodes of 3+ turns). Taken
  within each episode, it is not faked by only the failing episodes reaching late turns;
* it passes when the 95% confidence interval of the mean slope (t, over episodes) lies above 0, every
  seed's mean slope is above 0, and the teacher beats the student on the held-out tasks.

    python benchmarks/tcod_premise.py --runs DIR [DIR ...] --teacher-success 0.6 --student-success 0.2 \\
        [--first-steps 3] [--out gate.json]

Each DIR holds one vanilla OPD run's metrics.jsonl. Prints one verdict line; exit 0 when the gate passes,
1 when it fails (the report then compares nothing on this setting).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stats import mean_ci  # noqa: E402

KEY = "opd/turn_kl_slopes"


def run_slopes(run_dir: Path, first_steps: int, by_turn: dict[int, list[float]]) -> tuple[list[float], str | None]:
    """The per-episode slopes of a run's first ``first_steps`` rollout steps, and which KL they read; each
    step's mean per-turn KL by turn index (``opd/per_turn_kl``) is added to ``by_turn``."""
    slopes, source = [], None
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if 0 <= row.get("step", -1) < first_steps and KEY in row:
            slopes += [float(v) for v in row[KEY]]
            source = row.get("opd/turn_kl_slope_source", source)
            for i, value in enumerate(row.get("opd/per_turn_kl") or []):
                if value is not None:
                    by_turn.setdefault(i, []).append(float(value))
    return slopes, source


def gate(runs: list[Path], first_steps: int, teacher_success: float, student_success: float) -> dict:
    per_seed, pooled, sources, by_turn = {}, [], set(), {}
    for run in runs:
        slopes, source = run_slopes(run, first_steps, by_turn)
        if not slopes:
            raise SystemExit(f"tcod_premise: {run}/metrics.jsonl has no {KEY} in its first {first_steps} steps "
                             "(vanilla OPD with a teacher that scores, episodes of 3+ turns)")
        per_seed[str(run)] = statistics.fmean(slopes)
        pooled += slopes
        sources.add(source)
    mean, low, high = mean_ci(pooled)
    checks = {
        "ci_above_zero": low > 0,
        "every_seed_positive": all(v > 0 for v in per_seed.values()),
        "teacher_beats_student": teacher_success > student_success,
    }
    return {"slope_mean": mean, "ci95": [low, high], "episodes": len(pooled), "first_steps": first_steps,
            "per_seed_mean": per_seed, "kl": sorted(s or "?" for s in sources), "teacher_success": teacher_success,
            "student_success": student_success, "checks": checks, "passed": all(checks.values()),
            # Mean over steps and seeds at each turn index: the paper's Fig. 2 view, shown beside the statistic
            # but not the statistic (late indices hold only the episodes that ran long).
            "per_turn_kl_by_index": [round(statistics.fmean(by_turn[i]), 4) if i in by_turn else None
                                     for i in range(max(by_turn, default=-1) + 1)]}


def verdict_line(result: dict) -> str:
    low, high = result["ci95"]
    failed = [name for name, ok in result["checks"].items() if not ok]
    head = "PASSED" if result["passed"] else f"FAILED ({', '.join(failed)})"
    return (f"premise gate {head}: per-turn KL slope {result['slope_mean']:+.4f} per turn, 95% CI [{low:+.4f}, "
            f"{high:+.4f}] over {result['episodes']} episodes of the first {result['first_steps']} steps "
            f"({len(result['per_seed_mean'])} seeds, {'/'.join(result['kl'])} KL); teacher "
            f"{result['teacher_success']:.2f} vs student {result['student_success']:.2f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", type=Path, required=True, help="vanilla OPD run dirs (metrics.jsonl)")
    parser.add_argument("--first-steps", type=int, default=3, help="rollout steps read from each run's start")
    parser.add_argument("--teacher-success", type=float, required=True, help="teacher's held-out eval success")
    parser.add_argument("--student-success", type=float, required=True, help="student's held-out eval success")
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    result = gate(args.runs, args.first_steps, args.teacher_success, args.student_success)
    result["verdict"] = verdict_line(result)
    print(result["verdict"])
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
