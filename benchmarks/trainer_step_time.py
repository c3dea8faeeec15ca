"""Step time of the Megatron trainer backend against the FSDP backend on the CPU demo's model and batch.

Both backends run ``RolloutTrainer.train`` on the same checkpoint and the same samples; the timed span
is the whole ``train`` call on rank 0 (both ranks start it together after a barrier), split into the
trainer's own sub-timings ``time/train_logprobs`` (old-policy / teacher forwards, advantages) and
``time/train_update`` (the optimizer step's forwards, backwards, reductions, AdamW).

    python benchmarks/trainer_step_time.py [--steps 8] [--warmup 2] [--repeats 2]
        [--configs fsdp-1 megatron-tp1 fsdp-2 megatron-tp2 megatron-dp2] [--workloads server in-trainer] [--threads 1]

Configurations (``CONFIGS``): FSDP2 on 1 and 2 processes, Megatron-core with tensor parallelism 1
(1 process) and 2 (2 processes), and data parallelism 2 (TP 1, 2 processes). Every configuration and
workload runs in its own freshly spawned gloo group (``launch.run_local_group``), so none inherits
another's threads, allocator or parallel state. Each spawn runs ``--warmup`` unmeasured steps and then
its share of the ``--steps`` measured ones; each configuration is spawned ``--repeats`` times, and the
order of the spawns alternates the backends (FSDP, Megatron, FSDP, Megatron, Megatron) and is reversed
in every other round, so a change of machine load during the run falls on both sides.

The workload is one step of the demo (``scripts/run-tiny-tcod.sh``, vanilla OPD):
student and teacher are the demo's tiny Qwen3 shape (hidden 64, 2 layers, 4 heads, the char-level
vocabulary of 100), built here with random weights (seed 0 and 1); 16 episodes per step in one optimizer
step (--rollout-batch-size 16, --global-batch-size 16, --micro-batch-size 8), lr 1e-3, rollout
temperature 1.0, --opd-loss full. Episodes are gridnav tasks with the demo's parameters, played with
random moves for 6 to 10 turns in the real environment and laid out as the agent loop does (chat
prompt, trainable actions, masked observations), which gives the demo's size: its 60 vanilla-OPD steps
averaged 334 response tokens and 37 trained tokens per episode. Workloads:

* ``server``: the demo's teacher mode, a server teacher (--opd-type sglang) whose reply the samples
  carry: the teacher's sampled-token log-probs and top-20 log-probs, computed here once from the teacher
  checkpoint at temperature 1 (what the hf_engine teacher returns);
* ``in-trainer``: the same teacher loaded into the trainer (--opd-type megatron --opd-teacher-load),
  which adds the teacher's forwards to the step;
* ``server-sampled`` (not run by default): the server teacher with slime's sampled term
  (--opd-loss sampled).

``--profile`` runs one profiled step per configuration instead (torch.profiler, rank 0's operators by
self CPU time), to see where a backend spends its step.

Sanity check: the loss of step 0 (same checkpoint, same samples, every spawn) must agree between the
backends and layouts within rel 1e-4 (the tolerance of the backend parity tests); the output says so.
Results: a markdown table on stdout and ``benchmarks/results/trainer_step_time.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# name -> (backend, processes, tensor-parallel size)
CONFIGS = {
    "fsdp-1": ("fsdp", 1, 1),
    "megatron-tp1": ("megatron", 1, 1),
    "fsdp-2": ("fsdp", 2, 1),
    "megatron-tp2": ("megatron", 2, 2),
    "megatron-dp2": ("megatron", 2, 1),
}
# The FSDP configuration each Megatron one is compared with (same number of processes).
BASELINE = {"megatron-tp1": "fsdp-1", "megatron-tp2": "fsdp-2", "megatron-dp2": "fsdp-2"}
WORKLOADS = ("server", "in-trainer", "server-sampled")
DEMO = {"batch": 16, "micro_batch": 8, "lr": "1e-3", "max_turns": 10, "turns": (6, 10), "top_k": 20,
        "hidden_size": 64, "num_layers": 2, "num_heads": 4,
        "grid": {"size": 6, "walls": 0.0}, "min_len": 4, "max_len": 8}
LOSS_REL_TOL = 1e-4
MOVES = ("up", "down", "left", "right")


# ---------------------------------------------------------------------------- workload
def build_checkpoints(root: Path) -> dict[str, str]:
    from slime.utils.tiny_models import save_tiny_checkpoint

    shape = {k: DEMO[k] for k in ("hidden_size", "num_layers", "num_heads")}
    return {"student": str(save_tiny_checkpoint(root / "student", seed=0, **shape)),
            "teacher": str(save_tiny_checkpoint(root / "teacher", seed=1, **shape))}


def make_batches(n_batches: int, teacher_ckpt: str, seed: int = 0) -> list[list]:
    """``n_batches`` demo-sized batches of multi-turn gridnav episodes with the server teacher's reply."""
    from examples.multi_turn_tcod.envs import gridnav
    from examples.agent_envs.make_data import task_rows
    from examples.multi_turn_tcod.chat_layout import encode_action, encode_observation, encode_prompt
    from slime.utils.tiny_models import build_tokenizer
    from slime.utils.types import Sample

    tok = build_tokenizer()
    rng = random.Random(seed)
    n = n_batches * DEMO["batch"]
    rows = list(task_rows("gridnav", n, seed, DEMO["grid"], min_len=DEMO["min_len"], max_len=DEMO["max_len"]))
    samples = []
    for i, row in enumerate(rows):
        env = gridnav.GridNavEnv(row["metadata"])
        sample = Sample(group_index=i % DEMO["batch"], index=i % DEMO["batch"], prompt=row["input"],
                        tokens=encode_prompt(tok, env.reset()[0]), reward=0.0)
        turns = rng.randint(*DEMO["turns"])
        for turn in range(turns):
            move = rng.choice(MOVES)
            ids = encode_action(tok, move)
            sample.append_response_tokens(tokens=ids, trainable=True, log_probs=[-1.0] * len(ids))
            observation, done, _ = env.step(move)
            if done:
                break
            if turn + 1 < turns:  # nothing follows the final action
                sample.append_response_tokens(tokens=encode_observation(tok, observation), trainable=False)
        env.close()
        sample.rollout_log_probs = None
        samples.append(sample)
    attach_teacher_reply(samples, teacher_ckpt)
    return [samples[b * DEMO["batch"]:(b + 1) * DEMO["batch"]] for b in range(n_batches)]


def attach_teacher_reply(samples, teacher_ckpt: str) -> None:
    """What ``on_policy_distillation.post_process_rewards`` stores from a server teacher's reply: the
    sampled tokens' log-probs and the top-k ids / log-probs of every response position (temperature 1)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(teacher_ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        for s in samples:
            tokens = torch.tensor(s.tokens)
            rows = torch.log_softmax(model(tokens[None]).logits[0].float(), -1)[s.prompt_length - 1:-1]
            s.teacher_log_probs = rows.gather(-1, tokens[s.prompt_length:, None])[:, 0].tolist()
            top = rows.topk(DEMO["top_k"], dim=-1)
            s.metadata = {**(s.metadata or {}),
                          "teacher_topk": {"ids": top.indices.tolist(), "logprobs": top.values.tolist()}}


def batch_sizes(samples) -> dict:
    return {"sequence_tokens": sum(len(s.tokens) for s in samples),
            "response_tokens": sum(s.response_length for s in samples),
            "trained_tokens": sum(sum(s.loss_mask) for s in samples)}


def trainer_argv(ckpts: dict, config: str, workload: str) -> list[str]:
    backend, world, tp = CONFIGS[config]
    argv = ["--hf-checkpoint", ckpts["student"], "--rollout-batch-size", str(DEMO["batch"]),
            "--n-samples-per-prompt", "1", "--global-batch-size", str(DEMO["batch"]),
            "--micro-batch-size", str(DEMO["micro_batch"]), "--lr", DEMO["lr"], "--rollout-temperature", "1.0",
            "--rollout-max-response-len", "480", "--seed", "0", "--use-opd",
            "--train-backend", backend, "--actor-num-gpus-per-node", str(world)]
    if backend == "megatron":
        argv += ["--tensor-model-parallel-size", str(tp)]
    if workload == "in-trainer":
        argv += ["--opd-type", "megatron", "--opd-teacher-load", ckpts["teacher"], "--opd-loss", "full"]
    else:
        argv += ["--opd-type", "sglang", "--rm-url", "http://127.0.0.1:1/generate",
                 "--opd-loss", "full" if workload == "server" else "sampled"]
    return argv


# ---------------------------------------------------------------------------- one spawned group
def worker(rank: int, world: int, argv: list[str], batches: list[list], warmup: int, threads: int | None,
           profile: bool = False):
    """Build the actor, train every batch (the first ``warmup`` unmeasured), time each ``train`` call.
    With ``profile``, the last call runs under torch.profiler and rank 0 adds its table of operators."""
    import torch
    import torch.distributed as dist
    import transformers

    from slime.utils.arguments import get_parser, validate_args

    transformers.utils.logging.disable_progress_bar()
    if threads:
        torch.set_num_threads(threads)
    args = validate_args(get_parser().parse_args(argv))
    t0 = time.perf_counter()
    if args.train_backend == "megatron":
        from slime.backends.megatron_utils.actor import MegatronActor as Actor
    else:
        from slime.backends.fsdp_utils.actor import FSDPActor as Actor
    actor = Actor(args, rank, world)
    setup_s = time.perf_counter() - t0
    steps, table = [], None
    for i, samples in enumerate(batches):
        samples = copy.deepcopy(samples)
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) \
            if profile and i == len(batches) - 1 else contextlib.nullcontext()
        dist.barrier()
        start = time.perf_counter()
        with profiler:
            metrics = actor.train(i, samples, kl_coef=args.kl_coef)
        seconds = time.perf_counter() - start
        if not isinstance(profiler, contextlib.nullcontext):
            table = profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
        steps.append({"batch": i, "warmup": i < warmup, "train_s": seconds,
                      "logprobs_s": metrics["time/train_logprobs"], "update_s": metrics["time/train_update"],
                      "loss": metrics["loss"], "grad_norm": metrics["grad_norm"], **batch_sizes(samples)})
    if rank != 0:
        return None
    return {"setup_s": setup_s, "threads": torch.get_num_threads(), "steps": steps, "profile": table}


def run_spawn(ckpts, config: str, workload: str, batches, warmup: int, threads: int | None,
              profile: bool = False) -> dict:
    from slime.backends.fsdp_utils.launch import run_local_group

    world = CONFIGS[config][1]
    t0 = time.perf_counter()
    result = run_local_group(worker, world, trainer_argv(ckpts, config, workload), batches, warmup, threads,
                             profile)[0]
    result["spawn_wall_s"] = time.perf_counter() - t0
    return result


# ---------------------------------------------------------------------------- statistics
def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def summarise(steps: list[dict]) -> dict:
    train = [s["train_s"] for s in steps]
    q1, median, q3 = quartiles(train)
    return {"n": len(steps), "train_median_s": median, "train_q1_s": q1, "train_q3_s": q3, "train_iqr_s": q3 - q1,
            "logprobs_median_s": statistics.median(s["logprobs_s"] for s in steps),
            "update_median_s": statistics.median(s["update_s"] for s in steps),
            "tokens_per_s": statistics.median(s["sequence_tokens"] / s["train_s"] for s in steps),
            "trained_tokens_per_s": statistics.median(s["trained_tokens"] / s["train_s"] for s in steps)}


def loss_check(results: dict, workloads: list[str]) -> dict:
    """Step-0 loss of every spawn against the first FSDP (else first) configuration's, per workload."""
    out = {}
    for workload in workloads:
        runs = {c: r for (c, w), r in results.items() if w == workload}
        if not runs:
            continue
        ref_name = next((c for c in runs if c.startswith("fsdp")), next(iter(runs)))
        ref = runs[ref_name]["spawns"][0]["steps"][0]
        worst, rows = 0.0, {}
        for config, run in runs.items():
            losses = [spawn["steps"][0]["loss"] for spawn in run["spawns"]]
            norms = [spawn["steps"][0]["grad_norm"] for spawn in run["spawns"]]
            rel = max(max(abs(v - ref["loss"]) / max(abs(ref["loss"]), 1e-12) for v in losses),
                      max(abs(v - ref["grad_norm"]) / max(abs(ref["grad_norm"]), 1e-12) for v in norms))
            worst = max(worst, rel)
            rows[config] = {"loss": losses, "grad_norm": norms, "max_rel_diff": rel}
        out[workload] = {"reference": ref_name, "reference_loss": ref["loss"], "max_rel_diff": worst,
                         "agree": worst <= LOSS_REL_TOL, "configs": rows}
    return out


# ---------------------------------------------------------------------------- report
def load_average() -> list[float]:
    return list(os.getloadavg())


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except OSError:
        return "unknown"


def markdown(report: dict) -> str:
    lines = ["| configuration | workload | threads/rank | train median (s) | IQR, Q1-Q3 (s) | log-probs (s) "
             "| update (s) | tokens/s | vs FSDP same procs | step-0 loss |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    rows = report["rows"]
    for row in rows:
        base = next((r for r in rows if r["config"] == BASELINE.get(row["config"])
                     and r["workload"] == row["workload"]), None)
        ratio = f"{row['train_median_s'] / base['train_median_s']:.2f}x" if base else "-"
        label = {"fsdp-1": "FSDP, 1 process", "megatron-tp1": "Megatron TP 1, 1 process",
                 "fsdp-2": "FSDP, 2 processes", "megatron-tp2": "Megatron TP 2, 2 processes",
                 "megatron-dp2": "Megatron DP 2 (TP 1), 2 processes"}[row["config"]]
        lines.append(f"| {label} | {row['workload']} | {row['threads']} | {row['train_median_s']:.3f} "
                     f"| {row['train_q1_s']:.3f}-{row['train_q3_s']:.3f} | {row['logprobs_median_s']:.3f} "
                     f"| {row['update_median_s']:.3f} | {row['tokens_per_s']:.0f} | {ratio} "
                     f"| {row['step0_loss']:.6f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="measured train calls per configuration (all repeats)")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured train calls at the start of every spawn")
    parser.add_argument("--repeats", type=int, default=2,
                        help="spawns per configuration; the measured steps are split between them")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=["server", "in-trainer"])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per rank; 0 keeps the launcher's choice (torch's default for 1 process, "
                             "cores / processes for 2+). Default 1: on a shared 2-core machine a 2-thread pool "
                             "stalls whenever another process runs")
    parser.add_argument("--json", default=str(ROOT / "benchmarks/results/trainer_step_time.json"))
    parser.add_argument("--profile", action="store_true",
                        help="instead of the timing run: one spawn per --configs / --workloads pair, --warmup steps, "
                             "then one step under torch.profiler; prints rank 0's operators by self CPU time")
    a = parser.parse_args(argv)
    if a.steps < 1 or a.warmup < 1 or not 1 <= a.repeats <= a.steps:
        parser.error("need --steps >= 1, --warmup >= 1 (step 0 is the loss check) and 1 <= --repeats <= --steps")

    import transformers

    transformers.utils.logging.disable_progress_bar()
    started, load_start, commit = time.time(), load_average(), git_commit()
    shares = [a.steps // a.repeats + (r < a.steps % a.repeats) for r in range(a.repeats)]
    with tempfile.TemporaryDirectory() as tmp:
        ckpts = build_checkpoints(Path(tmp))
        pool = make_batches(a.warmup + a.steps, ckpts["teacher"])
        sizes = [batch_sizes(b) for b in pool]
        print(f"workload: {len(pool)} batches of {DEMO['batch']} episodes; per batch "
              f"{statistics.mean(s['sequence_tokens'] for s in sizes):.0f} tokens, "
              f"{statistics.mean(s['response_tokens'] for s in sizes) / DEMO['batch']:.0f} response and "
              f"{statistics.mean(s['trained_tokens'] for s in sizes) / DEMO['batch']:.1f} trained tokens "
              f"per episode (mean)", flush=True)
        pairs = [(c, w) for c in a.configs for w in a.workloads]
        if a.profile:
            for config, workload in pairs:
                spawn = run_spawn(ckpts, config, workload, pool[:a.warmup + 1], a.warmup, a.threads, profile=True)
                step = spawn["steps"][-1]
                print(f"\n{config} {workload}: train {step['train_s']:.3f} s (log-probs {step['logprobs_s']:.3f}, "
                      f"update {step['update_s']:.3f}) under the profiler, load {load_average()[0]:.2f}\n"
                      f"{spawn['profile']}", flush=True)
            return 0
        results = {p: {"spawns": []} for p in pairs}
        loads = []
        for r in range(a.repeats):
            first = a.warmup + sum(shares[:r])
            batches = pool[:a.warmup] + pool[first:first + shares[r]]
            for config, workload in (pairs if r % 2 == 0 else pairs[::-1]):
                spawn = run_spawn(ckpts, config, workload, batches, a.warmup, a.threads)
                load = load_average()
                loads.append(load[0])
                spawn.update(repeat=r, load_after=load)
                results[(config, workload)]["spawns"].append(spawn)
                measured = [s for s in spawn["steps"] if not s["warmup"]]
                print(f"  round {r} {config:13s} {workload:14s} train median "
                      f"{statistics.median(s['train_s'] for s in measured):.3f} s, step-0 loss "
                      f"{spawn['steps'][0]['loss']:.6f}, spawn {spawn['spawn_wall_s']:.0f} s, load {load[0]:.2f}",
                      flush=True)
    rows = []
    for (config, workload), run in results.items():
        measured = [s for spawn in run["spawns"] for s in spawn["steps"] if not s["warmup"]]
        rows.append({"config": config, "workload": workload, "backend": CONFIGS[config][0],
                     "processes": CONFIGS[config][1], "tensor_parallel": CONFIGS[config][2],
                     "threads": run["spawns"][0]["threads"], "step0_loss": run["spawns"][0]["steps"][0]["loss"],
                     "setup_s": statistics.median(s["setup_s"] for s in run["spawns"]), **summarise(measured)})
    check = loss_check(results, a.workloads)
    # The spawns import the working tree as it is when they start: a commit during the run is recorded.
    report = {"commit": commit, "commit_at_end": git_commit(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
              "wall_s": time.time() - started, "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
              "load_average": {"start": load_start, "end": load_average(),
                               "1min_after_each_spawn": {"min": min(loads), "max": max(loads),
                                                         "mean": statistics.mean(loads)}},
              "settings": {"steps": a.steps, "warmup": a.warmup, "repeats": a.repeats, "threads": a.threads,
                           "configs": a.configs, "workloads": a.workloads, "demo": DEMO},
              "workload_tokens": sizes, "rows": rows, "loss_check": check,
              "runs": [{"config": c, "workload": w, **run} for (c, w), run in results.items()]}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(report, indent=1) + "\n")

    print()
    print(markdown(report))
    print()
    for workload, c in check.items():
        verdict = "agree" if c["agree"] else "DISAGREE"
        print(f"step-0 check ({workload}): loss and grad norm of every spawn {verdict} with {c['reference']} "
              f"(loss {c['reference_loss']:.6f}) within rel {LOSS_REL_TOL:g}: largest relative difference "
              f"{c['max_rel_diff']:.1e}")
    la = report["load_average"]
    if report["commit_at_end"] != commit:
        print(f"WARNING: the working tree changed during the run ({commit} -> {report['commit_at_end']})")
    print(f"commit {report['commit']}, {report['wall_s']:.0f} s, load average (1 min) {la['start'][0]:.2f} at start, "
          f"{la['1min_after_each_spawn']['min']:.2f}-{la['1min_after_each_spawn']['max']:.2f} after the spawns, "
          f"{os.cpu_count()} CPUs; JSON: {a.json}")
    return 0 if all(c["agree"] for c in check.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
