"""Rows, the learning-rate pick and the report of the faithful TCOD grid (benchmarks/tcod_faithful.sh).

    python benchmarks/tcod_faithful_report.py row --results R.jsonl --run-dir DIR --setting S --method opd ...
    python benchmarks/tcod_faithful_report.py pick-lr --root OUT_ROOT --lrs 3e-4 1e-3 3e-3
    python benchmarks/tcod_faithful_report.py report [--results-dir benchmarks/results/tcod_premise]

``row`` turns one run (metrics.jsonl, its final checkpoint's eval at temperature 0.4, wall time, load) into a
self-contained jsonl row with its per-step series. ``report`` writes ``REPORT.md`` beside the rows: the
premise gate's verdict, eval success at both temperatures with paired tests against vanilla OPD, the cost
at equal updates x turns, and the per-turn KL by turn index early and late in training (the paper's Fig. 2
in miniature), plotted to docs/en/assets/tcod_faithful_SETTING.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import stats  # noqa: E402
from tcod_regimes_report import _read_text, make_row  # noqa: E402

from slime.utils.metrics import read_metrics  # noqa: E402

METHODS = (("opd", "vanilla OPD"), ("f2b", "TCOD-F2B"), ("b2f", "TCOD-B2F"))
WINDOW = 3  # steps averaged at the start and the end of training


def cmd_row(args) -> int:
    run_dir = Path(args.run_dir)
    records = read_metrics(str(run_dir / "metrics.jsonl"))
    eval_cold = _read_text(run_dir / "eval_T0.4.txt")
    if eval_cold is None:
        print(f"tcod_faithful_report: {run_dir} did not finish (no eval_T0.4.txt)", file=sys.stderr)
        return 1
    load = (_read_text(run_dir / "loadavg.txt") or "").splitlines()
    meta = {
        "setting": args.setting, "method": args.method, "seed": args.seed,
        "flags": {"lr": args.lr, "steps": args.steps, "turns_per_step": args.turns, "eta": args.eta,
                  "k_max": args.k_max, "opd_loss": "sampled"},
        "teacher_success": args.teacher_success, "student_success": args.student_success,
        "eval_success_t04": float(eval_cold),
        "loadavg_before": load[0].removeprefix("before ") if load else None,
        "process_wall_s": float(_read_text(run_dir / "process_wall_s.txt") or "nan"),
        "run_dir": str(run_dir),
    }
    row = make_row(records, meta)
    steps = [r for r in records if r["step"] >= 0 and "rollout/student_turns" in r]
    row["series"]["student_turns"] = [r["rollout/student_turns"] for r in steps]
    row["series"]["episodes"] = [r.get("rollout/episodes") for r in steps]
    row["series"]["turn_kl_slope"] = [statistics.fmean(r["opd/turn_kl_slopes"]) if r.get("opd/turn_kl_slopes")
                                      else None for r in steps]
    results = Path(args.results)
    results.parent.mkdir(parents=True, exist_ok=True)
    same = lambda r: (r["setting"], r["method"], r["seed"]) == (args.setting, args.method, args.seed)  # noqa: E731
    kept = [line for line in (results.read_text().splitlines() if results.exists() else [])
            if line.strip() and not same(json.loads(line))]
    results.write_text("".join(line + "\n" for line in kept) + json.dumps(row) + "\n")
    s = row["summary"]
    print(f"recorded {args.setting}/{args.method}/seed{args.seed}: eval {s['eval_success_end']:.3f} (T 1.0), "
          f"{meta['eval_success_t04']:.3f} (T 0.4), trajectory KL {s['traj_kl_start']:.2f} -> {s['traj_kl_end']:.2f}")
    return 0


def cmd_pick_lr(args) -> int:
    """Print the lr at which vanilla OPD (seed 0) ended best among those at which it learned: its trajectory
    KL fell and its eval success rose above the student's."""
    from tcod_vs_opd_report import run_numbers

    learned = {}
    for lr in args.lrs:
        records = read_metrics(str(Path(args.root) / f"lr{lr}" / "seed0" / "opd" / "metrics.jsonl"))
        s = run_numbers(records, None)
        print(f"lr {lr}: eval {s['eval_success_end']:.3f}, trajectory KL {s['traj_kl_start']:.2f} -> "
              f"{s['traj_kl_end']:.2f}", file=sys.stderr)
        if s["traj_kl_end"] < s["traj_kl_start"] and s["eval_success_end"] > args.student_success:
            learned[lr] = s["eval_success_end"]
    if not learned:
        print(f"tcod_faithful_report: at no lr did vanilla OPD both lower its trajectory KL and rise above the "
              f"student's eval success ({args.student_success:.3f}): a baseline that does not learn measures "
              "nothing", file=sys.stderr)
        return 1
    print(max(learned, key=lambda lr: (learned[lr], -float(lr))))
    return 0


def _pm(values, digits=2) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.{digits}f} ± {sd:.{digits}f}"


def _window(series, first: bool):
    values = [v for v in (series[:WINDOW] if first else series[-WINDOW:]) if v is not None]
    return statistics.fmean(values) if values else None


def per_turn_kl_profile(rows, first: bool) -> list[float | None]:
    """Per-turn KL by episode turn index, averaged over the first (or last) steps and the seeds."""
    per_index: dict[int, list[float]] = {}
    for row in rows:
        window = row["series"]["per_turn_kl"][:WINDOW] if first else row["series"]["per_turn_kl"][-WINDOW:]
        for turns in window:
            for i, value in enumerate(turns or []):
                if value is not None:
                    per_index.setdefault(i, []).append(value)
    return [statistics.fmean(per_index[i]) if i in per_index else None for i in range(max(per_index, default=-1) + 1)]


def setting_report(setting: str, rows: list[dict], gate: dict | None, results_dir: Path) -> str:
    lines = [f"## {setting}", ""]
    if gate is not None:
        lines += [f"Premise gate: {gate['verdict']}", ""]
        if not gate["passed"]:
            return "\n".join(lines + ["The gate failed: no method is compared on this setting.", ""])
    if not rows:
        lr_note = results_dir / f"{setting}_lr.txt"
        return "\n".join(lines + ["No grid rows: the learning-rate phase found no rate at which vanilla OPD learned:"
                                   if lr_note.exists() else "No grid rows yet.", ""]
                          + ([f"    {line}" for line in lr_note.read_text().splitlines()] if lr_note.exists() else [])
                          + [""])
    by_method = {m: {r["seed"]: r for r in rows if r["method"] == m} for m, _ in METHODS}
    lines += ["| method | seeds | eval T 1.0, end | eval T 0.4, end | trajectory KL first 3 -> last 3 | "
              "turn-KL slope first 3 -> last 3 | trained tokens | student turns / step | wall s / run |",
              "| --- " * 9 + "|"]
    for method, name in METHODS:
        runs = list(by_method[method].values())
        if not runs:
            continue
        lines.append(
            f"| {name} | {len(runs)} | {_pm([r['summary']['eval_success_end'] for r in runs])} | "
            f"{_pm([r['eval_success_t04'] for r in runs])} | {_pm([r['summary']['traj_kl_start'] for r in runs])} -> "
            f"{_pm([r['summary']['traj_kl_end'] for r in runs])} | "
            f"{_pm([_window(r['series']['turn_kl_slope'], True) for r in runs], 3)} -> "
            f"{_pm([_window(r['series']['turn_kl_slope'], False) for r in runs], 3)} | "
            f"{_pm([r['summary']['trained_tokens'] for r in runs], 0)} | "
            f"{_pm([statistics.fmean(r['series']['student_turns']) for r in runs], 1)} | "
            f"{_pm([r['process_wall_s'] for r in runs], 0)} |"
        )
    lines += ["", "Paired against vanilla OPD (same seeds): mean difference and two-sided p.", "",
              "| method | eval T 1.0 | eval T 0.4 | trained tokens | wall s |", "| --- | --- | --- | --- | --- |"]
    base = by_method["opd"]
    for method, name in METHODS[1:]:
        seeds = sorted(set(base) & set(by_method[method]))
        if len(seeds) < 2:
            continue
        cells = []
        for get, digits in ((lambda r: r["summary"]["eval_success_end"], 3), (lambda r: r["eval_success_t04"], 3),
                            (lambda r: r["summary"]["trained_tokens"], 0), (lambda r: r["process_wall_s"], 0)):
            a, b = [get(by_method[method][s]) for s in seeds], [get(base[s]) for s in seeds]
            _, p = stats.paired(a, b)
            cells.append(f"{statistics.fmean(x - y for x, y in zip(a, b)):+.{digits}f} (p {p:.2g})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Per-turn KL by turn index (first 3 steps -> last 3 steps, mean over seeds):", ""]
    for method, name in METHODS:
        runs = list(by_method[method].values())
        if runs:
            early, late = per_turn_kl_profile(runs, True), per_turn_kl_profile(runs, False)
            fmt = lambda xs: ", ".join("-" if x is None else f"{x:.2f}" for x in xs)  # noqa: E731
            lines.append(f"- {name}: [{fmt(early)}] -> [{fmt(late)}]")
    return "\n".join(lines + [""])


def plot(setting: str, rows: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, first, title in ((axes[0], True, "first 3 steps"), (axes[1], False, "last 3 steps")):
        for method, name in METHODS:
            runs = [r for r in rows if r["method"] == method]
            profile = per_turn_kl_profile(runs, first) if runs else []
            points = [(i, v) for i, v in enumerate(profile) if v is not None]
            if points:
                ax.plot(*zip(*points), marker="o", label=name)
        ax.set_title(f"{setting}: per-turn KL, {title}")
        ax.set_xlabel("turn index")
    axes[0].set_ylabel("sum of log p_student - log p_teacher over the turn")
    axes[0].legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def cmd_report(args) -> int:
    results_dir = Path(args.results_dir)
    parts = ["# TCOD on its own premise: the faithful grid", ""]
    for path in sorted(p for p in results_dir.glob("*.jsonl")):
        setting = path.stem
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        gate_path = results_dir / f"{setting}_gate.json"
        gate = json.loads(gate_path.read_text()) if gate_path.exists() else None
        parts.append(setting_report(setting, rows, gate, results_dir))
        if rows and (gate is None or gate["passed"]):
            plot(setting, rows, Path(args.png_dir) / f"tcod_faithful_{setting}.png")
    for gate_path in sorted(results_dir.glob("*_gate.json")):  # settings stopped at the gate have no rows
        setting = gate_path.name.removesuffix("_gate.json")
        if not (results_dir / f"{setting}.jsonl").exists():
            parts.append(setting_report(setting, [], json.loads(gate_path.read_text()), results_dir))
    (results_dir / "REPORT.md").write_text("\n".join(parts))
    print(f"wrote {results_dir / 'REPORT.md'}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("row")
    for name in ("results", "run-dir", "setting", "method"):
        r.add_argument(f"--{name}", required=True)
    for name in ("seed", "steps", "turns", "eta", "k-max"):
        r.add_argument(f"--{name}", type=int, required=True)
    for name in ("lr", "teacher-success", "student-success"):
        r.add_argument(f"--{name}", type=float, required=True)
    q = sub.add_parser("pick-lr")
    q.add_argument("--root", required=True)
    q.add_argument("--lrs", nargs="+", required=True)
    q.add_argument("--student-success", type=float, required=True, help="the student's eval success before OPD")
    t = sub.add_parser("report")
    t.add_argument("--results-dir", default=str(REPO / "benchmarks/results/tcod_premise"))
    t.add_argument("--png-dir", default=str(REPO / "docs/en/assets"))
    args = p.parse_args(argv)
    return {"row": cmd_row, "pick-lr": cmd_pick_lr, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
