"""Tables, measurements and plot of benchmarks/adaptive_kl_ppo.py, rebuilt from its runs.jsonl alone.

    python benchmarks/adaptive_kl_ppo_report.py [--results benchmarks/results/adaptive_kl_ppo] \\
        [--plot docs/en/assets/adaptive_kl_ppo.png]

Writes ``tables.md`` and ``summary.json`` beside runs.jsonl. The score of a run against a target is the mean of
``|KL/target - 1|`` over the second half of its steps (``GOAL``: at most 0.3). Besides the tables it measures what
decides whether the controller's rule can meet that goal on this task:

* noise: the step-to-step noise of the observed KL at a fixed ``beta``, ``sqrt(mean(dKL^2) / 2) / mean(KL)`` over
  the second half (white noise; a slow drift adds little to it), and the score a perfectly held mean would get
  with that noise alone, ``sqrt(2/pi)`` times it;
* gain: how steeply the held KL falls as ``beta`` rises, ``s = -d ln KL / d ln beta`` between swept values;
* lag: steps until a fixed run's KL first reaches 63% of its second-half level (its step response from the
  reference), and the lag at which ``ln beta`` and the later ``ln KL`` of an adaptive run anti-correlate most;
* horizon against run length: steps the rule needs to move ``beta`` by the start factor at its fastest
  (``1 + 0.2 n / H`` a step), and the step at which the fixed run from the low start has collapsed (reward 0.95:
  all-vowel answers) -- the time the controller has before the policy runs away.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

GOAL = 0.3
ERROR_CLIP = 0.2  # the rule's clip of KL/target - 1 (slime/utils/kl_controller.py)
COLLAPSE_REWARD = 0.95


def plateau(row: dict) -> float:
    """Median KL over steps steps/10 .. steps/3: the level a fixed ``beta`` holds before any runaway."""
    kl = row["kl"][len(row["kl"]) // 10: max(len(row["kl"]) // 3, len(row["kl"]) // 10 + 1)]
    return sorted(kl)[len(kl) // 2]


def reference_beta(rows: list[dict], target: float) -> float:
    """The swept fixed ``beta`` whose plateau KL (geometric mean over seeds) is nearest ``target`` in log."""
    by_coef: dict[float, list[float]] = {}
    for row in rows:
        by_coef.setdefault(row["coef"], []).append(math.log(max(plateau(row), 1e-6)))
    return min(by_coef, key=lambda c: abs(sum(by_coef[c]) / len(by_coef[c]) - math.log(target)))


def _mean(xs):
    return sum(xs) / len(xs)


def half(xs):
    return xs[len(xs) // 2:]


def deviation(row: dict, target: float) -> float:
    return _mean([abs(k / target - 1.0) for k in half(row["kl"])])


def plateau_window(row: dict) -> list[float]:
    n = len(row["kl"])
    return row["kl"][n // 10: max(n // 3, n // 10 + 2)]


def noise(row: dict) -> float:
    """Relative step-to-step noise of the observed KL on its plateau (before any runaway)."""
    kl = plateau_window(row)
    diffs = [b - a for a, b in zip(kl, kl[1:])]
    return math.sqrt(_mean([d * d for d in diffs]) / 2.0) / _mean(kl)


def rise_step(row: dict) -> int | None:
    """First step at which the KL reaches 63% of its plateau (None: never)."""
    level = 0.63 * plateau(row)
    return next((i for i, k in enumerate(row["kl"]) if k >= level), None)


def collapse_step(row: dict) -> int | None:
    return next((i for i, r in enumerate(row["reward"]) if r >= COLLAPSE_REWARD), None)


def comeback(row: dict) -> tuple[int | None, float | None]:
    """After a runaway, the first step whose reward is back below 0.5, and the ``beta`` used then."""
    start = collapse_step(row)
    if start is None:
        return None, None
    back = next((i for i in range(start, len(row["reward"])) if row["reward"][i] < 0.5), None)
    return back, (None if back is None else row["beta"][back])


def xcorr_lag(row: dict, max_lag: int = 25) -> tuple[int, float]:
    """The lag k (steps) where corr(ln beta[t], ln KL[t + k]) is most negative, over the steps after the first
    tenth of the run (step 0 has KL 0), and that correlation."""
    start = max(2, len(row["kl"]) // 10)
    lb = [math.log(b) for b in row["beta"][start:]]
    lk = [math.log(max(k, 1e-4)) for k in row["kl"][start:]]
    best = (0, 0.0)
    for k in range(0, min(max_lag, len(lb) - 3) + 1):
        x, y = lb[:len(lb) - k], lk[k:]
        mx, my = _mean(x), _mean(y)
        sx = math.sqrt(sum((v - mx) ** 2 for v in x))
        sy = math.sqrt(sum((v - my) ** 2 for v in y))
        if sx == 0 or sy == 0:
            continue
        c = sum((a - mx) * (b - my) for a, b in zip(x, y)) / (sx * sy)
        if c < best[1]:
            best = (k, c)
    return best


def climb_steps(factor: float, batch: int, horizon: float) -> int:
    return math.ceil(math.log(factor) / math.log1p(ERROR_CLIP * batch / horizon))


def _fmt(x, spec=".2f"):
    return "never" if x is None else format(x, spec)


def analyse(rows: list[dict], invocation: dict) -> dict:
    sweep = [r for r in rows if r["phase"] == "sweep"]
    fixed = [r for r in rows if r["ctrl"] == "fixed"]
    adaptive = [r for r in rows if r["ctrl"] == "adaptive"]
    targets = sorted({r["target"] for r in adaptive}) or [float(t) for t in invocation["targets"]]
    seeds = sorted({r["seed"] for r in rows})
    ref = adaptive[0] if adaptive else rows[0]  # fixed rows may be reused from a run with another horizon
    batch, horizon, steps = ref["prompts"] * ref["samples"], ref["horizon"], ref["steps"]
    factor = invocation.get("start_factor", 10.0)

    def by_coef(pool):
        out = {}
        for r in pool:
            out.setdefault(r["coef"], []).append(r)
        return dict(sorted(out.items()))

    fixed_by_coef, sweep_by_coef = by_coef(fixed), by_coef(sweep)
    summary = {"batch": batch, "horizon": horizon, "steps": steps, "seeds": seeds, "goal": GOAL, "targets": {},
               "fixed": {}}
    for coef, runs in fixed_by_coef.items():
        summary["fixed"][f"{coef:g}"] = {
            "kl": _mean([_mean(half(r["kl"])) for r in runs]),
            "reward": _mean([_mean(half(r["reward"])) for r in runs]),
            "noise": _mean([noise(r) for r in runs]),
            "plateau": _mean([plateau(r) for r in runs]),
            "runaway_step": [collapse_step(r) for r in runs],
            "dev": {f"{t:g}": [deviation(r, t) for r in runs] for t in targets},
            "in_sweep": coef in sweep_by_coef,
        }
    # No single fixed beta within GOAL of every target on every seed?
    both = [c for c, v in summary["fixed"].items() if all(max(d) <= GOAL for d in v["dev"].values())]
    summary["fixed_within_goal_of_all_targets"] = both
    # Gain s between neighbouring swept betas, from their plateaus (before any runaway).
    gains = []
    coefs = list(sweep_by_coef)
    for lo, hi in zip(coefs, coefs[1:]):
        k_lo, k_hi = summary["fixed"][f"{lo:g}"]["plateau"], summary["fixed"][f"{hi:g}"]["plateau"]
        gains.append({"between": [lo, hi], "s": -math.log(k_hi / k_lo) / math.log(hi / lo)})
    summary["gain"] = gains
    summary["collapsed_fixed"] = [f"{c:g}" for c, runs in fixed_by_coef.items()
                                  if any(collapse_step(r) is not None for r in runs)]

    for t in targets:
        mine = [r for r in adaptive if r["target"] == t]
        starts = sorted({r["coef"] for r in mine})
        best = min(sweep_by_coef, key=lambda c: _mean([deviation(r, t) for r in sweep_by_coef[c]]))
        entry = {"best_fixed": best, "reference_beta": reference_beta(sweep, t), "starts": starts, "runs": {}}
        for label, pool in ([(f"adaptive from {c:g}", [r for r in mine if r["coef"] == c]) for c in starts]
                            + [(f"fixed {c:g}", fixed_by_coef.get(c, [])) for c in starts]
                            + [(f"fixed {best:g} (best of sweep)", sweep_by_coef[best])]):
            pool = sorted(pool, key=lambda r: r["seed"])
            if not pool:
                continue
            devs = [deviation(r, t) for r in pool]
            entry["runs"][label] = {
                "dev": devs, "dev_mean": _mean(devs), "dev_max": max(devs),
                "kl": [_mean(half(r["kl"])) for r in pool], "reward": [_mean(half(r["reward"])) for r in pool],
                "beta_end": [r["beta"][-1] for r in pool],
                "collapse_step": [collapse_step(r) for r in pool],
            }
        ref_runs = sorted(sweep_by_coef[entry["reference_beta"]], key=lambda r: r["seed"])
        entry["noise"] = {"relative": [noise(r) for r in ref_runs]}  # at the reference beta, on its plateau
        entry["noise"]["floor"] = [math.sqrt(2 / math.pi) * n for n in entry["noise"]["relative"]]
        entry["lag"] = {"rise_step_reference": [rise_step(r) for r in ref_runs],
                        "xcorr_adaptive": [list(xcorr_lag(r)) for r in sorted(mine, key=lambda r: (r["coef"],
                                                                                                   r["seed"]))]}
        entry["adaptive_path"] = {
            f"{r['coef']:g} seed {r['seed']}": {
                "first_step_at_target": next((i for i, k in enumerate(r["kl"]) if k >= t), None),
                "runaway_step": collapse_step(r), "comeback_step": comeback(r)[0], "comeback_beta": comeback(r)[1],
                "second_half_kl_over_target": [min(half(r["kl"])) / t, max(half(r["kl"])) / t]}
            for r in sorted(mine, key=lambda r: (r["coef"], r["seed"]))}
        low = fixed_by_coef.get(starts[0], []) if starts else []
        entry["collapse_step_fixed_low_start"] = [collapse_step(r) for r in low]
        adaptive_devs = [d for label, v in entry["runs"].items() if label.startswith("adaptive") for d in v["dev"]]
        entry["goal_met"] = bool(adaptive_devs) and all(d <= GOAL for d in adaptive_devs)
        summary["targets"][f"{t:g}"] = entry
    summary["climb_steps"] = climb_steps(factor, batch, horizon)
    summary["max_rate_per_step"] = ERROR_CLIP * batch / horizon
    summary["goal_met"] = all(e["goal_met"] for e in summary["targets"].values()) and not both
    summary["wall_s"] = invocation.get("wall_s")
    summary["run_wall_s"] = sum(r["wall_s"] for r in rows if not r.get("reused"))
    return summary


def tables(summary: dict, invocation: dict) -> str:
    n, h, steps, seeds = summary["batch"], summary["horizon"], summary["steps"], summary["seeds"]
    lines = [f"{steps} steps, {n} samples a step, horizon {h:g} (beta moves at most "
             f"{100 * summary['max_rate_per_step']:.1f}% a step), seeds {seeds}; scores, KL and reward over steps "
             f"{steps // 2}-{steps - 1}; per-seed values in seed order.", ""]
    for t, e in summary["targets"].items():
        lines += [f"Target {t} (reference beta, whose plateau is nearest the target: {e['reference_beta']:g}; "
                  f"best fixed beta of the sweep by score: {e['best_fixed']:g}):", "",
                  "| run | mean abs(KL/target - 1) (per seed) | within 0.3 on every seed | KL | reward | final beta |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for label, v in e["runs"].items():
            per = " / ".join(f"{d:.2f}" for d in v["dev"])
            lines.append(f"| {label} | {v['dev_mean']:.2f} ({per}) | {'yes' if v['dev_max'] <= GOAL else 'no'} | "
                         + " / ".join(f"{k:.3f}" for k in v["kl"]) + " | "
                         + " / ".join(f"{r:.2f}" for r in v["reward"]) + " | "
                         + " / ".join(f"{b:.3g}" for b in v["beta_end"]) + " |")
        lines.append("")
    ts = list(summary["targets"])
    lines += ["Every fixed beta against both targets (mean over seeds; worst seed in brackets):", "",
              "| fixed beta | plateau KL | runaway at step (per seed) | second-half KL | reward | noise of the KL | "
              + " | ".join(f"score vs {t}" for t in ts) + " |",
              "| --- | --- | --- | --- | --- | --- | " + " | ".join("---" for _ in ts) + " |"]
    for c, v in summary["fixed"].items():
        runaway = " / ".join(_fmt(x, "d") for x in v["runaway_step"])
        lines.append(f"| {c}{'' if v['in_sweep'] else ' (start)'} | {v['plateau']:.3f} | {runaway} | "
                     f"{v['kl']:.3f} | {v['reward']:.2f} | {v['noise']:.2f} | " + " | ".join(f"{_mean(v['dev'][t]):.2f} ({max(v['dev'][t]):.2f})"
                                                       for t in ts) + " |")
    lines += ["", f"Fixed betas within {GOAL} of every target on every seed: "
              f"{', '.join(summary['fixed_within_goal_of_all_targets']) or 'none'}.", ""]
    lines += ["Measurements:", ""]
    for t, e in summary["targets"].items():
        nz = e["noise"]
        lines.append(f"- target {t}: noise of the observed KL at the reference beta (plateau) "
                     + " / ".join(f"{x:.2f}" for x in nz["relative"]) + " (score of a perfectly held mean: "
                     + " / ".join(f"{x:.2f}" for x in nz["floor"]) + "); step response to 63%: step "
                     + " / ".join(_fmt(x, "d") for x in e["lag"]["rise_step_reference"])
                     + "; lag of ln KL behind ln beta in the adaptive runs (steps, corr): "
                     + ", ".join(f"{k} ({c:.2f})" for k, c in e["lag"]["xcorr_adaptive"])
                     + f"; fixed low start {e['starts'][0] if e['starts'] else float('nan'):g} ran away at step "
                     + " / ".join(_fmt(x, "d") for x in e["collapse_step_fixed_low_start"]) + ".")
    for t, e in summary["targets"].items():
        for name, v in e["adaptive_path"].items():
            lines.append(f"- target {t}, adaptive from {name}: KL first at the target at step "
                         f"{_fmt(v['first_step_at_target'], 'd')}; ran away at step {_fmt(v['runaway_step'], 'd')}, "
                         f"back (reward < 0.5) at step {_fmt(v['comeback_step'], 'd')} with beta "
                         f"{_fmt(v['comeback_beta'], '.3g')}; second-half KL/target "
                         f"{v['second_half_kl_over_target'][0]:.2f} to {v['second_half_kl_over_target'][1]:.2f}.")
    lines.append("- gain s = -d ln KL / d ln beta between plateaus: " + ", ".join(
        f"{g['between'][0]:g}-{g['between'][1]:g}: {g['s']:.1f}" for g in summary["gain"])
        + f"; fixed betas with a run that ran away: {', '.join(summary['collapsed_fixed']) or 'none'}.")
    lines.append(f"- horizon vs run: beta needs {summary['climb_steps']} steps at the rule's fastest to move "
                 f"{invocation.get('start_factor', 10.0):g}x.")
    lines += ["", f"Goal met: {'yes' if summary['goal_met'] else 'no'}. Whole benchmark: "
              f"{_fmt(summary['wall_s'], '.0f')} s wall ({summary['run_wall_s']:.0f} s of train.py runs)."]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ts = list(summary["targets"])
    fig, axes = plt.subplots(2, len(ts), figsize=(6 * len(ts), 7), sharex=True, squeeze=False)
    for col, t in enumerate(ts):
        e, target = summary["targets"][t], float(t)
        kl_ax, beta_ax = axes[0][col], axes[1][col]
        styles = [(f"adaptive from {c:g}", "adaptive", c, color) for c, color in zip(e["starts"], ("C0", "C3"))]
        styles.append((f"fixed {e['best_fixed']:g} (best fixed)", "fixed", e["best_fixed"], "0.4"))
        for label, ctrl, coef, color in styles:
            runs = [r for r in rows if r["ctrl"] == ctrl and r["coef"] == coef
                    and (ctrl == "fixed" or r["target"] == target)]
            for i, r in enumerate(sorted(runs, key=lambda r: r["seed"])):
                kw = {"color": color, "lw": 0.9, "alpha": 0.8, "label": label if i == 0 else None,
                      "ls": "--" if ctrl == "fixed" else "-"}
                kl_ax.plot([max(k, 1e-3) for k in r["kl"]], **kw)
                beta_ax.plot(r["beta"], **kw)
        kl_ax.axhline(target, color="k", lw=1.2)
        kl_ax.axhspan(target * (1 - GOAL), target * (1 + GOAL), color="k", alpha=0.08)
        kl_ax.axvline(summary["steps"] // 2, color="k", lw=0.6, ls=":")
        beta_ax.axhline(e["best_fixed"], color="0.4", lw=0.8, ls=":")
        kl_ax.set_yscale("log")
        beta_ax.set_yscale("log")
        kl_ax.set_title(f"target KL {t} (band: +-{int(GOAL * 100)}%)")
        kl_ax.set_ylabel("observed KL (per-token, sample mean)")
        beta_ax.set_ylabel("beta used")
        beta_ax.set_xlabel("step")
        kl_ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"tiny PPO on CPU: {summary['batch']} samples a step, horizon {summary['horizon']:g}, "
                 f"{len(summary['seeds'])} seeds", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default="benchmarks/results/adaptive_kl_ppo")
    p.add_argument("--plot", default="docs/en/assets/adaptive_kl_ppo.png")
    a = p.parse_args(argv)
    results = Path(a.results)
    runs_file = results / "runs.jsonl"
    if not runs_file.exists():
        print(f"adaptive_kl_ppo_report: no {runs_file}; run benchmarks/adaptive_kl_ppo.py first", file=sys.stderr)
        return 1
    rows = [json.loads(line) for line in runs_file.read_text().splitlines() if line.strip()]
    inv_file = results / "invocation.json"
    invocation = json.loads(inv_file.read_text()) if inv_file.exists() else {}
    summary = analyse(rows, invocation)
    text = tables(summary, invocation)
    (results / "tables.md").write_text(text)
    (results / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(rows, summary, Path(a.plot))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
