"""Table of the CPU demo over seeds (benchmarks/demo_seeds.sh): the figures of docs/en/demo.md#results.

    python benchmarks/demo_seeds_report.py --out-root outputs/demo-seeds --seeds 0 1 2

Per seed, the teacher's and the student's held-out success come from the SFT run's evaluations (read
as scripts/run-tiny-tcod.sh reads them, at the steps it used), and each method's from its last
evaluation. "Gap closed" is (method - student) / (teacher - student): the share of the teacher's lead
that distillation won back; a seed whose teacher is not ahead has no gap and is named, not averaged.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scripts.sft_eval import sft_successes  # noqa: E402
from scripts.tcod_report import summarize  # noqa: E402
from slime.utils.metrics import read_metrics  # noqa: E402

METHODS = (("opd", "vanilla OPD"), ("f2b", "TCOD-F2B"), ("b2f", "TCOD-B2F"))


def demo_steps(log: Path) -> tuple[int, int]:
    """(teacher step, student step) of the SFT run, from the demo's own phase line in its log."""
    found = re.search(r"teacher \((\d+) steps\), student \(checkpoint at (\d+)\)", log.read_text(encoding="utf-8"))
    if not found:
        raise ValueError(f"{log}: no SFT phase line (was it written by scripts/run-tiny-tcod.sh?)")
    return int(found.group(1)) - 1, int(found.group(2)) - 1


def seed_row(out_root: Path, seed: int) -> dict:
    seed_dir = out_root / f"seed{seed}"
    teacher_step, student_step = demo_steps(out_root / f"seed{seed}.log")
    teacher, student = sft_successes(str(seed_dir / "sft" / "metrics.jsonl"), teacher_step, student_step)
    row = {"seed": seed, "teacher": teacher, "student": student}
    for name, _ in METHODS:
        end = summarize(read_metrics(seed_dir / name / "metrics.jsonl"))["eval_success_end"]
        row[name] = end
        row[f"{name}_closed"] = (end - student) / (teacher - student) if teacher > student and end is not None else None
    return row


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def table(rows: list[dict]) -> str:
    lines = ["| seed | teacher / student | " + " | ".join(label for _, label in METHODS) + " |",
             "| --- | --- |" + " --- |" * len(METHODS)]
    for row in rows:
        cells = [f"{row[name]:.2f} ({_pct(row[f'{name}_closed'])} of the gap)" for name, _ in METHODS]
        lines.append(f"| {row['seed']} | {row['teacher']:.2f} / {row['student']:.2f} | " + " | ".join(cells) + " |")
    summary = []
    for name, _ in METHODS:
        closed = [row[f"{name}_closed"] for row in rows if row[f"{name}_closed"] is not None]
        if len(closed) >= 2:
            summary.append(f"**{_pct(statistics.mean(closed))} ± {_pct(statistics.stdev(closed))}**")
        else:
            summary.append(_pct(closed[0]) if closed else "-")
    lines.append("| mean ± sd of the gap closed | | " + " | ".join(summary) + " |")
    no_gap = [str(row["seed"]) for row in rows if row["teacher"] <= row["student"]]
    if no_gap:
        lines.append(f"\nNo teacher-student gap (left out of the mean): seed {', '.join(no_gap)}.")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-root", type=Path, required=True, help="demo_seeds.sh's OUT_ROOT")
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    args = parser.parse_args(argv)
    print(table([seed_row(args.out_root, seed) for seed in args.seeds]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
