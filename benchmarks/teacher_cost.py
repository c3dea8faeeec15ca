"""Teacher cost per trajectory: our single-pass layout against the official per-turn layout.

Trajectories are real: Towers of Hanoi from a full tower of d disks takes exactly T = 2**d - 1 expert
turns, so ``--disks 2 3 4 5`` gives T = 3, 7, 15, 31. For each T the script builds ``--n`` expert
trajectories (``build_expert_sample``) and ``--n`` student-played ones (``multi_turn.generate`` with
``--max-turns T`` against the engine, so the student plays exactly T turns), then scores each set
with both strategies on one hf_engine process:

* single pass (ours): one score-only request per trajectory, the whole sequence, ``logprob_start_len 0``
  (slime's exact teacher payload); all trajectories sent concurrently.
* per turn (official layout): turn j's example is the whole history up to and including action j;
  one score-only request per example, all examples of all trajectories sent at once (the official
  code scores after the episode, so nothing forces them to wait on each other). Each asks only for
  its own turn's log-probs (``logprob_start_len`` = turn start - 1), the cheapest reasonable reply.

The two sides alternate within every repeat (drifting machine load hits both alike); the best time of
each is kept, and the median of the per-repeat ratios is printed too. It also checks that both give
the same teacher log-probs on every student token (max abs difference).

    python benchmarks/teacher_cost.py [--disks 2 3 4 5] [--n 4] [--repeats 3] [--plot PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from argparse import Namespace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.agent_envs import build_env  # noqa: E402
from examples.agent_envs.make_data import task_rows  # noqa: E402
from rollout_throughput import play  # noqa: E402  (run as a script, this folder is on sys.path)
from slime.backends.sglang_utils.launcher import launch_engine  # noqa: E402
from slime.backends.sglang_utils.router import host_port  # noqa: E402
from slime.rollout.expert_sft import build_expert_sample  # noqa: E402
from slime.rollout.on_policy_distillation import teacher_payload  # noqa: E402
from slime.rollout.sglang_rollout import run_async  # noqa: E402
from slime.utils import http_utils  # noqa: E402
from slime.utils.tiny_models import build_tokenizer, save_tiny_checkpoint  # noqa: E402
from slime.utils.types import Sample  # noqa: E402


def expert_trajectories(disks: int, n: int, tok) -> list[Sample]:
    rows = task_rows("hanoi", n, 0, {"disks": disks, "start": "tower"})
    # The rows' metadata carries the expert actions (make_data keeps them there, as upstream's Dataset does).
    return [build_expert_sample(build_env, None, Sample(index=i, metadata=dict(row["metadata"])), tok)
            for i, row in enumerate(rows)]


def student_trajectories(disks: int, n: int, ckpt: str, url: str) -> list[Sample]:
    from slime.utils.arguments import get_parser, validate_args

    turns = 2 ** disks - 1
    args = get_parser().parse_args([
        "--hf-checkpoint", ckpt, "--max-turns", str(turns), "--max-turn-response-len", "8",
        "--rollout-max-response-len", str(160 * turns), "--rollout-interaction-env-path",
        "examples.agent_envs", "--rollout-seed", "0"])
    validate_args(args)
    # The agent loop reaches its engine through upstream's router flags, here the engine itself.
    args.sglang_router_ip, args.sglang_router_port = host_port(url)
    # max_steps well past T: the episode ends at --max-turns, not because the env gave up.
    return play(args, [Sample(index=i, metadata={"env": "hanoi", "seed": i, "disks": disks, "start": "tower",
                                                 "max_steps": 4 * turns}) for i in range(n)])


def per_turn_examples(s: Sample):
    """(input_ids, logprob_start_len, first scored token) of each turn's example in the official layout."""
    prompt = len(s.tokens) - s.response_length
    for a, b in s.metadata["turn_spans"]:
        start = prompt + a  # the turn's first action token
        yield s.tokens[: prompt + b], start - 1, start


async def _post_all(url, payloads):
    return await asyncio.gather(*(http_utils.post(url, p, max_retries=1) for p in payloads))


# What teacher_payload reads of the run's arguments: the teacher scores at temperature 1, no top-k.
TEACHER_ARGS = Namespace(rollout_temperature=1.0, opd_teacher_top_k=0)


def score_single(url, trajs):
    replies = run_async(_post_all(url, [teacher_payload(TEACHER_ARGS, s) for s in trajs]))
    # Entry i is the log-prob of token i (entry 0, the first token, has none).
    return [[e[0] for e in r["meta_info"]["input_token_logprobs"]] for r in replies]


def score_per_turn(url, trajs):
    jobs = [(ti, ex) for ti, s in enumerate(trajs) for ex in per_turn_examples(s)]
    payloads = [{"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 0},
                 "return_logprob": True, "logprob_start_len": lp_start} for _, (ids, lp_start, _) in jobs]
    replies = run_async(_post_all(url, payloads))
    out = [dict() for _ in trajs]  # token position -> teacher log-prob
    for (ti, (ids, lp_start, first)), r in zip(jobs, replies):
        entries = r["meta_info"]["input_token_logprobs"]  # entry k is token lp_start + k
        for pos in range(first, len(ids)):
            out[ti][pos] = entries[pos - lp_start][0]
    return out


def max_abs_diff(trajs, single, per_turn) -> float:
    worst = 0.0
    for s, full, turns in zip(trajs, single, per_turn):
        prompt = len(s.tokens) - s.response_length
        for a, b in s.metadata["turn_spans"]:
            for pos in range(prompt + a, prompt + b):
                worst = max(worst, abs(full[pos] - turns[pos]))
    return worst


def measure(url, trajs, repeats):
    single_tok = sum(len(s.tokens) for s in trajs)
    per_turn_tok = sum(len(ex[0]) for s in trajs for ex in per_turn_examples(s))
    times = {"single": [], "per_turn": []}
    for _ in range(repeats):  # alternate the sides within each repeat
        for name, fn in (("single", score_single), ("per_turn", score_per_turn)):
            t0 = time.perf_counter()
            result = fn(url, trajs)
            times[name].append(time.perf_counter() - t0)
            if name == "single":
                single = result
            else:
                per_turn = result
    ratios = [p / s for s, p in zip(times["single"], times["per_turn"])]
    return {
        "turns": statistics.mean(s.metadata["num_turns"] for s in trajs),
        "tokens_single": single_tok / len(trajs), "tokens_per_turn": per_turn_tok / len(trajs),
        "t_single": min(times["single"]), "t_per_turn": min(times["per_turn"]),
        "ratio_best": min(times["per_turn"]) / min(times["single"]), "ratio_median": statistics.median(ratios),
        "max_abs_diff": max_abs_diff(trajs, single, per_turn),
    }


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for source, marker in (("expert", "o"), ("student", "s")):
        rows = [r for r in results if r["source"] == source]
        t = [r["turns"] for r in rows]
        ax.plot(t, [r["tokens_per_turn"] / r["tokens_single"] for r in rows], marker=marker,
                label=f"token ratio ({source})")
        ax.plot(t, [r["ratio_median"] for r in rows], marker=marker, ls="--", label=f"wall-time ratio, median ({source})")
    t = sorted({r["turns"] for r in results})
    ax.plot(t, [x / 2 for x in t], color="grey", ls=":", label="T / 2")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("turns per trajectory T")
    ax.set_ylabel("per-turn layout / single pass")
    ax.set_title("Teacher cost per trajectory (hanoi, hf_engine)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--disks", type=int, nargs="+", default=[2, 3, 4, 5], help="T = 2**disks - 1 turns")
    p.add_argument("--n", type=int, default=4, help="trajectories per T and source")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hidden-size", type=int, default=64, help="64 x 2 layers is the CPU demo's model")
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="engine torch threads; 1 is steadier on a busy machine")
    p.add_argument("--plot", default=None, help="write a PNG of the ratios against T")
    a = p.parse_args(argv)

    tok = build_tokenizer()
    workdir = Path(tempfile.mkdtemp(prefix="teacher_cost_"))
    ckpt = str(save_tiny_checkpoint(workdir / "model", hidden_size=a.hidden_size, num_layers=a.num_layers,
                                    num_heads=4, max_position_embeddings=8192))
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    engine = launch_engine(Namespace(rollout_backend="hf_engine", engine_host="127.0.0.1", seed=0,
                                     rollout_concurrency=64, hf_checkpoint=ckpt),
                           log_dir=workdir / "logs", timeout=300, env=env)
    url = f"{engine.url}/generate"
    results = []
    try:
        for disks in a.disks:
            sets = {"expert": expert_trajectories(disks, a.n, tok),
                    "student": student_trajectories(disks, a.n, ckpt, engine.url)}
            for source, trajs in sets.items():
                score_single(url, trajs[:1])  # warm-up at this length
                results.append(dict(measure(url, trajs, a.repeats), source=source))
                r = results[-1]
                print(f"T={r['turns']:>4.1f} {source:<8} tokens/traj single {r['tokens_single']:>7.0f} "
                      f"per-turn {r['tokens_per_turn']:>8.0f} ratio {r['tokens_per_turn'] / r['tokens_single']:>5.2f} "
                      f"(T/2 {r['turns'] / 2:>5.1f}) | wall single {r['t_single']:.3f}s per-turn "
                      f"{r['t_per_turn']:.3f}s ratio best {r['ratio_best']:.2f} median {r['ratio_median']:.2f} "
                      f"| max |dlogp| {r['max_abs_diff']:.2e}", flush=True)
    finally:
        run_async(http_utils.close_session())
        engine.stop()
    print(f"\nmodel: tiny Qwen3 hidden {a.hidden_size}, {a.num_layers} layers, fp32, engine threads {a.threads}; "
          f"{a.n} trajectories per row; best of {a.repeats} alternated repeats; load {os.getloadavg()}")
    print("| T | source | teacher tokens / traj, single pass | per-turn layout | token ratio | T/2 | "
          "wall single (s) | wall per-turn (s) | wall ratio (best) | wall ratio (median) | max abs dlogp |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['turns']:.0f} | {r['source']} | {r['tokens_single']:.0f} | {r['tokens_per_turn']:.0f} | "
              f"{r['tokens_per_turn'] / r['tokens_single']:.2f} | {r['turns'] / 2:.1f} | {r['t_single']:.3f} | "
              f"{r['t_per_turn']:.3f} | {r['ratio_best']:.2f} | {r['ratio_median']:.2f} | {r['max_abs_diff']:.1e} |")
    if a.plot:
        plot(results, a.plot)
        print(f"plot written to {a.plot}")


if __name__ == "__main__":
    main()
