"""Does ``--kl-ctrl adaptive`` hold the KL at its target? Fixed vs adaptive reward-side KL, tiny PPO on CPU.

This runtime's PPO (``train.py``: policy, critic and a frozen reference of the same start) with the controller
file the slime PR ships (slime/utils/kl_controller.py). The reward is the share of vowels in the answer, which
pulls the policy away from the reference; the only brake is the reward-side KL, ``r_t - beta * KL_t``. The KL
is the controller's input: each sample's per-token mean, averaged over samples (``kl/observed_sample_mean``).

Two phases, one run of this script:

1. sweep: fixed ``beta`` over ``--sweep`` x ``--seeds``. A fixed ``beta`` first holds the KL at a plateau, and
   below about 0.1 the policy later runs away to all-vowel answers (KL about 3.7). For each target, the
   reference ``beta`` is the swept one whose plateau (median KL over steps steps/10..steps/3) is nearest the
   target; the best fixed ``beta`` (the report) is the one with the smallest second-half score.
2. starts: for each target, ``beta`` 10x below and 10x above the reference, each run fixed and adaptive
   (``--kl-target``, ``--kl-horizon``) on every seed.

The score of a run against a target: ``mean |KL/target - 1|`` over the second half of its steps.

    python benchmarks/adaptive_kl_ppo.py --out outputs/adaptive_kl_bench

Every run appends one row (flags, seed, load, wall time, per-step KL / coefficient / reward) to
``{results}/runs.jsonl``; benchmarks/adaptive_kl_ppo_report.py then writes the tables, the measurements and the
plot (docs/en/advanced/adaptive-kl.md shows them). ``--workers 2`` runs two train.py processes at a time.
The helpers (reward, data, argv) are shared with tests/test_adaptive_kl_integration.py.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

TARGET_CHARS = "aeiou"
PROMPTS = ["Write:", "Say it:", "Go:", "Answer:", "Type:", "Reply:", "Now:", "Next:"]
KL_KEY = "kl/observed_sample_mean"  # each sample's per-token mean, averaged over samples: the controller's input
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import adaptive_kl_ppo_report  # noqa: E402  (this module imports the report, never the other way)
from adaptive_kl_ppo_report import plateau, reference_beta  # noqa: E402,F401  (the start rule lives there)


async def share_of_vowels(args, sample, **kwargs) -> float:
    """Dense reward in [0, 1]: the fraction of the response text (end token stripped) that is a vowel."""
    text = sample.response.replace("<|im_end|>", "")
    reward = sum(ch in TARGET_CHARS for ch in text) / max(1, len(text))
    sample.metadata["task_reward"] = reward  # what `rollout/reward` reports
    return reward


def write_task(root: Path) -> tuple[Path, Path]:
    """A tiny policy checkpoint (also the reference and the critic's start) and a prompt file."""
    from slime.utils.tiny_models import save_tiny_checkpoint

    root.mkdir(parents=True, exist_ok=True)
    model = save_tiny_checkpoint(root / "tiny_model", hidden_size=32, num_layers=1, num_heads=2, seed=0)
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": [{"role": "user", "content": p}]}) + "\n" for p in PROMPTS))
    return model, data


def train_argv(model: Path, data: Path, out: Path, *, ctrl: str, num_rollout: int, kl_coef: float,
               kl_target: float, horizon: float, estimator: str = "ppo", lr: float = 2e-2, seed: int = 7,
               prompts: int = 8, samples_per_prompt: int = 2, response_len: int = 8) -> list[str]:
    """train.py flags of one run: ``prompts`` x ``samples_per_prompt`` samples of ``response_len`` new tokens,
    one optimizer step per batch."""
    batch = prompts * samples_per_prompt
    argv = [
        "--hf-checkpoint", str(model), "--prompt-data", str(data), "--apply-chat-template",
        "--custom-rm-path", "benchmarks.adaptive_kl_ppo.share_of_vowels",
        "--advantage-estimator", estimator, "--num-rollout", str(num_rollout),
        "--rollout-batch-size", str(prompts), "--n-samples-per-prompt", str(samples_per_prompt),
        "--rollout-max-response-len", str(response_len),
        "--global-batch-size", str(batch), "--micro-batch-size", str(batch),
        "--rollout-seed", str(seed), "--seed", str(seed),
        "--lr", str(lr), "--critic-lr", str(lr), "--actor-num-gpus-per-node", "1",
        "--kl-coef", str(kl_coef), "--kl-ctrl", ctrl, "--kl-ctrl-unit", "token",
        "--metrics-dir", str(out),
    ]
    if ctrl == "adaptive":
        argv += ["--kl-target", str(kl_target), "--kl-horizon", str(horizon)]
    return argv


def relative_deviation(kls: list[float], target: float) -> float:
    """Mean of |KL / target - 1| over the given steps."""
    return sum(abs(k / target - 1.0) for k in kls) / len(kls)


def second_half(values: list) -> list:
    return values[len(values) // 2:]


def _loadavg() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return None


def run_one(job: dict) -> dict:
    """One train.py run (in this process); returns its results row with the per-step series."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import train
    from slime.utils.metrics import read_metrics

    out = Path(job["run_dir"])
    (out / "metrics.jsonl").unlink(missing_ok=True)
    argv = train_argv(Path(job["model"]), Path(job["data"]), out, ctrl=job["ctrl"], num_rollout=job["steps"],
                      kl_coef=job["coef"], kl_target=job["target"] or 1.0, horizon=job["horizon"], lr=job["lr"],
                      seed=job["seed"], prompts=job["prompts"], samples_per_prompt=job["samples"],
                      response_len=job["response_len"])
    load_before, t0 = _loadavg(), time.perf_counter()
    rc = train.main(argv)
    wall = time.perf_counter() - t0
    if rc:
        raise RuntimeError(f"train.py exited with {rc} for {job['name']} (logs above); see {out}")
    records = read_metrics(out / "metrics.jsonl")
    row = {k: v for k, v in job.items() if k not in ("model", "data", "run_dir")}
    row.update({
        "wall_s": round(wall, 1), "load_before": load_before, "load_after": _loadavg(),
        "step_s": [r.get("time/step") for r in records],
        "kl": [r[KL_KEY] for r in records],
        "beta": [r.get("kl_ctrl/coef", job["coef"]) for r in records],
        "reward": [r["rollout/reward"] for r in records],
    })
    return row


class Runner:
    """Runs jobs one at a time here, or in two worker processes (each keeps its own Ray up between its runs),
    appending each finished row to ``results``. Rows of ``reused`` stand in for the fixed runs they match."""

    def __init__(self, workers: int, results: Path, reused: list[dict]):
        self.results, self.reused, self.pool = results, reused, None
        if workers > 1:
            import multiprocessing as mp

            self.pool = mp.get_context("spawn").Pool(workers)

    def _record(self, row: dict) -> None:
        with self.results.open("a") as f:
            f.write(json.dumps(row) + "\n")
        kl = second_half(row["kl"])
        print(f"[adaptive_kl_ppo] {row['name']}: {row['wall_s']} s, second-half KL {sum(kl) / len(kl):.3f}",
              flush=True)

    def run(self, jobs: list[dict]) -> list[dict]:
        rows, todo = [], []
        for job in jobs:
            old = next((r for r in self.reused if all(r.get(k) == job[k] for k in REUSE_KEYS)), None)
            if old is None:
                todo.append(job)
            else:
                rows.append({**old, "phase": job["phase"], "reused": True})
                self._record(rows[-1])
        for row in (self.pool.imap_unordered(run_one, todo) if self.pool else map(run_one, todo)):
            rows.append(row)
            self._record(row)
        return rows

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()  # let the workers exit on their own (their Ray shuts down at exit)
            self.pool.join()


# A fixed run is reused from --reuse-fixed when all of these match.
REUSE_KEYS = ("ctrl", "coef", "seed", "steps", "lr", "prompts", "samples", "response_len")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="outputs/adaptive_kl_bench", help="run folders (metrics.jsonl of each run)")
    p.add_argument("--results", default="benchmarks/results/adaptive_kl_ppo",
                   help="runs.jsonl, tables.md and summary.json go here")
    p.add_argument("--plot", default="docs/en/assets/adaptive_kl_ppo.png")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--targets", type=float, nargs="+", default=[0.1, 0.4],
                   help="per-sample mean KL per token, averaged over samples")
    p.add_argument("--sweep", type=float, nargs="+", default=[0.05, 0.06, 0.08, 0.1, 0.13],
                   help="fixed coefficients: the best per target, and the reference the starts are set from")
    p.add_argument("--start-factor", type=float, default=10.0,
                   help="adaptive (and fixed) starts at reference / f and reference * f")
    p.add_argument("--kl-horizon", type=float, default=256)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples-per-prompt", type=int, default=8)
    p.add_argument("--response-len", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-2)
    p.add_argument("--workers", type=int, default=1, choices=(1, 2), help="train.py processes at a time")
    p.add_argument("--reuse-fixed", default=None,
                   help="a results folder of an earlier run: its fixed runs with the same flags and seed are reused")
    a = p.parse_args(argv)

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    out, results = Path(a.out).resolve(), Path(a.results)
    results.mkdir(parents=True, exist_ok=True)
    runs_file = results / "runs.jsonl"
    runs_file.unlink(missing_ok=True)
    model, data = write_task(out)
    common = {"steps": a.steps, "horizon": a.kl_horizon, "lr": a.lr, "prompts": a.prompts,
              "samples": a.samples_per_prompt, "response_len": a.response_len, "model": str(model), "data": str(data)}

    def job(ctrl, coef, seed, target=None, phase="sweep"):
        name = f"{ctrl}_{coef:g}" + (f"_target{target:g}" if target is not None else "") + f"_seed{seed}"
        return {**common, "name": name, "phase": phase, "ctrl": ctrl, "coef": coef, "target": target,
                "seed": seed, "run_dir": str(out / name)}

    reused = []
    if a.reuse_fixed:
        old_rows = (Path(a.reuse_fixed) / "runs.jsonl").read_text().splitlines()
        reused = [r for r in map(json.loads, old_rows) if r["ctrl"] == "fixed"]
    runner = Runner(a.workers, runs_file, reused)
    t0 = time.perf_counter()
    sweep = runner.run([job("fixed", c, s) for s in a.seeds for c in a.sweep])
    starts = {}
    for target in a.targets:
        ref = reference_beta(sweep, target)
        starts[target] = (ref / a.start_factor, ref * a.start_factor)
        print(f"[adaptive_kl_ppo] target {target:g}: the swept beta that first holds it is {ref:g}; "
              f"starts {starts[target][0]:g} and {starts[target][1]:g}", flush=True)
    fixed_starts = sorted({round(c, 6) for pair in starts.values() for c in pair} - set(a.sweep))
    # Adaptive runs first: a run cut short by the machine's time limit still has what the benchmark is for.
    jobs = [job("adaptive", round(c, 6), s, target=t, phase="start")
            for s in a.seeds for t, pair in starts.items() for c in pair]
    jobs += [job("fixed", c, s, phase="start") for s in a.seeds for c in fixed_starts]
    runner.run(jobs)
    runner.close()
    wall = time.perf_counter() - t0
    (results / "invocation.json").write_text(json.dumps(
        {"argv": sys.argv[1:] if argv is None else list(argv), "wall_s": round(wall, 1),
         "targets": a.targets, "start_factor": a.start_factor, "starts": {str(t): s for t, s in starts.items()},
         "workers": a.workers, "load_end": _loadavg()}, indent=1) + "\n")
    print(f"[adaptive_kl_ppo] all runs: {wall:.0f} s", flush=True)

    return adaptive_kl_ppo_report.main(["--results", str(results), "--plot", a.plot])


if __name__ == "__main__":
    sys.exit(main())
