"""Summarise benchmarks/opd_regimes.sh runs: does the student close on the teacher, and what the PPO
machinery did on the way (issue 13's diagnosis).

    python benchmarks/opd_regimes_report.py OUT/NAME/metrics.jsonl ... [--md table.md]

Per run: full-episode eval success at each evaluation; the exact (whole-vocabulary) and sampled
reverse KL per trained token, averaged over the first and the last quarter of the steps; advantage
size; across the optimizer steps of one rollout, the PPO log-ratio drift (ppo_kl of the last
optimizer step, which the first one always has at 0) and the clipped fraction; the gradient norm.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from slime.utils.metrics import read_metrics


def _quarters(rows, key):
    values = [r[key] for r in rows if key in r]
    if not values:
        return None, None
    q = max(len(values) // 4, 1)
    return statistics.fmean(values[:q]), statistics.fmean(values[-q:])


def summarise(path: str) -> dict:
    rows = read_metrics(path)
    train = [r for r in rows if r.get("step", -1) >= 0 and "loss" in r]
    evals = [(r["step"], r[k]) for r in rows for k in r if k.startswith("eval/") and k.endswith("/success_rate")]
    exact_key = "opd/exact_kl" if any("opd/exact_kl" in r for r in train) else "opd/topk_kl"
    last_drift = [r["per_step"][-1]["ppo_kl"] for r in train if r.get("per_step")]
    clip = [statistics.fmean(s["pg_clipfrac"] for s in r["per_step"]) for r in train if r.get("per_step")]
    return {
        "run": os.path.basename(os.path.dirname(os.path.abspath(path))),
        "optimizer steps / rollout": train[0].get("train/num_steps") if train else None,
        "eval success": " -> ".join(f"{v:.2f}" for _, v in sorted(evals)),
        "exact KL / token (first -> last quarter)": _quarters(train, exact_key),
        "sampled KL / token": _quarters(train, "opd/reverse_kl"),
        "train success": _quarters(train, "multi_turn/success_rate"),
        "|advantage| mean": statistics.fmean(r["advantages/abs_mean"] for r in train) if train else None,
        "ppo_kl at last opt step": statistics.fmean(last_drift) if last_drift else None,
        "clip fraction": statistics.fmean(clip) if clip else None,
        "grad norm": statistics.fmean(r["grad_norm"] for r in train) if train else None,
        "s/step": statistics.fmean(r["time/step"] for r in train) if train else None,
    }


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, tuple):
        return " -> ".join(_cell(v) for v in value)
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def table(summaries: list[dict]) -> str:
    keys = list(summaries[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_cell(s[k]) for k in keys) + " |" for s in summaries]
    return "\n".join(lines)


def final_eval(path: str) -> float | None:
    """The eval success at the run's last step; None while the run is unfinished."""
    rows = read_metrics(path)
    last = max((r["step"] for r in rows), default=None)
    evals = [v for r in rows if r["step"] == last for k, v in r.items()
             if k.startswith("eval/") and k.endswith("/success_rate")]
    return evals[0] if evals else None


def compare(paths: list[str]) -> str:
    """Runs of the same name over seeds (``.../seedN/NAME/metrics.jsonl``): mean +- std of the final
    eval success and of the last-quarter exact KL, and a paired t-test (by seed) between two names."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import stats

    by_name: dict[str, dict[str, dict]] = {}
    for path in paths:
        run_dir = os.path.dirname(os.path.abspath(path))
        seed = os.path.basename(os.path.dirname(run_dir))
        if final_eval(path) is None:
            continue  # unfinished
        by_name.setdefault(os.path.basename(run_dir), {})[seed] = {
            "eval": final_eval(path), "kl": summarise(path)["exact KL / token (first -> last quarter)"][1]}
    lines = ["| run | seeds | final eval success, per seed | mean +- std | exact KL / token, last quarter |",
             "|---|---|---|---|---|"]
    for name, seeds in by_name.items():
        evals = [seeds[sd]["eval"] for sd in sorted(seeds)]
        kls = [seeds[sd]["kl"] for sd in sorted(seeds)]
        sd_eval = statistics.stdev(evals) if len(evals) > 1 else 0.0
        sd_kl = statistics.stdev(kls) if len(kls) > 1 else 0.0
        lines.append(f"| {name} | {len(seeds)} | {', '.join(f'{v:.2f}' for v in evals)} | "
                     f"{statistics.fmean(evals):.3f} +- {sd_eval:.3f} | {statistics.fmean(kls):.3f} +- {sd_kl:.3f} |")
    if len(by_name) == 2:
        (a_name, a), (b_name, b) = by_name.items()
        common = sorted(set(a) & set(b))
        for key, label in (("eval", "final eval success"), ("kl", "exact KL")):
            t, p = stats.paired([a[sd][key] for sd in common], [b[sd][key] for sd in common])
            lines.append(f"\n{a_name} - {b_name}, {label}: paired t = {t:.2f}, p = {p:.3g} ({len(common)} seeds)")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", nargs="+")
    parser.add_argument("--md", default=None)
    parser.add_argument("--by-seed", action="store_true",
                        help="metrics under .../seedN/NAME/: aggregate each NAME over seeds and test two names")
    args = parser.parse_args(argv)
    text = compare(args.metrics) if args.by_seed else table([summarise(p) for p in args.metrics])
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
