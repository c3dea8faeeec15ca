"""Table and plot comparing training runs from their ``metrics.jsonl`` files (the CPU demo's last step).

    python -m scripts.tcod_report --run "vanilla OPD" OUT/opd/metrics.jsonl \\
        --run "TCOD-F2B" OUT/f2b/metrics.jsonl --run "TCOD-B2F" OUT/b2f/metrics.jsonl \\
        [--teacher-success 0.9 --start-eval 0.3 --eval-tasks 96] --png OUT/tcod.png --md OUT/table.md

The table gives each run's share of the teacher-student gap, (end - student) / (teacher - student) on the
held-out evaluation, beside the teacher's and the student's success it is computed from. Figures are rounded
for people; the metrics files keep every digit.

Train success is measured on the episodes each run trains on: under TCOD those are curriculum
episodes (F2B cut after k turns, B2F started after an expert prefix), so only the eval columns (full
episodes for every run) compare the methods directly.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from slime.utils.metrics import read_metrics

TRAIN_SUCCESS = "multi_turn/success_rate"
TRAJ_KL = "opd/trajectory_kl_mean"
PER_TURN_KL = "opd/per_turn_kl"


def eval_key(records) -> str | None:
    """The first ``eval/<set>/success_rate`` key present (the demo evaluates on one set)."""
    for record in records:
        for key in record:
            if key.startswith("eval/") and key.endswith("/success_rate"):
                return key
    return None


def train_steps(records) -> list[dict]:
    # Step -1 is the evaluation before training; it has no training metrics.
    return sorted((r for r in records if r.get("step", -1) >= 0), key=lambda r: r["step"])


def _window_mean(values, first: bool, width: int = 3):
    values = [v for v in values if v is not None]
    if not values:
        return None
    part = values[:width] if first else values[-width:]
    return sum(part) / len(part)


def evals_of(records, start_eval: float | None = None) -> list[tuple[int, float]]:
    """(step, eval success) pairs; ``start_eval`` stands for a step -1 evaluation the run skipped."""
    key = eval_key(records)
    evals = sorted((r["step"], r[key]) for r in records if key and key in r)
    if start_eval is not None and not any(step < 0 for step, _ in evals):
        evals.insert(0, (-1, start_eval))
    return evals


def summarize(records, start_eval: float | None = None) -> dict:
    """Start/end numbers of one run. Start/end of noisy per-step series are means of 3 steps."""
    steps = train_steps(records)
    evals = evals_of(records, start_eval)
    return {
        "steps": len(steps),
        "train_success_start": _window_mean([r.get(TRAIN_SUCCESS) for r in steps], True),
        "train_success_end": _window_mean([r.get(TRAIN_SUCCESS) for r in steps], False),
        "eval_success_start": evals[0][1] if evals else None,
        "eval_success_end": evals[-1][1] if evals else None,
        "traj_kl_start": _window_mean([r.get(TRAJ_KL) for r in steps], True),
        "traj_kl_end": _window_mean([r.get(TRAJ_KL) for r in steps], False),
        "wall_time_s": sum(r.get("time/step", 0.0) for r in steps),
        "trained_tokens": int(sum(r.get("rollout/trained_tokens", 0) for r in steps)),
    }


def gap_closed(student: float | None, end: float | None, teacher: float | None) -> float | None:
    """Share of the teacher-student gap a run closed: (end - student) / (teacher - student). None when a figure is
    missing or the teacher is not ahead of the student (there is no gap to close)."""
    if student is None or end is None or teacher is None or teacher <= student:
        return None
    return (end - student) / (teacher - student)


# Figures for people: success and KL to 2 decimals, shares in whole percent, tokens with thousands separators.
# The metrics files keep every digit.
def _fmt(value, digits=2) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}f}"


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f}%"


def _gap_cell(s: dict, teacher: float | None) -> str:
    share = gap_closed(s["eval_success_start"], s["eval_success_end"], teacher)
    if share is None and teacher is not None and s["eval_success_start"] is not None:
        return "no gap" if teacher <= s["eval_success_start"] else "-"
    return _percent(share)


def _tokens_cell(s: dict, first: dict | None) -> str:
    """Trained tokens, and their change from the first run (the table's reference) for the others."""
    cell = _fmt(s["trained_tokens"])
    if first is not None and first is not s and first["trained_tokens"]:
        cell += f" ({100 * (s['trained_tokens'] / first['trained_tokens'] - 1):+.0f}%)"
    return cell


def markdown_table(runs: dict[str, dict], teacher_success: float | None = None) -> str:
    """One row per run. "gap closed" is (eval end - student) / (teacher - student), with the teacher's and the
    student's eval success in the row it is computed from; the first run is the trained tokens' reference."""
    head = ("| run | steps | eval success: teacher | student at start -> end | gap closed | "
            "train success start -> end | trajectory KL start -> end | wall time (s) | trained tokens |")
    lines = [head, "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    first = next(iter(runs.values()), None)
    for name, s in runs.items():
        lines.append(
            f"| {name} | {s['steps']} | {_fmt(teacher_success)} | "
            f"{_fmt(s['eval_success_start'])} -> {_fmt(s['eval_success_end'])} | {_gap_cell(s, teacher_success)} | "
            f"{_fmt(s['train_success_start'])} -> {_fmt(s['train_success_end'])} | "
            f"{_fmt(s['traj_kl_start'])} -> {_fmt(s['traj_kl_end'])} | {s['wall_time_s']:.0f} | "
            f"{_tokens_cell(s, first)} |")
    return "\n".join(lines)


GAP_NOTE = ("gap closed = (student at end - student at start) / (teacher - student at start), eval success on "
            "held-out tasks, full episodes; figures rounded (metrics.jsonl keeps every digit)")


def headline(runs: dict[str, dict], teacher_success: float | None, tasks: int | None = None) -> list[str]:
    """The table's gap column in a sentence, with the figures it comes from: one line when every run starts from
    the same student (the demo), else one line per run."""
    on = f" on {tasks} held-out tasks" if tasks else " on the held-out tasks"
    shares = {name: gap_closed(s["eval_success_start"], s["eval_success_end"], teacher_success)
              for name, s in runs.items()}
    shown = {name: s for name, s in runs.items() if shares[name] is not None}
    starts = {s["eval_success_start"] for s in shown.values()}
    if not shown:
        return []
    if len(starts) == 1:
        parts = ", ".join(f"{name} {_percent(shares[name])} (to {_fmt(s['eval_success_end'])})"
                          for name, s in shown.items())
        return [f"gap closed{on}, from the student's {_fmt(starts.pop())} toward the teacher's "
                f"{_fmt(teacher_success)}: {parts}"]
    return [f"{name} closed {_percent(shares[name])} of the gap{on}: {_fmt(s['eval_success_start'])} -> "
            f"{_fmt(s['eval_success_end'])}, teacher {_fmt(teacher_success)}" for name, s in shown.items()]


def mean_per_turn_kl(steps) -> list[float | None]:
    """Per-turn KL averaged over ``steps``, turn index by turn index (a turn absent in a step is skipped)."""
    sums, counts = {}, {}
    for record in steps:
        for turn, value in enumerate(record.get(PER_TURN_KL) or []):
            if value is not None:
                sums[turn] = sums.get(turn, 0.0) + value
                counts[turn] = counts.get(turn, 0) + 1
    width = max(sums, default=-1) + 1
    return [sums[t] / counts[t] if t in counts else None for t in range(width)]


EVAL_MARKERS = ("o", "s", "^", "D", "v", "P")  # one shape per run: runs from one student share the first point


def plot(runs: dict[str, list[dict]], png, teacher_success: float | None = None,
         start_eval: float | None = None) -> None:
    import matplotlib.pyplot as plt

    fig = figure(runs, teacher_success, start_eval)
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=90)
    plt.close(fig)


def figure(runs: dict[str, list[dict]], teacher_success: float | None = None, start_eval: float | None = None):
    """The four panels. Evaluations are points, not a line: a demo evaluates twice (its student and its end), and a
    line between two points reads as a trend that was never measured."""
    import matplotlib

    matplotlib.use("Agg")  # no display on CI or a server
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    ax_succ, ax_kl, ax_turn, ax_time = axes.flat
    for i, (name, records) in enumerate(runs.items()):
        color = f"C{i}"
        steps = train_steps(records)
        xs = [r["step"] for r in steps]
        ax_succ.plot(xs, [r.get(TRAIN_SUCCESS) for r in steps], color=color, alpha=0.35, label=f"{name} train")
        evals = evals_of(records, start_eval)
        if evals:
            share = gap_closed(evals[0][1], evals[-1][1], teacher_success)
            closed = f", {_percent(share)} of the gap" if share is not None else ""
            ax_succ.plot(*zip(*evals), linestyle="none", marker=EVAL_MARKERS[i % len(EVAL_MARKERS)],
                         markersize=max(4, 10 - 2 * i),  # smaller on top: equal points stay visible
                         color=color, label=f"{name} eval (full episodes{closed})")
        ax_kl.plot(xs, [r.get(TRAJ_KL) for r in steps], color=color, label=name)
        third = max(1, len(steps) // 3)
        for part, style, label in ((steps[:third], ":", "first third"), (steps[-third:], "-", "last third")):
            curve = mean_per_turn_kl(part)
            turns = [t for t, v in enumerate(curve) if v is not None]
            ax_turn.plot(turns, [curve[t] for t in turns], style, marker=".", color=color, label=f"{name}, {label}")
        ax_time.plot(xs, _cumsum(r.get("time/step", 0.0) for r in steps), color=color, label=name)
    if teacher_success is not None:
        ax_succ.axhline(teacher_success, color="k", lw=0.8, ls="-.", label="teacher eval")
    ax_succ.set(title="success rate (eval: points; step -1 is the student)", xlabel="step", ylabel="success",
                ylim=(-0.02, 1.02))
    ax_kl.set(title="trajectory KL to the teacher (sum over student tokens)", xlabel="step")
    ax_turn.set(title="per-turn KL by turn index (episode turn, 0-based)", xlabel="turn index", ylabel="KL")
    ax_time.set(title="wall time of the training loop", xlabel="step", ylabel="seconds (cumulative)")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _cumsum(values):
    total, out = 0.0, []
    for v in values:
        total += v
        out.append(total)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Compare runs: markdown table and a PNG plot.")
    parser.add_argument("--run", nargs=2, action="append", metavar=("NAME", "METRICS_JSONL"), required=True)
    parser.add_argument("--teacher-success", type=float, default=None, help="drawn as a line on the success plot")
    parser.add_argument("--start-eval", type=float, default=None,
                        help="eval success of the starting policy, for runs that skipped the step -1 evaluation")
    parser.add_argument("--eval-tasks", type=int, default=None, help="held-out tasks evaluated, named in the summary")
    parser.add_argument("--png", default=None, help="the plot, written to this path (and the path printed)")
    parser.add_argument("--md", default=None, help="the table and its summary, written to this path (printed)")
    args = parser.parse_args(argv)
    runs = {name: read_metrics(path) for name, path in args.run}
    summaries = {name: summarize(records, args.start_eval) for name, records in runs.items()}
    table = markdown_table(summaries, args.teacher_success)
    lines = headline(summaries, args.teacher_success, args.eval_tasks)
    text = "\n".join([table, "", GAP_NOTE, *([""] + lines if lines else [])])
    print(text)
    if args.md:
        Path(args.md).write_text(text + "\n")
        print(f"table: {args.md}")
    if args.png:
        plot(runs, args.png, args.teacher_success, args.start_eval)
        print(f"plot: {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
