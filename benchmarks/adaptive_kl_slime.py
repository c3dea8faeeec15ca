"""Does ``--kl-ctrl adaptive`` hold the KL on slime's own PPO? Fixed against adaptive, run by slime's train.py.

Each run is one invocation of ``SLIME_DIR/train.py`` (a slime tree with the KL PR ported), unmodified, through the
train_cpu harness (``tools/slime_pr/train_cpu_run.py``: its cached venv, its CPU shims, Megatron over gloo):
slime's PPO with slime's Megatron actor and critic (1 rank each), a frozen reference equal to the start policy,
slime's rollout and reward path (``--custom-rm-path``: ``benchmarks/adaptive_kl_slime_reward.py``), and one
external hf_engine student engine behind slime's sglang-router (``train_cpu_engines.start_engines``), synced from
the trainer with ``--update-weight-transport disk`` after every step. hf_engine, not SGLang: it starts in ~20 s
with 0.8 GB; what this benchmark measures is slime's trainer and critic, which run the same either way.

The task: 8 prompts x 8 samples a step, answers of up to 8 characters from a tiny Qwen3-shaped policy (a
character vocabulary of 100 tokens, 10 of them vowels), reward ``1 - |v - 0.5| / 0.5`` with ``v`` the answer's
vowel share. The KL-regularised optimum for a fixed ``beta`` is the reference reweighted by ``exp(r / beta)``;
``closed_form.json`` holds its per-token KL (the controller's unit) estimated from samples of the reference.

Phases (``--phase``):

* ``gate``: fixed ``beta`` over ``--betas`` x ``--seeds``.
* ``controller``: for each ``--targets`` value, its reference ``beta`` (``--ref-betas``, chosen from the gate),
  adaptive from ``beta / --start-factor`` and ``beta * --start-factor`` at ``--horizon-x`` times a step's samples
  on ``--seeds``, at ``--control-horizon-x`` on ``--control-seeds`` (the control), and the fixed reference ``beta``
  on ``--seeds`` (reused from the gate when it ran there with the same steps and learning rate).
* ``smallest`` (the default): one fixed and one adaptive run (from the same ``beta``, horizon 16x) of ``--steps``
  (default 3) steps, results under ``--work``, for a reviewer: it checks that the pipeline runs and that the
  coefficient moves (the verdict says when it does not), not that the controller holds the KL.

Every run appends a row to ``{results}/runs.jsonl`` (a row already there is not run again), then
``benchmarks/adaptive_kl_slime_report.py`` writes ``tables.md``, ``summary.json`` and the plot from the rows.

    MEGATRON_LM_DIR=/tmp/megatron-lm nice -n 10 .venv/bin/python benchmarks/adaptive_kl_slime.py SLIME_KL_DIR \\
        --phase gate --betas 0.15 0.2 0.3 --seeds 1 2 --steps 112 --lr 1e-2
    MEGATRON_LM_DIR=/tmp/megatron-lm nice -n 10 .venv/bin/python benchmarks/adaptive_kl_slime.py SLIME_KL_DIR \\
        --phase controller --targets 0.11 --ref-betas 0.2 --seeds 1 2 3 --control-seeds 1 --steps 112 --lr 1e-2

docs/en/advanced/adaptive-kl.md has what these gave, what was cut and why.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import adaptive_kl_slime_reward as task  # noqa: E402

PROMPTS = ["Write:", "Say it:", "Go:", "Answer:", "Type:", "Reply:", "Now:", "Next:"]
N_PER_PROMPT = 8
MODEL_SHAPE = {"hidden_size": 64, "num_layers": 2, "num_heads": 4}
MODEL_SEED = 0
DEFAULT_RESULTS = REPO / "benchmarks/results/adaptive_kl_slime"
REWARD_MODULE = "adaptive_kl_slime_reward"


# ------------------------------------------------------------------------------------------ the task
def write_task(root: Path) -> tuple[Path, Path]:
    """The start policy (also the reference and the critic's start) and the prompt file, made once."""
    from slime.utils.tiny_models import save_tiny_checkpoint

    root.mkdir(parents=True, exist_ok=True)
    model = root / "policy_hf"
    if not (model / "config.json").is_file():
        save_tiny_checkpoint(model, seed=MODEL_SEED, **MODEL_SHAPE)
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": [{"role": "user", "content": p}]}) + "\n" for p in PROMPTS))
    return model, data


def sample_reference(model_dir: Path, n_per_prompt: int, seed: int = 0) -> list[list[tuple[int, int]]]:
    """Per prompt, ``(vowel count, response tokens)`` of ``n_per_prompt`` answers sampled from the reference at
    temperature 1 (as the engines sample), up to ``task.ANSWER_CHARS`` tokens, stopping at the end token."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    gen = torch.Generator().manual_seed(seed)
    out = []
    for prompt in PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        rows: list[tuple[int, int]] = []
        for start in range(0, n_per_prompt, 4096):
            b = min(4096, n_per_prompt - start)
            seq = ids.repeat(b, 1)
            done = torch.zeros(b, dtype=torch.bool)
            lengths = torch.zeros(b, dtype=torch.long)
            past = None
            step_in = seq
            new = []
            with torch.no_grad():
                for _ in range(task.ANSWER_CHARS):
                    o = model(input_ids=step_in, past_key_values=past, use_cache=True)
                    past = o.past_key_values
                    probs = torch.softmax(o.logits[:, -1].float(), dim=-1)
                    nxt = torch.multinomial(probs, 1, generator=gen)
                    lengths += (~done).long()
                    new.append(nxt)
                    done |= nxt[:, 0] == tok.eos_token_id
                    step_in = nxt
            for row, length in zip(torch.cat(new, dim=1).tolist(), lengths.tolist()):
                text = tok.decode(row[:length], skip_special_tokens=False)
                rows.append((task.vowel_count(text), length))
        out.append(rows)
    return out


def closed_form(samples: list[list[tuple[int, int]]], beta: float) -> dict:
    """The optimum of E[r] - beta * KL for one fixed ``beta``, pi* = pi_ref * exp(r / beta) / Z per prompt,
    estimated on reference samples: its KL in the controller's unit (each answer's per-token mean of
    log pi*/pi_ref = (r / beta - ln Z) / length, averaged over answers, then over prompts) and its mean reward."""
    kls, rewards = [], []
    for rows in samples:
        r = [task.reward_of_count(k) for k, _ in rows]
        top = max(r)
        w = [math.exp((x - top) / beta) for x in r]  # exp(r / beta) up to a constant
        total = sum(w)
        log_z = top / beta + math.log(total / len(w))
        kls.append(sum(wi * (x / beta - log_z) / n for wi, x, (_, n) in zip(w, r, rows)) / total)
        rewards.append(sum(wi * x for wi, x in zip(w, r)) / total)
    return {"beta": beta, "kl": sum(kls) / len(kls), "reward": sum(rewards) / len(rewards)}


def ensure_closed_form(results: Path, model: Path, betas: list[float], n_per_prompt: int) -> dict:
    """``closed_form.json``: the reference answers' (vowel count, length) per prompt, sampled once, and the closed
    form at every ``beta`` asked so far (a new ``beta`` needs no new samples)."""
    path = results / "closed_form.json"
    cached = json.loads(path.read_text()) if path.is_file() else {}
    if cached.get("n_per_prompt") != n_per_prompt or "samples" not in cached:
        samples = sample_reference(model, n_per_prompt)
        betas = [*betas, *(float(b) for b in cached.get("rows", {}))]  # the same seed: the same samples
        cached = {"n_per_prompt": n_per_prompt, "rows": {},
                  "vowel_count_histogram": [sum(1 for rows in samples for k, _ in rows if k == c)
                                            for c in range(task.ANSWER_CHARS + 1)],
                  # per prompt: [vowel count, length, how many]
                  "samples": [[[k, n, rows.count((k, n))] for k, n in sorted(set(rows))] for rows in samples]}
    missing = [b for b in betas if f"{b:g}" not in cached["rows"]]
    if missing or not path.is_file():
        samples = [[(k, n) for k, n, c in prompt for _ in range(c)] for prompt in cached["samples"]]
        for b in missing:
            cached["rows"][f"{b:g}"] = closed_form(samples, b)
        results.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cached, indent=1) + "\n")
    return cached


# ------------------------------------------------------------------------------------------ one run
def run_key(cfg: dict) -> str:
    ctrl = "fixed" if cfg["ctrl"] == "fixed" else f"adaptive-t{cfg['target']:g}-h{cfg['horizon']:g}"
    return f"{ctrl}-b{cfg['beta']:g}-s{cfg['seed']}-n{cfg['steps']}-lr{cfg['lr']:g}"


def train_flags(cfg: dict, model: Path, data: Path, out: Path, engine_flags: list[str]) -> list[str]:
    from tools.slime_pr.train_cpu_run import CPU_FLAGS, hf_model_flags

    roles = out / "megatron_roles.yaml"
    # slime turns --offload-train on for PPO, and with it buffers allocated through torch_memory_saver (CUDA only):
    # off for the actor and the critic through slime's own role overrides, as train_cpu's kl-adaptive case does.
    no_offload = "".join(f"      {k}: false\n" for k in ("offload_train", "disable_grad_buffers_cpu_backup",
                                                            "disable_param_buffers_cpu_backup"))
    roles.write_text("megatron:\n" + "".join(f"  - name: default\n    role: {role}\n    overrides:\n" + no_offload
                                             for role in ("critic", "actor")))
    batch = len(PROMPTS) * N_PER_PROMPT
    flags = [*hf_model_flags(model), *CPU_FLAGS,
             "--hf-checkpoint", str(model), "--load", str(model), "--ref-load", str(model),
             "--megatron-config-path", str(roles),
             "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
             "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1",
             "--prompt-data", str(data), "--input-key", "input", "--apply-chat-template",
             "--num-rollout", str(cfg["steps"]), "--rollout-batch-size", str(len(PROMPTS)),
             "--n-samples-per-prompt", str(N_PER_PROMPT), "--global-batch-size", str(batch),
             "--micro-batch-size", str(batch), "--seq-length", "256", "--rollout-max-prompt-len", "200",
             "--rollout-max-response-len", str(task.ANSWER_CHARS), "--rollout-temperature", "1.0",
             "--custom-rm-path", f"{REWARD_MODULE}.reward",
             "--advantage-estimator", "ppo", "--gamma", "1", "--lambd", "1", "--kl-loss-type", "k1",
             "--kl-coef", f"{cfg['beta']:g}",
             "--optimizer", "adam", "--lr", f"{cfg['lr']:g}", "--lr-decay-style", "constant",
             "--weight-decay", "0.0", "--adam-beta1", "0.9", "--adam-beta2", "0.98",
             "--seed", str(cfg["seed"]), "--rollout-seed", str(cfg["seed"]),
             "--eps-clip", "0.2", "--entropy-coef", "0.0",
             *engine_flags,
             "--update-weight-transport", "disk", "--update-weight-disk-dir", str(out / "weight_sync"),
             "--save-debug-rollout-data", str(out / "rollout" / "{rollout_id}.pt")]
    if cfg["ctrl"] == "adaptive":
        flags += ["--kl-ctrl", "adaptive", "--kl-target", f"{cfg['target']:g}", "--kl-horizon", f"{cfg['horizon']:g}"]
    return flags


def _start_engine(model: Path, log_dir: Path):
    from tools.slime_pr import train_cpu_engines as engines

    # Its start limit (a number, or one per engine kind) ran out at a load of 150-350 and lost a run.
    limit = engines.START_TIMEOUT_S
    engines.START_TIMEOUT_S = {k: max(v, 900) for k, v in limit.items()} if isinstance(limit, dict) else max(limit, 900)
    kwargs = {"students": 1}
    if "engine" in inspect.signature(engines.start_engines).parameters:
        kwargs["engine"] = "hf_engine"
    return engines.start_engines(model, None, log_dir, **kwargs)


def sample_kl(rec: dict) -> list[float]:
    """Each sample's masked per-token mean KL (the controller's unit), samples without a trained token left out."""
    out = []
    for s in rec["samples"]:
        n = sum(s["mask"])
        if n > 0:
            out.append(sum(k * m for k, m in zip(s["kl"], s["mask"])) / n)
    return out


def read_run(trace: Path, rollout_dir: Path) -> list[dict]:
    """Per step: the observed KL, the coefficient the rewards were shaped with (fitted from the returns), the
    controller's own before/after values (adaptive), the mean reward, and the largest share of one answer."""
    import torch

    from tools.slime_pr.train_cpu_kl import fitted_coef

    advantages, steps = [], []
    for f in sorted(trace.glob("rank*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            # The critic's records carry its kl_coef, which slime's role override sets to 0.
            if rec["event"] == "advantages" and rec["args_kl_coef"] != 0:
                advantages.append(rec)
            elif rec["event"] == "step":
                steps.append(rec)
    advantages.sort(key=lambda r: r["call"])
    rows = []
    for i, adv in enumerate(advantages):
        kls = sample_kl(adv)
        row = {"step": i, "kl": sum(kls) / len(kls), "beta_fit": fitted_coef(adv["samples"])}
        if i < len(steps):
            row.update(beta_ctrl=steps[i]["before"], beta_next=steps[i]["after"], ctrl_kl=steps[i]["observed_kl"])
        dump = rollout_dir / f"{i}.pt"
        if dump.is_file():
            samples = torch.load(dump, weights_only=False)["samples"]
            answers = [s["response"] for s in samples]
            row["reward"] = sum(float(s["reward"]) for s in samples) / len(samples)
            row["vowels"] = sum(task.vowel_count(a) for a in answers) / len(answers)
            row["mode_share"] = max(answers.count(a) for a in set(answers)) / len(answers)
        rows.append(row)
    return rows


def run_one(cfg: dict, slime_dir: Path, work: Path, model: Path, data: Path, base_env: dict) -> dict:
    from tools.slime_pr.train_cpu_run import Run, run_train

    key = run_key(cfg)
    out = work / key
    if out.exists():
        shutil.rmtree(out)
    (out / "rm").mkdir(parents=True)
    shutil.copy(Path(__file__).with_name(f"{REWARD_MODULE}.py"), out / "rm" / f"{REWARD_MODULE}.py")
    # Ray's memory monitor kills the run's own workers when the node passes 95%: on a shared machine others' jobs
    # put it there, and 3 of this benchmark's runs died so; 0.98 still yields before the machine is out of memory.
    env = dict(base_env, TRAIN_CPU_KL_TRACE=str(out / "trace"), RAY_memory_usage_threshold="0.98",
               PYTHONPATH=os.pathsep.join([base_env["PYTHONPATH"], str(out / "rm")]))
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    with _start_engine(model, out / "engine_logs") as eng:
        from tools.slime_pr.train_cpu_engines import rollout_flags

        flags = train_flags(cfg, model, data, out, rollout_flags(eng))
        run = run_train(SimpleNamespace(slime_dir=slime_dir, out=out), env, Run(key, flags, out / "train.log"), 1)
    steps = read_run(out / "trace", out / "rollout")
    row = {**cfg, "key": key, "rc": run.rc, "seconds": round(time.monotonic() - t0, 1),
           "train_seconds": round(run.seconds, 1), "load_start": round(load0, 2),
           "load_end": round(os.getloadavg()[0], 2), "steps_done": len(steps), "per_step": steps,
           "log": str(run.log)}
    if run.rc != 0 or len(steps) < cfg["steps"]:
        tail = run.text().splitlines()[-30:]
        row["error_tail"] = tail
    return row


# ------------------------------------------------------------------------------------------ the plan
def plan(a) -> list[dict]:
    base = {"steps": a.steps, "lr": a.lr}
    jobs = []
    if a.phase == "gate":
        for beta in a.betas:
            for seed in a.seeds:
                jobs.append({**base, "phase": "gate", "ctrl": "fixed", "beta": beta, "seed": seed})
    elif a.phase == "controller":
        batch = len(PROMPTS) * N_PER_PROMPT
        if len(a.ref_betas) != len(a.targets):
            raise SystemExit("--ref-betas needs one beta per --targets value")
        for target, ref in zip(a.targets, a.ref_betas):
            for seed in a.seeds:
                jobs.append({**base, "phase": "controller", "ctrl": "fixed", "beta": ref, "seed": seed,
                             "target": target})
                for beta in (ref / a.start_factor, ref * a.start_factor):
                    jobs.append({**base, "phase": "controller", "ctrl": "adaptive", "beta": round(beta, 6),
                                 "seed": seed, "target": target, "horizon": a.horizon_x * batch, "ref_beta": ref})
            for seed in a.control_seeds:
                for beta in (ref / a.start_factor, ref * a.start_factor):
                    jobs.append({**base, "phase": "control", "ctrl": "adaptive", "beta": round(beta, 6),
                                 "seed": seed, "target": target, "horizon": a.control_horizon_x * batch,
                                 "ref_beta": ref})
    else:  # smallest: one gate row and one controller row, scored as the full benchmark scores them
        jobs = [{**base, "phase": "gate", "ctrl": "fixed", "beta": a.betas[0], "seed": a.seeds[0]},
                {**base, "phase": "controller", "ctrl": "adaptive", "beta": a.betas[0], "seed": a.seeds[0],
                 "target": a.targets[0], "horizon": a.horizon_x * len(PROMPTS) * N_PER_PROMPT,
                 "ref_beta": a.betas[0]}]
    if a.only:
        jobs = [j for j in jobs if j["ctrl"] == a.only]
    if a.side:  # adaptive runs from one side of the reference only (to schedule them on a busy machine)
        jobs = [j for j in jobs if j["ctrl"] != "adaptive" or (j["beta"] > j["ref_beta"]) == (a.side == "above")]
    return jobs


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("slime_dir", type=Path, help="a slime tree with the KL PR ported (only read)")
    p.add_argument("--phase", choices=("gate", "controller", "smallest"), default="smallest")
    p.add_argument("--betas", type=float, nargs="+", default=[0.2])
    p.add_argument("--targets", type=float, nargs="+", default=[0.1])
    p.add_argument("--ref-betas", type=float, nargs="+", default=[])
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--control-seeds", type=int, nargs="*", default=[1])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--start-factor", type=float, default=2.0)
    p.add_argument("--horizon-x", type=float, default=16.0, help="horizon in multiples of a step's 64 samples")
    p.add_argument("--control-horizon-x", type=float, default=4.0)
    p.add_argument("--reference-samples", type=int, default=None, help="reference answers per prompt for the "
                   "closed form (default 4096; smallest: 256)")
    p.add_argument("--results", type=Path, default=None, help=f"default {DEFAULT_RESULTS} (smallest: WORK/results)")
    p.add_argument("--work", type=Path, default=Path("/tmp/adaptive_kl_slime"), help="run folders (logs, dumps)")
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument("--no-report", action="store_true")
    p.add_argument("--workers", type=int, default=1, help="train.py runs at a time")
    p.add_argument("--only", choices=("fixed", "adaptive"), default=None, help="run only these rows of the phase")
    p.add_argument("--side", choices=("below", "above"), default=None, help="adaptive runs from this start only")
    p.add_argument("--run-timeout", type=int, default=5400, help="seconds one train.py run may take (train_cpu's "
                   "default of 900 is for its short cases)")
    a = p.parse_args(argv)
    a.slime_dir = a.slime_dir.resolve()
    if not (a.slime_dir / "slime/utils/kl_controller.py").is_file():
        p.error(f"{a.slime_dir} does not hold the KL PR: `cp -a SLIME {a.slime_dir}` and "
                f"`python tools/slime_pr/port.py --pr adaptive-kl {a.slime_dir}` first")
    if a.results is None:
        a.results = a.work / "results" if a.phase == "smallest" else DEFAULT_RESULTS
    if a.reference_samples is None:
        a.reference_samples = 256 if a.phase == "smallest" else 4096
    return a


def main(argv=None) -> int:
    from tools.slime_pr import train_cpu_run
    from tools.slime_pr.train_cpu_run import harness_env, say

    a = parse_args(argv)
    train_cpu_run.RUN_TIMEOUT = a.run_timeout  # run_train reads it at each heartbeat
    a.work.mkdir(parents=True, exist_ok=True)
    a.results.mkdir(parents=True, exist_ok=True)
    model, data = write_task(a.work / "task")
    betas = sorted(set(a.betas) | set(a.ref_betas))
    jobs = plan(a)
    betas = sorted(set(betas) | {j["beta"] for j in jobs})
    # The closed form (reference samples, minutes on a busy CPU) is computed beside the runs; the report needs it.
    closed = threading.Thread(target=ensure_closed_form, args=(a.results, model, betas, a.reference_samples))
    closed.start()
    runs_file = a.results / "runs.jsonl"
    done = {}
    if runs_file.is_file():
        for line in runs_file.read_text().splitlines():
            row = json.loads(line)
            if row.get("rc") == 0:
                done[row["key"]] = row
    env = harness_env(SimpleNamespace(slime_dir=a.slime_dir, out=a.work))
    todo = []
    for i, cfg in enumerate(jobs):
        key = run_key(cfg)
        if key in done:
            say(f"[{i + 1}/{len(jobs)}] {key}: in {runs_file} already")
        else:
            todo.append(cfg)
    lock = threading.Lock()

    def one(cfg: dict) -> None:
        say(f"start {run_key(cfg)}")
        try:
            row = run_one(cfg, a.slime_dir, a.work, model, data, env)
        except Exception as exc:  # the engine did not start, ...: a row that says so, and the next run
            row = {**cfg, "key": run_key(cfg), "rc": None, "error": f"{type(exc).__name__}: {exc}"[:2000],
                   "steps_done": 0, "per_step": [], "seconds": None, "load_start": None}
        with lock, open(runs_file, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        last = row["per_step"][-1] if row["per_step"] else {}
        say(f"  {row['key']}: rc {row['rc']}, {row['steps_done']} steps, {row['seconds']}s (load "
            f"{row['load_start']}); last KL {last.get('kl', float('nan')):.4g}, beta {last.get('beta_fit')}"
            + (f"; {row['error']}" if row.get("error") else ""))

    with ThreadPoolExecutor(max_workers=a.workers) as pool:
        for future in [pool.submit(one, cfg) for cfg in todo]:
            future.result()
    closed.join()
    if a.no_report:
        return 0
    from benchmarks import adaptive_kl_slime_report as report

    argv_r = ["--results", str(a.results)] + (["--plot", str(a.plot)] if a.plot else [])
    return report.main(argv_r)


if __name__ == "__main__":
    raise SystemExit(main())
