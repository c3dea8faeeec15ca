"""The demo's SFT evaluations: the teacher's and the student's held-out success, from one metrics.jsonl.

    python -m scripts.sft_eval OUT_DIR/sft/metrics.jsonl --teacher-step 89 --student-step 19 --tasks 96

Prints ``TEACHER STUDENT`` (for scripts/run-tiny-tcod.sh to read) and, on stderr, a warning when the
teacher is not better than the student: distillation then has nothing to close, and the three runs
that follow would only measure noise. Reads the file with ``json`` alone, so it costs no torch import.
"""

from __future__ import annotations

import argparse
import json
import sys

KEY = "eval/gridnav/success_rate"


def sft_successes(path: str, teacher_step: int, student_step: int, key: str = KEY) -> tuple[float, float]:
    """(teacher, student) held-out success at those steps of the SFT run's metrics file."""
    found = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line) if line.strip() else {}
            if key in row and row.get("step") in (teacher_step, student_step):
                found[row["step"]] = row[key]
    missing = [step for step in (teacher_step, student_step) if step not in found]
    if missing:
        raise ValueError(f"{path}: no {key} at step {', '.join(map(str, missing))}")
    return found[teacher_step], found[student_step]


def gap_warning(teacher: float, student: float, tasks: int) -> str | None:
    """The warning line when the teacher is not ahead of the student, else None."""
    if teacher > student:
        return None
    return (f"run-tiny-tcod.sh: warning: the teacher ({teacher:.2f}) is not better than the student "
            f"({student:.2f}) on the {tasks} held-out tasks; distillation has nothing to close: raise TEACHER_STEPS")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", help="the SFT run's metrics.jsonl")
    parser.add_argument("--teacher-step", type=int, required=True, help="rollout step of the teacher's checkpoint")
    parser.add_argument("--student-step", type=int, required=True, help="rollout step of the student's checkpoint")
    parser.add_argument("--tasks", type=int, required=True, help="number of held-out tasks evaluated (EVAL_N)")
    args = parser.parse_args(argv)
    try:
        teacher, student = sft_successes(args.metrics, args.teacher_step, args.student_step)
    except (OSError, ValueError) as exc:
        print(f"run-tiny-tcod.sh: {exc}", file=sys.stderr)
        return 1
    warning = gap_warning(teacher, student, args.tasks)
    if warning:
        print(warning, file=sys.stderr)
    print(teacher, student)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
