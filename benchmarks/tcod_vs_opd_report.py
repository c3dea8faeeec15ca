"""Mean +- std over seeds of a TCOD vs vanilla OPD sweep (benchmarks/tcod_vs_opd.sh).

    python benchmarks/tcod_vs_opd_report.py --dir outputs/tcod-vs-opd/gridnav --setting gridnav \\
        [--teacher-success 0.75] [--start-eval 0.46]

Reads DIR/seed*/{opd,f2b,b2f,b2ft}/metrics.jsonl (b2ft: B2F with the teacher's own prefix). Per-run numbers come from
scripts/tcod_report.py (``summarize``: start/end of per-step series are 3-step means);
this module only averages them over seeds. Writes benchmarks/results/tcod_vs_opd/SETTING.md and
.json, and docs/en/assets/tcod_vs_opd_SETTING.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scripts.tcod_report import (  # noqa: E402
    TRAIN_SUCCESS, TRAJ_KL, eval_key, evals_of, mean_per_turn_kl, summarize, train_steps)
from slime.utils.metrics import read_metrics  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
import stats  # noqa: E402

METHODS = (("opd", "vanilla OPD"), ("f2b", "TCOD-F2B"), ("b2f", "TCOD-B2F"), ("b2ft", "TCOD-B2F, teacher prefix"))
# (method, baseline) pairs tested per setting, where both ran.
COMPARISONS = (("TCOD-F2B", "vanilla OPD"), ("TCOD-B2F", "vanilla OPD"), ("TCOD-B2F, teacher prefix", "vanilla OPD"),
               ("TCOD-B2F, teacher prefix", "TCOD-B2F"))


def load(out_dir: Path) -> dict[str, dict[int, list[dict]]]:
    """method -> seed -> metrics records, for every finished run under ``out_dir``."""
    runs: dict[str, dict[int, list[dict]]] = {m: {} for m, _ in METHODS}
    for seed_dir in sorted(out_dir.glob("seed*")):
        seed = int(seed_dir.name[len("seed"):])
        for method, _ in METHODS:
            path = seed_dir / method / "metrics.jsonl"
            if path.exists():
                records = read_metrics(str(path))
                key = eval_key(records)
                # A finished run evaluates at its last step (with --eval-interval it also evaluated earlier).
                if key and key in max(records, key=lambda r: r["step"]):
                    runs[method][seed] = records
    return runs


def mean_std(values) -> tuple[float | None, float | None, int]:
    values = [v for v in values if v is not None]
    if not values:
        return None, None, 0
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0), len(values)


def _pm(values, digits=2) -> str:
    mean, std, n = mean_std(values)
    if mean is None:
        return "-"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def run_numbers(records, start_eval) -> dict:
    s = summarize(records, start_eval)
    steps = train_steps(records)
    s["train_success_final"] = steps[-1].get(TRAIN_SUCCESS) if steps else None
    s["tokens_per_step"] = s["trained_tokens"] / max(1, len(steps))
    s["s_per_step"] = s["wall_time_s"] / max(1, len(steps))
    return s


def eval_curve(runs_of_method, start_eval) -> list[tuple[int, float, float]]:
    """(step, mean, std) of full-episode eval success over seeds, at the steps every seed evaluated."""
    per_seed = [dict(evals_of(records, start_eval)) for records in runs_of_method.values()]
    if not per_seed:
        return []
    steps = sorted(set.intersection(*(set(d) for d in per_seed)))
    return [(step, *mean_std(d[step] for d in per_seed)[:2]) for step in steps]


def curve_text(curve) -> str:
    """``step: mean`` pairs; step -1 is the student before training (its SFT run's evaluation)."""
    return ", ".join(f"{'start' if step < 0 else step}: {mean:.2f}" for step, mean, _ in curve)


def table(runs, start_eval) -> tuple[str, dict]:
    head = ("| method | seeds | steps | train success, last 3 steps | eval success (full episodes), end | "
            "trajectory KL first 3 -> last 3 steps | trained tokens total (per step) | "
            "train-loop wall time total s (per step) |")
    lines = [head, "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    summary = {}
    for method, name in METHODS:
        per_seed = {seed: run_numbers(records, start_eval) for seed, records in sorted(runs[method].items())}
        if not per_seed:
            continue
        col = {key: [s[key] for s in per_seed.values()] for key in next(iter(per_seed.values()))}
        summary[name] = {"per_seed": per_seed, "mean_std": {k: mean_std(v)[:2] for k, v in col.items()
                                                            if all(isinstance(x, (int, float)) or x is None for x in v)}}
        lines.append(
            f"| {name} | {len(per_seed)} | {per_seed[next(iter(per_seed))]['steps']} | "
            f"{_pm(col['train_success_end'])} | {_pm(col['eval_success_end'])} | "
            f"{_pm(col['traj_kl_start'])} -> {_pm(col['traj_kl_end'])} | "
            f"{_pm(col['trained_tokens'], 0)} ({_pm(col['tokens_per_step'], 0)}) | "
            f"{_pm(col['wall_time_s'], 0)} ({_pm(col['s_per_step'], 1)}) |")
    curves = {name: eval_curve(runs[method], start_eval) for method, name in METHODS if runs[method]}
    if any(len(c) > 2 for c in curves.values()):
        lines += ["", "| method | eval success over steps (mean over seeds) |", "| --- | --- |"]
        lines += [f"| {name} | {curve_text(curve)} |" for name, curve in curves.items()]
        for name, curve in curves.items():
            summary[name]["eval_curve"] = curve
    return "\n".join(lines), summary


def significance(summary: dict) -> str:
    """Each pair of COMPARISONS: final eval success and train-loop wall time, paired by seed where both
    methods ran the same seeds (and Welch), two-sided p."""
    lines = ["", "| comparison | metric | difference of means | paired t-test p (seeds) | Welch p |",
             "| --- | --- | --- | --- | --- |"]
    for name, baseline in COMPARISONS:
        other, base = summary.get(name), summary.get(baseline)
        if not other or not base:
            continue
        seeds = sorted(set(base["per_seed"]) & set(other["per_seed"]))
        for key, label in (("eval_success_end", "eval success, end"), ("wall_time_s", "wall time s")):
            a = [other["per_seed"][sd][key] for sd in seeds]
            b = [base["per_seed"][sd][key] for sd in seeds]
            if any(v is None for v in a + b):
                continue
            diff = statistics.fmean(a) - statistics.fmean(b)
            _, p_paired = stats.paired(a, b)
            _, p_welch = stats.welch(a, b)
            other["mean_std"][f"p_paired_{key}_vs_{baseline}"] = (p_paired, None)
            lines.append(f"| {name} vs {baseline} | {label} | {diff:+.3f} | {p_paired:.3g} ({len(seeds)}) | "
                         f"{p_welch:.3g} |")
    return "\n".join(lines) if len(lines) > 3 else ""


def per_turn_early_late(runs, method) -> tuple[list, list]:
    """Per-turn KL by turn index over the first and last third of the steps, averaged over seeds."""
    early, late = [], []
    for records in runs[method].values():
        steps = train_steps(records)
        third = max(1, len(steps) // 3)
        early.extend(steps[:third])
        late.extend(steps[-third:])
    return mean_per_turn_kl(early), mean_per_turn_kl(late)


def band(ax, series_list, color, label, style="-", floor=None, alpha=0.15):
    """Mean +- std over runs, step by step (steps where no run has a value are skipped); returns the top mean."""
    if not series_list:
        return None
    width = min(len(s) for s in series_list)
    xs, means, stds = [], [], []
    for i in range(width):
        mean, std, _ = mean_std(s[i] for s in series_list)
        if mean is not None:
            xs.append(i)
            means.append(mean)
            stds.append(std)
    ax.plot(xs, means, style, color=color, label=label)
    lows = [m - s if floor is None else max(floor, m - s) for m, s in zip(means, stds)]
    ax.fill_between(xs, lows, [m + s for m, s in zip(means, stds)], color=color, alpha=alpha)
    return max(means, default=0.0)


def _band(ax, runs_of_method, key, color, label):
    band(ax, [[r.get(key) for r in train_steps(records)] for records in runs_of_method.values()], color, label)


def plot(runs, png: Path, setting: str, teacher_success, start_eval) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    ax_succ, ax_kl, ax_turn, ax_cost = axes.flat
    ax_time = ax_cost.twinx()
    for i, (method, name) in enumerate(METHODS):
        color = f"C{i}"
        if not runs[method]:
            continue
        n = len(runs[method])
        _band(ax_succ, runs[method], TRAIN_SUCCESS, color, f"{name} train (its curriculum episodes)")
        curve = eval_curve(runs[method], start_eval)
        if curve:
            xs, means, stds = zip(*curve)
            ax_succ.errorbar(xs, means, yerr=stds, fmt="o--", color=color, capsize=3,
                             label=f"{name} eval, full episodes")
        _band(ax_kl, runs[method], TRAJ_KL, color, name)
        early, late = per_turn_early_late(runs, method)
        for curve, style, label in ((early, ":", "first third"), (late, "-", "last third")):
            turns = [t for t, v in enumerate(curve) if v is not None]
            ax_turn.plot(turns, [curve[t] for t in turns], style, marker=".", color=color, label=f"{name}, {label}")
        _band(ax_cost, runs[method], "rollout/trained_tokens", color, f"{name} trained tokens/step")
        _band(ax_time, runs[method], "time/step", color, f"{name} s/step (dashed)")
        ax_time.lines[-1].set_linestyle("--")
        ax_cost.set_title(f"trained tokens per step (solid) and train-loop s/step (dashed), {n} seeds")
    if teacher_success is not None:
        ax_succ.axhline(teacher_success, color="k", lw=0.8, ls="-.", label="teacher eval")
    ax_succ.set(title=f"{setting}: success rate (mean ± std over seeds)", xlabel="step", ylabel="success",
                ylim=(-0.02, 1.02))
    ax_kl.set(title="trajectory KL to the teacher (sum over student tokens)", xlabel="step")
    ax_turn.set(title="per-turn KL by turn index: first vs last third of steps", xlabel="turn index (0-based)",
                ylabel="KL")
    ax_cost.set(xlabel="step", ylabel="tokens")
    ax_time.set(ylabel="seconds per step")
    save_figure(fig, axes, png)


def save_figure(fig, axes, png: Path) -> None:
    """Grid and legend on every panel, then write ``png`` (its folder made) and free the figure."""
    import matplotlib.pyplot as plt

    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=80)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True, type=Path)
    p.add_argument("--setting", required=True)
    p.add_argument("--teacher-success", type=float)
    p.add_argument("--start-eval", type=float, help="the student's eval success before OPD (from its SFT run)")
    p.add_argument("--results-dir", type=Path, default=REPO / "benchmarks/results/tcod_vs_opd")
    p.add_argument("--png", type=Path)
    args = p.parse_args(argv)
    runs = load(args.dir)
    md, summary = table(runs, args.start_eval)
    md += "\n" + significance(summary)
    head = (f"{args.setting}: teacher eval success {args.teacher_success}, student (start) {args.start_eval}; "
            "mean ± std over seeds")
    print(head + "\n\n" + md)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / f"{args.setting}.md").write_text(head + "\n\n" + md + "\n")
    (args.results_dir / f"{args.setting}.json").write_text(json.dumps(
        {"setting": args.setting, "teacher_success": args.teacher_success, "start_eval": args.start_eval,
         "methods": summary}, indent=1, default=str) + "\n")
    plot(runs, args.png or REPO / f"docs/en/assets/tcod_vs_opd_{args.setting}.png", args.setting,
         args.teacher_success, args.start_eval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
