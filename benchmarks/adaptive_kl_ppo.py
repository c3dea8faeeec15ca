"""Fixed vs adaptive reward-side KL coefficient on a tiny PPO run (policy + value model) on CPU.

Task: the reward is the share of vowels in the answer, which pulls the policy steadily away from the
reference; the only brake is the reward-side KL, ``r_t - beta * KL_t``. For each seed, four runs share
weights, prompts and seeds: a fixed low and a fixed high beta, and ``--kl-ctrl adaptive`` starting from
each. The controller is slime/utils/kl_controller.py, the file the slime PR ships; the KL it reads is each
sample's per-token mean, averaged over samples.

    python benchmarks/adaptive_kl_ppo.py --out outputs/adaptive_kl_bench

Writes ``{out}/seed{N}/{ctrl}_{beta}/metrics.jsonl`` and prints the table of docs/en/advanced/adaptive-kl.md.
The helpers (reward, data, argv) are shared with tests/test_adaptive_kl_integration.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TARGET_CHARS = "aeiou"
PROMPTS = ["Write:", "Say it:", "Go:", "Answer:", "Type:", "Reply:", "Now:", "Next:"]


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
               kl_target: float, horizon: float, estimator: str = "ppo", lr: float = 2e-2, seed: int = 7) -> list[str]:
    """train.py flags of one run: 8 prompts x 2 samples, 8 new tokens each, one optimizer step per batch."""
    argv = [
        "--hf-checkpoint", str(model), "--prompt-data", str(data), "--apply-chat-template",
        "--custom-rm-path", "benchmarks.adaptive_kl_ppo.share_of_vowels",
        "--advantage-estimator", estimator, "--num-rollout", str(num_rollout),
        "--rollout-batch-size", "8", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "8",
        "--global-batch-size", "16", "--micro-batch-size", "16", "--rollout-seed", str(seed), "--seed", str(seed),
        "--lr", str(lr), "--critic-lr", str(lr), "--actor-num-gpus-per-node", "1",
        "--kl-coef", str(kl_coef), "--kl-ctrl", ctrl, "--kl-ctrl-unit", "token",
        "--metrics-dir", str(out),
    ]
    if ctrl == "adaptive":
        argv += ["--kl-target", str(kl_target), "--kl-horizon", str(horizon)]
    return argv


KL_KEY = "kl/observed_sample_mean"  # each sample's per-token mean, averaged over samples: the controller's input


def relative_deviation(kls: list[float], target: float) -> float:
    """Mean of |KL / target - 1| over the given steps."""
    return sum(abs(k / target - 1.0) for k in kls) / len(kls)


def summarize(records: list[dict], target: float) -> dict:
    """Second-half deviation from the target, first step with KL >= target (None: never), second-half reward."""
    half = records[len(records) // 2:]
    first = next((r["step"] for r in records if r[KL_KEY] >= target), None)
    return {"dev": relative_deviation([r[KL_KEY] for r in half], target), "first": first,
            "reward": sum(r["rollout/reward"] for r in half) / len(half), "kl": sum(r[KL_KEY] for r in half) / len(half),
            "coef_end": records[-1]["kl_ctrl/coef"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="outputs/adaptive_kl_bench")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--coef-low", type=float, default=0.02, help="the low fixed beta and one adaptive start")
    p.add_argument("--coef-high", type=float, default=0.2, help="the high fixed beta and the other adaptive start")
    p.add_argument("--kl-target", type=float, default=0.3, help="per-sample mean KL per token, averaged over samples")
    p.add_argument("--kl-horizon", type=float, default=32, help="16 samples per batch: clip 0.2 -> +-10%% a step")
    a = p.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import train
    from slime.utils.metrics import read_metrics

    out = Path(a.out)
    model, data = write_task(out)
    configs = [("fixed", a.coef_low), ("fixed", a.coef_high), ("adaptive", a.coef_low), ("adaptive", a.coef_high)]
    rows = {}
    for seed in a.seeds:
        for ctrl, coef in configs:
            run_out = out / f"seed{seed}" / f"{ctrl}_{coef:g}"
            (run_out / "metrics.jsonl").unlink(missing_ok=True)
            train.main(train_argv(model, data, run_out, ctrl=ctrl, num_rollout=a.steps, kl_coef=coef,
                                  kl_target=a.kl_target, horizon=a.kl_horizon, seed=seed))
            rows.setdefault((ctrl, coef), []).append(summarize(read_metrics(run_out / "metrics.jsonl"), a.kl_target))

    print(f"\ntarget {a.kl_target} (per-sample mean KL per token), horizon {a.kl_horizon}, {a.steps} steps, "
          f"seeds {a.seeds}; deviation, KL and reward averaged over steps {a.steps // 2}..{a.steps - 1}")
    print("| run | mean abs(KL/target - 1) | KL | first step KL >= target | reward | final beta |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (ctrl, coef), per_seed in rows.items():
        def col(key, fmt):
            return " / ".join(fmt.format(r[key]) if r[key] is not None else "never" for r in per_seed)

        mean_dev = sum(r["dev"] for r in per_seed) / len(per_seed)
        print(f"| {ctrl} beta {coef:g} | {mean_dev:.2f} ({col('dev', '{:.2f}')}) | {col('kl', '{:.3f}')} | "
              f"{col('first', '{}')} | {col('reward', '{:.3f}')} | {col('coef_end', '{:.3g}')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
