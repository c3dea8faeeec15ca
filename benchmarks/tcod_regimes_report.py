"""When does TCOD's curriculum help (issue 24): regime x method x seed tables, tests and plots.

    python benchmarks/tcod_regimes_report.py row --results R.jsonl --run-dir DIR --setting S --regime tuned \\
        --method opd --seed 0 ...       # one raw row per run (benchmarks/tcod_regimes.sh calls it)
    python benchmarks/tcod_regimes_report.py report [--results-dir benchmarks/results/tcod_regimes]

``row`` turns one run's metrics.jsonl (plus its flags, seed, load average and process wall time) into a
self-contained jsonl row with the per-step series, so the tables and plots are rebuilt from the rows
alone. ``report`` reads every SETTING.jsonl in the results dir and writes tables.md / summary.json
there and docs/en/assets/tcod_regimes_SETTING.png. Per-run numbers come from scripts/tcod_report.py
(``summarize``) via benchmarks/tcod_vs_opd_report.py (``run_numbers``); tests from benchmarks/stats.py.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import stats  # noqa: E402
from scripts.tcod_report import PER_TURN_KL, TRAJ_KL, eval_key, mean_per_turn_kl, train_steps  # noqa: E402
from slime.utils.metrics import read_metrics  # noqa: E402
from tcod_vs_opd_report import band, mean_std, run_numbers, save_figure  # noqa: E402

METHODS = (("opd", "vanilla OPD"), ("f2b", "TCOD-F2B"), ("b2f", "TCOD-B2F"))
# tuned: one optimizer step per rollout; official: the official configs' ratio of optimizer steps per
# rollout; unstable: the ratio measured to drift. Each non-tuned regime is compared with tuned.
REGIMES = ("tuned", "official", "unstable")
NAME = dict(METHODS)
# Compared between methods and regimes: success and KL; tests_table adds the cost columns.
OUTCOMES = (("eval_success_end", "eval success, end"), ("traj_kl_end", "trajectory KL, last 3"),
            ("turn_kl_end", "per-turn KL, last 3"))
COSTS = (("trained_tokens", "trained tokens"), ("wall_time_s", "train-loop wall s"))


# ---------------------------------------------------------------- rows


def make_row(records: list[dict], meta: dict) -> dict:
    """One run's raw row: ``meta`` (flags, seed, ...) plus its summary numbers and per-step series."""
    steps = train_steps(records)
    key = eval_key(records)
    row = dict(meta)
    row["summary"] = run_numbers(records, meta.get("student_success"))
    row["series"] = {
        "traj_kl": [r.get(TRAJ_KL) for r in steps],
        "per_turn_kl": [r.get(PER_TURN_KL) for r in steps],
        "trained_tokens": [r.get("rollout/trained_tokens") for r in steps],
        "time_s": [r.get("time/step") for r in steps],
        "train_success": [r.get("multi_turn/success_rate") for r in steps],
        "eval": sorted((r["step"], r[key]) for r in records if key and key in r),
    }
    return row


def _read_text(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


def cmd_row(args) -> int:
    run_dir = Path(args.run_dir)
    records = read_metrics(str(run_dir / "metrics.jsonl"))
    key = eval_key(records)
    if not key or key not in max(records, key=lambda r: r["step"]):
        print(f"tcod_regimes_report: {run_dir} did not finish (no final eval)", file=sys.stderr)
        return 1
    load = (_read_text(run_dir / "loadavg.txt") or "").splitlines()
    meta = {
        "setting": args.setting, "regime": args.regime, "method": args.method, "seed": args.seed,
        "flags": {"episodes_per_rollout": args.episodes, "global_batch": args.global_batch, "lr": args.lr,
                  "opd_loss": args.opd_loss, "steps": args.steps},
        "teacher": args.teacher, "student": args.student,
        "teacher_success": args.teacher_success, "student_success": args.student_success,
        "loadavg_before": load[0].removeprefix("before ") if load else None,
        "loadavg_after": load[1].removeprefix("after ") if len(load) > 1 else None,
        "process_wall_s": float(_read_text(run_dir / "process_wall_s.txt") or "nan"),
        "run_dir": str(run_dir),
    }
    row = make_row(records, meta)
    results = Path(args.results)
    results.parent.mkdir(parents=True, exist_ok=True)
    # Rerunning a (regime, method, seed) replaces its row.
    kept = [line for line in (results.read_text().splitlines() if results.exists() else [])
            if line.strip() and not _same_run(json.loads(line), row)]
    results.write_text("".join(line + "\n" for line in kept) + json.dumps(row) + "\n")
    s = row["summary"]
    print(f"recorded {args.setting}/{args.regime}/{args.method}/seed{args.seed}: eval {s['eval_success_end']:.3f}, "
          f"trajectory KL {s['traj_kl_start']:.2f} -> {s['traj_kl_end']:.2f}")
    return 0


def _same_run(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in ("setting", "regime", "method", "seed"))


def turn_kl_end(row: dict, last: int = 3) -> float | None:
    """Mean per-turn KL (each turn index weighted once) over the last ``last`` steps. Unlike trajectory KL,
    it does not grow with the number of student turns, so F2B's cut and B2F's prefixed episodes compare."""
    per_step = [[v for v in turns if v is not None] for turns in row["series"]["per_turn_kl"][-last:] if turns]
    values = [statistics.fmean(t) for t in per_step if t]
    return statistics.fmean(values) if values else None


def load_rows(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for row in rows:
        row["summary"]["turn_kl_end"] = turn_kl_end(row)
    return rows


def cells(rows: list[dict]) -> dict[tuple[str, str], dict[int, dict]]:
    """(regime, method) -> seed -> row."""
    out: dict[tuple[str, str], dict[int, dict]] = {}
    for row in rows:
        out.setdefault((row["regime"], row["method"]), {})[int(row["seed"])] = row
    return out


# ---------------------------------------------------------------- statistics


def _p(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.3g}"


def _pm(values, digits=2) -> str:
    mean, std, n = mean_std(values)
    return "-" if mean is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def method_vs_opd(by_cell, regime: str, method: str, key: str = "eval_success_end") -> dict | None:
    """Paired (by seed) and Welch tests of ``method`` minus vanilla OPD within one regime."""
    base, other = by_cell.get((regime, "opd"), {}), by_cell.get((regime, method), {})
    seeds = sorted(set(base) & set(other))
    if not seeds:
        return None
    a = [other[s]["summary"][key] for s in seeds]
    b = [base[s]["summary"][key] for s in seeds]
    return {"seeds": seeds, "diff": statistics.fmean(a) - statistics.fmean(b),
            "p_paired": stats.paired(a, b)[1],
            "p_welch": stats.welch(list(other[s]["summary"][key] for s in other),
                                   list(base[s]["summary"][key] for s in base))[1]}


def interaction(by_cell, method: str, key: str = "eval_success_end", regime: str = "unstable") -> dict | None:
    """Regime x method: per seed d = (method - OPD)_regime - (method - OPD)_tuned, one-sample t-test of
    mean(d) = 0 (the paired test of the per-seed gains in the two regimes), over the seeds with all four runs."""
    pair = ("tuned", regime)
    runs = {(r, m): by_cell.get((r, m), {}) for r in pair for m in ("opd", method)}
    seeds = sorted(set.intersection(*(set(v) for v in runs.values())))
    if not seeds:
        return None
    gain = {r: [runs[(r, method)][s]["summary"][key] - runs[(r, "opd")][s]["summary"][key] for s in seeds]
            for r in pair}
    d = [u - t for u, t in zip(gain[regime], gain["tuned"])]
    return {"regime": regime, "seeds": seeds, "gain_tuned": statistics.fmean(gain["tuned"]),
            "gain_regime": statistics.fmean(gain[regime]), "interaction": statistics.fmean(d),
            "per_seed": d, "p_paired": stats.paired(gain[regime], gain["tuned"])[1],
            "p_welch": stats.welch(gain[regime], gain["tuned"])[1]}


# ---------------------------------------------------------------- tables


def cell_table(by_cell) -> str:
    lines = ["| regime | method | seeds | eval success, end (start: student) | trajectory KL first 3 -> last 3 steps | "
             "per-turn KL, last 3 steps | trained tokens total | train-loop wall s | process wall s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for regime in REGIMES:
        for method, name in METHODS:
            runs = by_cell.get((regime, method))
            if not runs:
                continue
            col = lambda k: [r["summary"][k] for r in runs.values()]  # noqa: E731
            lines.append(f"| {regime} | {name} | {len(runs)} ({','.join(map(str, sorted(runs)))}) | "
                         f"{_pm(col('eval_success_end'))} | {_pm(col('traj_kl_start'))} -> {_pm(col('traj_kl_end'))} | "
                         f"{_pm(col('turn_kl_end'))} | "
                         f"{_pm(col('trained_tokens'), 0)} | {_pm(col('wall_time_s'), 0)} | "
                         f"{_pm([r['process_wall_s'] for r in runs.values()], 0)} |")
    return "\n".join(lines)


def tests_table(by_cell) -> str:
    lines = ["| regime | comparison | metric | difference of means | paired t p (seeds) | Welch p |",
             "| --- | --- | --- | --- | --- | --- |"]
    for regime in REGIMES:
        for method, name in METHODS[1:]:
            for key, label in OUTCOMES + COSTS:
                t = method_vs_opd(by_cell, regime, method, key)
                if t:
                    lines.append(f"| {regime} | {name} vs vanilla OPD | {label} | {t['diff']:+.3f} | "
                                 f"{_p(t['p_paired'])} ({len(t['seeds'])}) | {_p(t['p_welch'])} |")
    return "\n".join(lines)


def interaction_table(by_cell) -> str:
    lines = ["| regime | method | metric | gain vs OPD, tuned | gain vs OPD, this regime | interaction (regime - tuned) | "
             "paired t p (seeds) | Welch p |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for regime in REGIMES[1:]:
        for method, name in METHODS[1:]:
            for key, label in OUTCOMES:
                t = interaction(by_cell, method, key, regime)
                if t:
                    lines.append(f"| {regime} | {name} | {label} | {t['gain_tuned']:+.3f} | {t['gain_regime']:+.3f} | "
                                 f"{t['interaction']:+.3f} | {_p(t['p_paired'])} ({len(t['seeds'])}) | "
                                 f"{_p(t['p_welch'])} |")
    return "\n".join(lines)


def baseline_check(by_cell) -> str:
    """Does vanilla OPD learn in each regime: eval start -> end and trajectory KL first 3 -> last 3, per seed."""
    lines = []
    for regime in REGIMES:
        runs = by_cell.get((regime, "opd"))
        if not runs:
            continue
        ev = [r["summary"]["eval_success_end"] - r["summary"]["eval_success_start"] for r in runs.values()]
        kl = [r["summary"]["traj_kl_end"] - r["summary"]["traj_kl_start"] for r in runs.values()]
        lines.append(f"- {regime} vanilla OPD: eval success change {_pm(ev)} (paired t p vs 0: "
                     f"{_p(stats.paired(ev, [0.0] * len(ev))[1])}), trajectory KL change {_pm(kl)} "
                     f"({sum(k < 0 for k in kl)}/{len(kl)} seeds fall)")
    return "\n".join(lines)


def load_table(rows) -> str:
    lines = ["| regime | method | seed | loadavg before (1/5/15 min) | after | process wall s |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in sorted(rows, key=lambda r: (int(r["seed"]), REGIMES.index(r["regime"]), list(NAME).index(r["method"]))):
        lines.append(f"| {row['regime']} | {NAME.get(row['method'], row['method'])} | {row['seed']} | "
                     f"{' '.join((row['loadavg_before'] or '-').split()[:3])} | "
                     f"{' '.join((row['loadavg_after'] or '-').split()[:3])} | {row['process_wall_s']:.0f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- plots


def _band(ax, series_list, color, label, style="-"):
    return band(ax, series_list, color, label, style, floor=0.0, alpha=0.12)


def early_late(runs: dict[int, dict]) -> tuple[list, list]:
    """Per-turn KL by turn index over the first and last third of the steps, pooled over seeds."""
    early, late = [], []
    for row in runs.values():
        series = row["series"]["per_turn_kl"]
        third = max(1, len(series) // 3)
        early += [{PER_TURN_KL: v} for v in series[:third]]
        late += [{PER_TURN_KL: v} for v in series[-third:]]
    return mean_per_turn_kl(early), mean_per_turn_kl(late)


def plot(by_cell, setting: str, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [r for r in REGIMES if any((r, m) in by_cell for m, _ in METHODS)]
    fig, axes = plt.subplots(2, len(present), figsize=(6 * len(present), 8.5), squeeze=False)
    for col, regime in enumerate(present):
        ax_kl, ax_turn = axes[0][col], axes[1][col]
        n, top = 0, 0.0
        for i, (method, name) in enumerate(METHODS):
            runs = by_cell.get((regime, method))
            if not runs:
                continue
            n = max(n, len(runs))
            top = max(top, _band(ax_kl, [r["series"]["traj_kl"] for r in runs.values()], f"C{i}", name) or 0.0)
            early, late = early_late(runs)
            for curve, style, label in ((early, ":", "first third"), (late, "-", "last third")):
                turns = [t for t, v in enumerate(curve) if v is not None]
                ax_turn.plot(turns, [curve[t] for t in turns], style, marker=".", color=f"C{i}",
                             label=f"{name}, {label}")
        ax_kl.set(title=f"{setting}, {regime}: trajectory KL (mean ± std, {n} seeds)",
                  xlabel="rollout step", ylabel="KL (sum over student tokens)", ylim=(0, 1.3 * top or None))
        ax_turn.set(title=f"{regime}: per-turn KL by turn index, first vs last third of steps",
                    xlabel="turn index (0-based)", ylabel="KL")
    save_figure(fig, axes, png)


def cmd_report(args) -> int:
    results_dir = Path(args.results_dir)
    md, summary = [], {}
    for path in sorted(results_dir.glob("*.jsonl")):
        rows = load_rows(path)
        if not rows:
            continue
        setting = path.stem
        by_cell = cells(rows)
        first = rows[0]
        md += [f"## {setting}", "",
               f"teacher eval success {first['teacher_success']}, student (start) {first['student_success']}; "
               f"{first['flags']['steps']} rollout steps; mean ± std over seeds.", "",
               "Does vanilla OPD learn (per seed, eval end - start, trajectory KL last 3 - first 3)?", "",
               baseline_check(by_cell), "", cell_table(by_cell), "",
               "TCOD vs vanilla OPD within each regime:", "", tests_table(by_cell), "",
               "Regime x method interaction, per seed d = (TCOD - OPD)_regime - (TCOD - OPD)_tuned:", "",
               interaction_table(by_cell), "", "Load average per run:", "", load_table(rows), ""]
        png = Path(args.png_dir) / f"tcod_regimes_{setting}.png"
        plot(by_cell, setting, png)
        md += [f"Plot: `{png.relative_to(REPO) if png.is_relative_to(REPO) else png}`", ""]
        summary[setting] = {
            "cells": {f"{r}/{m}": {k: mean_std(row["summary"][k] for row in v.values())[:2]
                                   for k in ("eval_success_end", "traj_kl_start", "traj_kl_end", "trained_tokens",
                                             "turn_kl_end", "wall_time_s")} | {"seeds": sorted(v)}
                      for (r, m), v in by_cell.items()},
            "vs_opd": {f"{r}/{m}": method_vs_opd(by_cell, r, m) for r in REGIMES for m, _ in METHODS[1:]},
            "interaction": {f"{r}/{m}": interaction(by_cell, m, regime=r) for r in REGIMES[1:] for m, _ in METHODS[1:]},
        }
    text = "\n".join(md)
    print(text)
    (results_dir / "tables.md").write_text(text + "\n")
    (results_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("row")
    r.add_argument("--results", required=True)
    r.add_argument("--run-dir", required=True)
    for name in ("setting", "regime", "method", "opd-loss", "teacher", "student"):
        r.add_argument(f"--{name}", required=True)
    for name in ("seed", "episodes", "global-batch", "steps"):
        r.add_argument(f"--{name}", type=int, required=True)
    for name in ("lr", "teacher-success", "student-success"):
        r.add_argument(f"--{name}", type=float, required=True)
    q = sub.add_parser("report")
    q.add_argument("--results-dir", default=str(REPO / "benchmarks/results/tcod_regimes"))
    q.add_argument("--png-dir", default=str(REPO / "docs/en/assets"))
    args = p.parse_args(argv)
    return cmd_row(args) if args.cmd == "row" else cmd_report(args)


if __name__ == "__main__":
    sys.exit(main())
