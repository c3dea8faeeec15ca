"""Real SGLang against this project's hf_engine on this CPU, side by side in one run: start time, memory, rollout
tokens/s, OPD step time, and whether a seeded request repeats.

Both engines serve the same tiny checkpoint (by default the demo's shape: Qwen3 hidden 64, 2 layers, fp32) and are
started by the runtime's own launcher (``--rollout-backend hf_engine`` / ``sglang --sglang-python``), SGLang with its
CPU settings. Per engine:

* **start**: seconds from the launch to the first ``/health_generate`` 200 (both servers start at once, so each
  is timed on a machine loaded by the other's start too; the order alternates with ``--repeats``);
* **memory**: RSS and PSS summed over the server's processes (SGLang runs three), once healthy and after the load;
* **tokens/s**: new tokens per second, 1 client and ``--clients`` concurrent clients, each generating
  ``--new-tokens`` sampled tokens (temperature 1, ``ignore_eos``) after a ``--prompt-len`` prompt;
* **seed repeats**: the same request with the same ``sampling_seed`` twice in a row, equal or not; then the server
  started with ``--enable-deterministic-inference`` (the runtime's ``--sglang-enable-deterministic-inference``),
  or what refuses it;
* **OPD step**: train.py, ``--steps`` steps of the tiny multi-turn OPD (gridnav, 8 episodes a step, server teacher
  on the same backend), the median ``time/step`` and ``time/rollout`` of the steps after the first, and the whole
  run's wall time (engines' start included).

    python benchmarks/sglang_vs_hf_engine.py [--sglang-python PY] [--clients 8] [--steps 4] [--out results.json]

``--sglang-python`` defaults to the environment ``python -m slime.backends.sglang_utils.sglang_env`` builds (built
if missing). Results: docs/en/engines.md ("Real SGLang on a CPU").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slime.backends.sglang_utils import sglang_env  # noqa: E402
from slime.backends.sglang_utils.launcher import EngineLaunchError, EngineProcess, build_engine_command, find_free_port  # noqa: E402,E501
from slime.backends.sglang_utils.processes import _process_tree  # noqa: E402
from slime.utils import http_utils  # noqa: E402
from slime.utils.arguments import get_parser  # noqa: E402
from slime.utils.tiny_models import save_tiny_checkpoint  # noqa: E402

BACKENDS = ("hf_engine", "sglang")


def engine_args(backend, python, *extra):
    return get_parser().parse_args(["--rollout-backend", backend, "--sglang-python", python, "--seed", "0", *extra])


def memory_mb(pid: int) -> dict:
    rss = pss = 0
    for p in _process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            continue
    return {"rss_mb": round(rss / 1024), "pss_mb": round(pss / 1024)}


def start(backend, python, model, log_dir, *extra):
    port = find_free_port()
    cmd = build_engine_command(engine_args(backend, python, *extra), model_path=model, host="127.0.0.1", port=port)
    return EngineProcess(cmd, host="127.0.0.1", port=port, log_path=Path(log_dir) / f"{backend}_{port}.log")


def run(coro):
    async def wrapped():
        try:
            return await coro
        finally:
            await http_utils.close_session()

    return asyncio.run(wrapped())


async def generate(url, prompt, new_tokens, seed=None):
    params = {"temperature": 1.0, "max_new_tokens": new_tokens, "ignore_eos": True}
    if seed is not None:
        params["sampling_seed"] = seed
    reply = await http_utils.post(f"{url}/generate", {"input_ids": prompt, "sampling_params": params}, max_retries=1)
    return reply["output_ids"]


def tokens_per_s(url, clients, prompt_len, new_tokens):
    prompts = [[3 + (7 * c + i) % 90 for i in range(prompt_len)] for c in range(clients)]

    async def all_at_once():
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(generate(url, p, new_tokens) for p in prompts))
        return sum(map(len, outs)) / (time.perf_counter() - t0)

    run(generate(url, prompts[0], 4))  # warm
    return run(all_at_once())


def seed_repeats(url):
    prompt = list(range(5, 37))
    a = run(generate(url, prompt, 24, seed=11))
    b = run(generate(url, prompt, 24, seed=11))
    return a == b


def engine_figures(python, model, log_dir, clients, prompt_len, new_tokens, order):
    out = {b: {} for b in BACKENDS}
    t0 = time.monotonic()
    engines = {b: start(b, python, model, log_dir) for b in order}
    try:
        pending = dict(engines)
        while pending:
            for b, e in list(pending.items()):
                if e.process.poll() is not None:
                    raise EngineLaunchError(f"{b} exited before it was healthy:\n{e.log_tail()}")
                try:
                    with urllib.request.urlopen(f"{e.url}/health_generate", timeout=5) as reply:
                        if reply.status == 200:
                            out[b]["start_s"] = round(time.monotonic() - t0, 1)
                            del pending[b]
                except OSError:
                    pass
            time.sleep(0.25)
        for b, e in engines.items():
            out[b].update({f"idle_{k}": v for k, v in memory_mb(e.process.pid).items()})
        for b, e in engines.items():  # one engine at a time: the other one idles
            out[b]["tok_s_1"] = round(tokens_per_s(e.url, 1, prompt_len, new_tokens))
            out[b][f"tok_s_{clients}"] = round(tokens_per_s(e.url, clients, prompt_len, new_tokens))
            out[b].update({f"loaded_{k}": v for k, v in memory_mb(e.process.pid).items()})
            out[b]["seed_repeats"] = seed_repeats(e.url)
    finally:
        for e in engines.values():
            e.stop()
    return out


def deterministic(python, model, log_dir):
    """Each engine with --enable-deterministic-inference: does the same seed repeat, or is the flag refused?"""
    out = {}
    for b in BACKENDS:
        try:
            e = start(b, python, model, log_dir, "--sglang-enable-deterministic-inference")
        except EngineLaunchError as err:
            out[b] = f"refused by the launcher: {str(err).split(':', 2)[1].strip()[:60]}..."
            continue
        try:
            e.wait_healthy(600)
            out[b] = "repeats" if seed_repeats(e.url) else "differs"
        except EngineLaunchError as err:
            out[b] = f"server refused: {str(err)[-200:]}"
        finally:
            e.stop()
    return out


def opd_steps(backend, python, root, steps):
    import subprocess

    from examples.agent_envs.make_data import task_rows

    data = root / "tasks.jsonl"
    if not data.exists():
        rows = task_rows("gridnav", 32, 0, {"size": 5, "walls": 0.0}, min_len=3, max_len=6)
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    teacher = start(backend, python, str(root / "teacher"), root / "logs")
    try:
        teacher.wait_healthy(600)
        out = root / f"opd_{backend}"
        argv = [sys.executable, "train.py", "--hf-checkpoint", str(root / "student"), "--prompt-data", str(data),
                "--rollout-batch-size", "8", "--n-samples-per-prompt", "1", "--num-rollout", str(steps),
                "--rollout-max-response-len", "240", "--max-turn-response-len", "8", "--max-turns", "6",
                "--rollout-interaction-env-path", "examples.agent_envs",
                "--custom-generate-function-path", "examples.multi_turn_tcod.rollout.generate",
                "--rollout-temperature", "1.0", "--lr", "1e-3", "--metrics-dir", str(out), "--rollout-seed", "0",
                "--use-opd", "--opd-type", "sglang", "--rm-url", teacher.url + "/generate",
                "--custom-rm-path", "slime.rollout.on_policy_distillation.reward_func",
                "--custom-reward-post-process-path", "slime.rollout.on_policy_distillation.post_process_rewards",
                "--rollout-backend", backend, "--sglang-python", python]
        t0 = time.monotonic()
        proc = subprocess.run(argv, cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"train.py on {backend} failed:\n{proc.stderr[-3000:]}")
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
        later = [r for r in rows if r.get("step", 0) >= 1]
        return {"opd_step_s": round(statistics.median(r["time/step"] for r in later), 2),
                "opd_rollout_s": round(statistics.median(r["time/rollout"] for r in later), 2),
                "opd_run_wall_s": round(wall),
                "logprob_gap_max": max(r.get("train/train_rollout_logprob_abs_diff", float("nan")) for r in rows)}
    finally:
        teacher.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sglang-python", default=None)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=160)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=1, help="engine figures measured this many times (best kept)")
    ap.add_argument("--out", type=Path, default=None, help="also write the results here (JSON)")
    a = ap.parse_args(argv)
    python = a.sglang_python or str(sglang_env.build())
    root = Path(tempfile.mkdtemp(prefix="sglang_vs_hf_"))
    shape = dict(hidden_size=64, num_layers=2, num_heads=4)
    save_tiny_checkpoint(root / "student", seed=0, **shape)
    save_tiny_checkpoint(root / "teacher", seed=1, **shape)
    results = {"machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start",
               "engines": {b: {} for b in BACKENDS}}
    for r in range(a.repeats):
        order = BACKENDS if r % 2 == 0 else BACKENDS[::-1]
        figures = engine_figures(python, str(root / "student"), root / "logs", a.clients, a.prompt_len,
                                 a.new_tokens, order)
        for b in BACKENDS:
            for k, v in figures[b].items():
                best = results["engines"][b].get(k)
                better = (min if k.startswith(("start", "idle", "loaded")) else max)
                results["engines"][b][k] = v if best is None or isinstance(v, bool) else better(best, v)
    for b, verdict in deterministic(python, str(root / "student"), root / "logs").items():
        results["engines"][b]["deterministic_inference"] = verdict
    report(results, a.out)  # the engines' figures now: the OPD runs take longest
    for b in BACKENDS:
        results["engines"][b].update(opd_steps(b, python, root, a.steps))
        report(results, a.out)
    results["load_average_end"] = round(os.getloadavg()[0], 1)
    report(results, a.out)
    return 0


def report(results, out) -> None:
    text = json.dumps(results, indent=2)
    print(text, flush=True)
    if out:
        out.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
