"""Table of the CPU demo under float-rounding variants (benchmarks/demo_variants.sh), beside the recorded runs.

    python benchmarks/demo_variants_report.py --out-root outputs/demo-variants --variants native avx2 --seeds 0 1 2

Per variant and seed: the teacher's and the student's held-out success (the SFT run's evaluations, read as
scripts/run-tiny-tcod.sh reads them), vanilla OPD's last evaluation and the share of the teacher-student gap
it closed; and where the run parts from the recorded one in benchmarks/results/demo_3seeds (the first SFT
step whose record differs, timings left out; which OPD metrics differ in any step). Then the headline's spread
over every run with a gap: mean, sd, min, max, and how many runs closed more than half.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.demo_seeds_report import demo_steps  # noqa: E402
from scripts.sft_eval import sft_successes  # noqa: E402
from scripts.tcod_report import summarize  # noqa: E402
from slime.utils.metrics import read_metrics  # noqa: E402

RECORDED = REPO / "benchmarks" / "results" / "demo_3seeds"
TIMING_KEYS = ("time", "step_s", "wall", "perf/")  # wall-clock fields differ on every run, rounding or not


def _numbers(row: dict) -> dict:
    return {k: v for k, v in row.items() if not any(t in k for t in TIMING_KEYS)}


def first_difference(run: list[dict], recorded: list[dict]) -> int | None:
    """The first step whose record (timings left out) differs from the recorded run's; None if all are equal."""
    for index, (mine, theirs) in enumerate(zip(run, recorded)):
        if _numbers(mine) != _numbers(theirs):
            return mine.get("step", index)
    if len(run) != len(recorded):  # one run has steps the other has not: they part at the first of those
        return min(len(run), len(recorded))
    return None


def _row(variant: str, seed: int, log: Path, sft_path: Path, opd: list[dict]) -> dict:
    teacher_step, student_step = demo_steps(log)
    teacher, student = sft_successes(str(sft_path), teacher_step, student_step)
    end = summarize(opd)["eval_success_end"]
    return {"variant": variant, "seed": seed, "teacher": teacher, "student": student, "opd": end,
            "closed": (end - student) / (teacher - student) if teacher > student and end is not None else None}


def recorded_row(seed: int) -> dict:
    """The recorded run of the seed (this machine's default kernels), as the table's first rows."""
    run = RECORDED / f"seed{seed}"
    return _row("recorded", seed, run / "phases.txt", run / "sft.jsonl", read_metrics(run / "opd.jsonl"))


def differing_keys(run: list[dict], recorded: list[dict]) -> list[str]:
    """The metrics (timings left out) that differ from the recorded run's in any step."""
    keys = {k for mine, theirs in zip(run, recorded) for k in set(_numbers(mine)) | set(_numbers(theirs))
            if mine.get(k) != theirs.get(k)}
    return sorted(keys) + (["(number of steps)"] if len(run) != len(recorded) else [])


def run_row(out_root: Path, variant: str, seed: int) -> dict:
    run_dir = out_root / variant / f"seed{seed}"
    sft, opd = read_metrics(run_dir / "sft" / "metrics.jsonl"), read_metrics(run_dir / "opd" / "metrics.jsonl")
    row = _row(variant, seed, out_root / variant / f"seed{seed}.log", run_dir / "sft" / "metrics.jsonl", opd)
    recorded = RECORDED / f"seed{seed}"
    if (recorded / "sft.jsonl").exists():
        row["sft_parts_at"] = first_difference(sft, read_metrics(recorded / "sft.jsonl"))
        row["opd_differs"] = differing_keys(opd, read_metrics(recorded / "opd.jsonl"))
    return row


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def table(rows: list[dict]) -> str:
    lines = ["| variant | seed | teacher / student | vanilla OPD (gap closed) | SFT parts from the recorded run "
             "at step | OPD records equal to the recorded |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        parts = r.get("sft_parts_at", "-")
        parts = "never" if parts is None else str(parts)
        differs = r.get("opd_differs")
        equal = ("-" if differs is None else "yes" if not differs else
                 f"all but {', '.join(differs)}" if len(differs) <= 2 else f"no ({len(differs)} metrics differ)")
        opd = "-" if r["opd"] is None else f"{r['opd']:.2f}"
        lines.append(f"| {r['variant']} | {r['seed']} | {r['teacher']:.2f} / {r['student']:.2f} | "
                     f"{opd} ({_pct(r['closed'])}) | {parts} | {equal} |")
    # a rerun with the recorded run's SFT and its OPD result is the same run for the headline: counted once
    recorded = {r["seed"]: r["opd"] for r in rows if r["variant"] == "recorded"}
    distinct = [r for r in rows if not (r["variant"] != "recorded" and r["seed"] in recorded
                                        and r.get("sft_parts_at", 0) is None and r["opd"] == recorded[r["seed"]])]
    closed = [r["closed"] for r in distinct if r["closed"] is not None]
    if len(closed) >= 2:
        lines.append(f"\nGap closed by vanilla OPD over {len(closed)} distinct runs: "
                     f"mean {_pct(statistics.mean(closed))}, "
                     f"sd {_pct(statistics.stdev(closed))}, min {_pct(min(closed))}, max {_pct(max(closed))}; "
                     f"above half in {sum(c > 0.5 for c in closed)} of {len(closed)}.")
    no_gap = [f"{r['variant']} seed {r['seed']}" for r in rows if r["closed"] is None]
    if no_gap:
        lines.append(f"No teacher-student gap (left out): {', '.join(no_gap)}.")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-root", type=Path, required=True, help="demo_variants.sh's OUT_ROOT")
    parser.add_argument("--variants", nargs="+", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    parser.add_argument("--with-recorded", action="store_true", help="the recorded runs of those seeds first")
    args = parser.parse_args(argv)
    rows = [recorded_row(s) for s in args.seeds if (RECORDED / f"seed{s}").is_dir()] if args.with_recorded else []
    # a variant may have been run for fewer seeds (demo_variants.sh keeps finished runs): those present count
    rows += [run_row(args.out_root, v, s) for v in args.variants for s in args.seeds
             if (args.out_root / v / f"seed{s}" / "opd" / "metrics.jsonl").exists()]
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
