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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", nargs="+")
    parser.add_argument("--md", default=None)
    args = parser.parse_args(argv)
    text = table([summarise(p) for p in args.metrics])
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
