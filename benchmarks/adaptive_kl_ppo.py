"""Fixed vs adaptive reward-side KL coefficient on a tiny PPO run (policy + value model) on CPU.

Task: the reward is the share of vowels in the answer. A randomly initialised tiny policy writes a
vowel about 5% of the time, so the reward pulls it steadily away from the reference; the only brake is
the reward-side KL, ``r_t - beta * KL_t``. Both runs start from the same weights, prompts, seeds and
beta; only ``--kl-ctrl`` differs. The default start beta (0.2) is too large for the default target
(0.3 nat per token): held fixed it keeps the KL near 0.06, while the adaptive controller lowers it until
the KL reaches the target. (A too-small fixed beta overshoots instead: 0.02 drives this policy to
~3.2 nat per token and a collapsed, all-vowel policy that the controller needs far more steps to undo.)

    python benchmarks/adaptive_kl_ppo.py --out outputs/adaptive_kl_bench

Writes ``{out}/{fixed,adaptive}/metrics.jsonl``, ``{out}/adaptive_kl_ppo.png`` and prints the table.
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
    return sum(ch in TARGET_CHARS for ch in text) / max(1, len(text))


def write_task(root: Path) -> tuple[Path, Path]:
    """A tiny policy checkpoint (also the reference and the critic's start) and a prompt file."""
    from slime.utils.tiny_models import save_tiny_checkpoint

    root.mkdir(parents=True, exist_ok=True)
    model = save_tiny_checkpoint(root / "tiny_model", hidden_size=32, num_layers=1, num_heads=2, seed=0)
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": [{"role": "user", "content": p}]}) + "\n" for p in PROMPTS))
    return model, data


def train_argv(model: Path, data: Path, out: Path, *, ctrl: str, num_rollout: int, kl_coef: float,
               kl_target: float, horizon: float, estimator: str = "ppo", lr: float = 2e-2) -> list[str]:
    """train.py flags of one run: 8 prompts x 2 samples, 8 new tokens each, one optimizer step per batch."""
    argv = [
        "--hf-checkpoint", str(model), "--prompt-data", str(data), "--apply-chat-template",
        "--custom-rm-path", "benchmarks.adaptive_kl_ppo.share_of_vowels",
        "--advantage-estimator", estimator, "--num-rollout", str(num_rollout),
        "--rollout-batch-size", "8", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "8",
        "--global-batch-size", "16", "--micro-batch-size", "16", "--rollout-seed", "7", "--seed", "7",
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


def _plot(runs: dict, target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_kl, ax_coef) = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, records in runs.items():
        steps = [r["step"] for r in records]
        ax_kl.plot(steps, [r["kl/observed_token_mean"] for r in records], marker=".", label=name)
        ax_coef.plot(steps, [r["kl_ctrl/coef_used"] for r in records], marker=".", label=name)
    ax_kl.axhline(target, color="grey", linestyle="--", label="target")
    ax_kl.set(xlabel="step", ylabel="observed KL (per-token mean)", title="policy vs reference KL")
    ax_coef.set(xlabel="step", ylabel="beta used for the batch", yscale="log", title="KL coefficient")
    ax_kl.legend()
    ax_coef.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="outputs/adaptive_kl_bench")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--last", type=int, default=15, help="steps averaged for the deviation")
    p.add_argument("--kl-coef", type=float, default=0.2, help="the fixed beta and the adaptive start")
    p.add_argument("--kl-target", type=float, default=0.3, help="per-token mean KL")
    p.add_argument("--kl-horizon", type=float, default=32, help="16 samples per batch: clip 0.2 -> +-10%%")
    a = p.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import train
    from slime.utils.metrics import read_metrics

    out = Path(a.out)
    model, data = write_task(out)
    runs = {}
    for ctrl in ("fixed", "adaptive"):
        run_out = out / ctrl
        (run_out / "metrics.jsonl").unlink(missing_ok=True)
        train.main(train_argv(model, data, run_out, ctrl=ctrl, num_rollout=a.steps, kl_coef=a.kl_coef,
                              kl_target=a.kl_target, horizon=a.kl_horizon))
        runs[ctrl] = read_metrics(run_out / "metrics.jsonl")

    dev = {name: relative_deviation([r["kl/observed_token_mean"] for r in recs[-a.last:]], a.kl_target)
           for name, recs in runs.items()}
    print(f"\ntarget per-token KL {a.kl_target}, start beta {a.kl_coef}, {a.steps} steps, last {a.last} averaged")
    print(f"{'step':>4} | {'fixed KL':>9} {'beta':>8} | {'adaptive KL':>11} {'beta':>8}")
    for f, d in zip(runs["fixed"], runs["adaptive"]):
        print(f"{f['step']:>4} | {f['kl/observed_token_mean']:>9.4f} {f['kl_ctrl/coef_used']:>8.4f} | "
              f"{d['kl/observed_token_mean']:>11.4f} {d['kl_ctrl/coef_used']:>8.4f}")
    print(f"mean |KL/target - 1| over the last {a.last} steps: fixed {dev['fixed']:.3f}, "
          f"adaptive {dev['adaptive']:.3f}, ratio fixed/adaptive {dev['fixed'] / dev['adaptive']:.1f}x")
    _plot(runs, a.kl_target, out / "adaptive_kl_ppo.png")
    print(f"plot: {out / 'adaptive_kl_ppo.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
