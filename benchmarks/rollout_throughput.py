"""Multi-turn rollout throughput: the agent loop against the engine's raw generation rate, same model.

Two hf_engine processes serve the same model, one with its prefix cache (the default) and one with
``--disable-radix-cache``. The agent and replay sides run on both; the cache is flushed before every
timed run so no run reuses an earlier repeat's identical requests. Sides, alternated within every
repeat (best time of each is kept):

* agent: ``examples.multi_turn_tcod.rollout.generate`` plays ``--episodes`` gridnav episodes concurrently
  (the CPU demo's task: 6x6, no walls, expert length 4..10, ``--max-turns 10``, 8 tokens per turn).
* replay: the agent's own turn requests, re-sent without the environment: per episode one request per
  turn, in order (input = the recorded history before the turn, as many new tokens as the turn had),
  episodes concurrent. Agent minus replay = env steps, observation tokenization, loop bookkeeping.
* raw: one plain /generate per episode, concurrent: the episode's prompt, as many new tokens as the
  episode generated in all turns (``ignore_eos``), on the engine without cache. Replay minus raw =
  per-turn round trips and, without the cache, re-prefilling the history every turn.

It also times env.step and observation tokenization in-process on the recorded actions.

    python benchmarks/rollout_throughput.py [--episodes 16] [--repeats 3] [--plot PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from argparse import Namespace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.agent_envs import build_env  # noqa: E402
from examples.agent_envs.make_data import task_rows  # noqa: E402
from slime.backends.sglang_utils.launcher import launch_engine  # noqa: E402
from slime.backends.sglang_utils.router import host_port  # noqa: E402
from examples.multi_turn_tcod import rollout as multi_turn  # noqa: E402
from examples.multi_turn_tcod.chat_layout import encode_observation, turn_stop_id  # noqa: E402
from slime.rollout.sglang_rollout import build_sampling_params, run_async  # noqa: E402
from slime.utils import http_utils  # noqa: E402
from slime.utils.tiny_models import build_tokenizer, save_tiny_checkpoint  # noqa: E402
from slime.utils.types import Sample  # noqa: E402


def make_tasks(n):
    rows = task_rows("gridnav", n, 0, {"size": 6, "walls": 0.0}, 4, 10)
    return [row["metadata"] for row in rows]


def play(args, samples: list[Sample]) -> list[Sample]:
    """All episodes concurrently through the agent loop, as the rollout function runs them."""
    params = build_sampling_params(args)

    async def go():
        return await asyncio.gather(*(multi_turn.generate(args, s, dict(params)) for s in samples))

    return run_async(go())


def run_agent(args, tasks):
    return play(args, [Sample(index=i, metadata=dict(md)) for i, md in enumerate(tasks)])


def turn_requests(s: Sample):
    prompt = len(s.tokens) - s.response_length
    for a, b in s.metadata["turn_spans"]:
        yield s.tokens[: prompt + a], b - a


def run_replay(url, episodes, temperature):
    async def one(s):
        for ids, new in turn_requests(s):
            await http_utils.post(url, {"input_ids": ids, "return_logprob": True, "sampling_params": {
                "max_new_tokens": new, "temperature": temperature, "ignore_eos": True}}, max_retries=1)

    async def go():
        await asyncio.gather(*(one(s) for s in episodes))

    run_async(go())


def run_raw(url, episodes, temperature):
    async def go():
        outs = await asyncio.gather(*(http_utils.post(url, {
            "input_ids": s.tokens[: len(s.tokens) - s.response_length], "return_logprob": True,
            "sampling_params": {"max_new_tokens": generated(s), "temperature": temperature, "ignore_eos": True}},
            max_retries=1) for s in episodes))
        assert all(len(o["output_ids"]) == generated(s) for o, s in zip(outs, episodes))

    run_async(go())


def flush(engine_url):
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{engine_url}/flush_cache", method="POST"), timeout=60).read()


def cache_stats(engine_url) -> dict:
    import json
    import urllib.request

    with urllib.request.urlopen(f"{engine_url}/get_server_info", timeout=60) as reply:
        return json.loads(reply.read())["prefix_cache"]


def generated(s: Sample) -> int:
    return sum(s.loss_mask)


def env_and_tokenize_cost(episodes, tok):
    """Seconds spent in env.step and in encode_observation over all recorded turns (in-process)."""
    env_s = tok_s = 0.0
    stop = turn_stop_id(tok)
    for s in episodes:
        env = build_env(s, None)
        env.reset()
        prompt = len(s.tokens) - s.response_length
        for a, b in s.metadata["turn_spans"]:
            # The text the agent loop hands to env.step: the turn's ids without its stop token.
            action = tok.decode([i for i in s.tokens[prompt + a: prompt + b] if i != stop])
            t0 = time.perf_counter()
            observation, done, _ = env.step(action)
            t1 = time.perf_counter()
            encode_observation(tok, env.format_observation(observation))
            env_s, tok_s = env_s + t1 - t0, tok_s + time.perf_counter() - t1
            if done:
                break
        env.close()
    return env_s, tok_s


def plot(rates, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rates)
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    bars = ax.bar([n.replace(", ", "\n") for n in names], [rates[n] for n in names],
                  color=[f"C{i}" for i in range(len(names))])
    ax.bar_label(bars, fmt="%.0f")
    ax.set_ylabel("generated tokens / s")
    ax.set_title("Multi-turn rollout vs raw engine generation")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=16, help="concurrent episodes (and raw requests)")
    p.add_argument("--max-turns", type=int, default=10)
    p.add_argument("--turn-tokens", type=int, default=8, help="--max-turn-response-len")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hidden-size", type=int, default=64, help="64 x 2 layers is the CPU demo's model")
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="engine torch threads; 1 is steadier on a busy machine")
    p.add_argument("--plot", default=None)
    a = p.parse_args(argv)

    from slime.utils.arguments import get_parser, validate_args

    tok = build_tokenizer()
    workdir = Path(tempfile.mkdtemp(prefix="rollout_bench_"))
    ckpt = str(save_tiny_checkpoint(workdir / "model", hidden_size=a.hidden_size, num_layers=a.num_layers,
                                    num_heads=4))
    engines = {}
    for name, disable in (("cache", False), ("no cache", True)):
        engines[name] = launch_engine(
            Namespace(rollout_backend="hf_engine", engine_host="127.0.0.1", seed=0, rollout_concurrency=a.episodes,
                      hf_checkpoint=ckpt, sglang_disable_radix_cache=disable),
            log_dir=workdir / "logs", timeout=300, env=dict(os.environ, OMP_NUM_THREADS=str(a.threads)))
    args = get_parser().parse_args([
        "--hf-checkpoint", ckpt, "--max-turns", str(a.max_turns), "--max-turn-response-len", str(a.turn_tokens),
        "--rollout-max-response-len", "480", "--rollout-interaction-env-path",
        "examples.agent_envs", "--rollout-seed", "0"])
    validate_args(args)
    temperature = args.rollout_temperature
    tasks = make_tasks(a.episodes)
    cached, plain = engines["cache"].url, engines["no cache"].url

    def agent_on(engine_url):
        def run():
            # The agent loop reaches its engine through upstream's router flags, here the engine itself.
            args.sglang_router_ip, args.sglang_router_port = host_port(engine_url)
            return run_agent(args, tasks)
        return run

    try:
        episodes = agent_on(plain)()  # warm-up; also fixes the turn lengths the other sides copy
        sides = {"agent, cache": agent_on(cached), "agent, no cache": agent_on(plain),
                 "replay, cache": lambda: run_replay(f"{cached}/generate", episodes, temperature),
                 "replay, no cache": lambda: run_replay(f"{plain}/generate", episodes, temperature),
                 "raw": lambda: run_raw(f"{plain}/generate", episodes, temperature)}
        best = {name: float("inf") for name in sides}
        reuse = None
        for _ in range(a.repeats):  # alternate the sides so drifting load hits all alike
            for name, fn in sides.items():
                flush(cached)
                before = cache_stats(cached)
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t0)
                if name == "agent, cache":
                    after = cache_stats(cached)
                    reuse = {k: after[k] - before[k] for k in ("reused_tokens", "looked_up_tokens", "hits", "lookups")}
    finally:
        run_async(http_utils.close_session())
        for engine in engines.values():
            engine.stop()

    n = len(episodes)
    gen = sum(generated(s) for s in episodes)
    turns = sum(s.metadata["num_turns"] for s in episodes)
    prefill_turns = sum(len(ids) for s in episodes for ids, _ in turn_requests(s))
    prefill_raw = sum(len(s.tokens) - s.response_length for s in episodes)
    env_s, tok_s = env_and_tokenize_cost(episodes, tok)
    rates = {name: gen / t for name, t in best.items()}
    print(f"model: tiny Qwen3 hidden {a.hidden_size}, {a.num_layers} layers, fp32, engine threads {a.threads}; "
          f"{n} concurrent gridnav episodes, {turns / n:.1f} turns and {gen / n:.0f} generated tokens each; "
          f"best of {a.repeats} alternated repeats; load {os.getloadavg()}")
    print(f"prefill tokens per episode: per-turn requests {prefill_turns / n:.0f}, one raw request {prefill_raw / n:.0f}")
    print(f"in-process cost per turn: env.step {1e6 * env_s / turns:.0f} us, observation tokenization "
          f"{1e6 * tok_s / turns:.0f} us")
    print("| side | wall (s) | episodes/s | generated tok/s | / raw |")
    print("|---|---|---|---|---|")
    for name, t in best.items():
        print(f"| {name} | {t:.3f} | {n / t:.2f} | {gen / t:.0f} | {best['raw'] / t:.2f} |")
    print(f"agent / raw: {best['raw'] / best['agent, cache']:.2f} with the prefix cache, "
          f"{best['raw'] / best['agent, no cache']:.2f} without; the cache speeds the agent up "
          f"{best['agent, no cache'] / best['agent, cache']:.2f}x and the replay "
          f"{best['replay, no cache'] / best['replay, cache']:.2f}x")
    print(f"agent with the cache: {reuse['hits']} of {reuse['lookups']} requests reused a prefix; "
          f"{reuse['reused_tokens']} of {reuse['looked_up_tokens']} input tokens "
          f"({reuse['reused_tokens'] / max(1, reuse['looked_up_tokens']):.0%}) came from the cache")
    if a.plot:
        plot(rates, a.plot)
        print(f"plot written to {a.plot}")


if __name__ == "__main__":
    main()
