"""Agent-loop overhead: turns/s of the multi-turn agent loop against single-turn requests/s, instant engine.

What it measures. An SGLang-protocol ``/generate`` server (aiohttp, in this process, on 127.0.0.1 and a
free port) answers every request at once with a scripted reply in SGLang's format (``text`` and
``meta_info`` with ``finish_reason`` and ``output_token_logprobs``). Against it, in one run, sides
interleaved, best of ``--repeats`` per side:

* agent: N gridnav episodes in flight through ``examples.multi_turn_tcod.rollout.generate`` (the real
  loop: the tokenizer from ``GenerateState``, ``build_env`` from ``rollout_interaction_env_path``, every
  environment call through ``asyncio.to_thread``, ``slime.utils.http_utils.post`` over loopback HTTP).
  Every reply is a Qwen3-style thinking turn, ``<think>\\nok\\n</think>\\n\\nright<|im_end|>``; the tasks'
  expert paths are at least 5 moves and ``max_turns`` is 4, so every episode plays exactly 4 turns.
  N lanes each play episodes one after the other (``--turns-per-run`` turns in all: 8 episodes a lane at
  N = 64, 2 at N = 256), so N episodes are in flight the whole run. Rate = student turns / wall time.
* single: N requests in flight through ``slime.rollout.sglang_rollout.generate`` (the runtime's
  upstream-style single-turn generate: tokenize the prompt, one ``post``, append the reply), same
  server, same reply, the same tasks' first prompts. The same N lanes each send 4 requests per task one
  after the other (a new sample each), so a run sends as many requests as the agent side plays turns,
  N at a time. Rate = requests / wall time.

The engine costs nothing, so both rates are the client's Python (plus the in-process server's, the same
per request on both sides). ``ratio = agent turns/s / single requests/s``: 1.0 means a turn of the agent
loop costs no more CPU than a single-turn request, i.e. the loop adds nothing an engine would have to
wait for; 0.5 means the loop spends as much again on its own work (environment step, observation
rendering and tokenization, bookkeeping) as the request itself. Each row also gives the process CPU
time per turn and per request (all threads) of the best run, which a busy machine disturbs less than
the wall time. Neither side keeps its samples after counting them.

The single side is this runtime's generate; upstream THUDM/slime's own ``sglang_rollout.generate`` (a
checkout in ``$SLIME_DIR``) needs its full argument set and SGLang installed, so it is not run here.

    python benchmarks/agent_loop_overhead.py [--in-flight 64 256] [--repeats 3] [--turns-per-run 2048] [--json OUT]
        [--profile OUT.prof]     # cProfile of one agent run at the first --in-flight value, top 25 printed

Nothing is downloaded: the tokenizer is ``slime.utils.tiny_models.build_tokenizer()`` with ``<think>`` and
``</think>`` added as non-special tokens (as Qwen3 has them), saved to a temporary folder that
``--hf-checkpoint`` points at.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import pstats
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiohttp import web  # noqa: E402
from tokenizers import AddedToken  # noqa: E402

from examples.multi_turn_tcod import rollout as agent_loop  # noqa: E402
from examples.agent_envs.make_data import task_rows  # noqa: E402
from slime.rollout import sample_hooks  # noqa: E402
from slime.rollout import sglang_rollout  # noqa: E402
from slime.utils import http_utils  # noqa: E402
from slime.utils.tiny_models import build_tokenizer  # noqa: E402
from slime.utils.types import Sample  # noqa: E402

REPLY = "<think>\nok\n</think>\n\nright<|im_end|>"
TURNS = 4


def make_tokenizer_dir(root: str) -> str:
    tok = build_tokenizer()
    tok.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    tok.save_pretrained(root)
    return root


class ScriptedEngine:
    """``/generate`` in SGLang's format, answered at once; the reply is cut at ``max_new_tokens``."""

    def __init__(self, reply_ids: list[int]):
        self.reply_ids = reply_ids
        self.requests = 0

    async def generate(self, request: web.Request) -> web.Response:
        payload = await request.json()
        self.requests += 1
        limit = int(payload["sampling_params"].get("max_new_tokens", len(self.reply_ids)))
        ids = self.reply_ids[:limit]
        meta = {
            "id": str(self.requests),
            "finish_reason": {"type": "stop" if len(ids) == len(self.reply_ids) else "length"},
            "prompt_tokens": len(payload["input_ids"]),
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "output_token_logprobs": [[-0.5, i, None] for i in ids],
            "e2e_latency": 0.0,
        }
        return web.json_response({"text": REPLY, "meta_info": meta})


async def start_server(engine: ScriptedEngine):
    app = web.Application()
    app.router.add_post("/generate", engine.generate)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    site = web.SockSite(runner, sock)
    await site.start()
    return runner, port


def make_args(hf_checkpoint: str, port: int) -> argparse.Namespace:
    return argparse.Namespace(
        hf_checkpoint=hf_checkpoint,
        sglang_router_ip="127.0.0.1",
        sglang_router_port=port,
        max_turns=TURNS,
        max_turn_response_len=512,
        rollout_max_context_len=None,
        eval_max_context_len=None,
        rollout_interaction_env_path="examples.multi_turn_tcod.envs.gridnav",
        env_step_timeout=300,
        partial_rollout=False,
        apply_chat_template_kwargs={},
        use_opd=True,
        opd_type="sglang",
        use_tcod=False,
        use_rollout_routing_replay=False,
    )


def samples_for(rows: list[dict]) -> list[Sample]:
    return [
        Sample(index=i, prompt=row["input"], label=row["label"], metadata=dict(row["metadata"]))
        for i, row in enumerate(rows)
    ]


PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 4096, "skip_special_tokens": False,
          "no_stop_trim": True}


def lanes(rows: list[dict], n: int, turns_per_run: int) -> list[list[dict]]:
    """Tasks for ``n`` lanes (one episode in flight each), about ``turns_per_run`` turns in all."""
    per_lane = max(1, -(-turns_per_run // (TURNS * n)))
    return [[rows[(k * n + i) % len(rows)] for k in range(per_lane)] for i in range(n)]


async def run_agent(args, plan: list[list[dict]]) -> tuple[float, int]:
    """Each lane plays its episodes one after the other through the agent loop: N episodes in flight."""
    turns, bad = [], []  # counts only: neither side keeps its samples (a kept sample is work for the GC)

    async def lane(i, tasks):
        for k, row in enumerate(tasks):
            (sample,) = samples_for([row])
            sample.index = k * len(plan) + i
            sample = await agent_loop.generate(args, sample, dict(PARAMS, sampling_seed=sample.index))
            turns.append(sample.metadata["num_turns"])
            if turns[-1] != TURNS:
                bad.append(sample.metadata.get("outcome"))

    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(lane(i, tasks) for i, tasks in enumerate(plan)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if bad:
        raise RuntimeError(f"{len(bad)} episodes did not play {TURNS} turns: outcomes {sorted(set(bad))}")
    return wall, cpu, sum(turns)


async def run_single(args, plan: list[list[dict]]) -> tuple[float, int]:
    """Each lane sends TURNS single-turn requests per task of its plan, one after the other (fresh samples)."""
    params = dict(PARAMS, max_new_tokens=512)
    sent = []

    async def lane(i, tasks):
        for k, row in enumerate(tasks):
            for _ in range(TURNS):
                (sample,) = samples_for([row])
                sample.index = k * len(plan) + i
                sample = await sglang_rollout.generate(args, sample, dict(params, sampling_seed=sample.index))
                sent.append(sample.response_length > 0)

    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(lane(i, tasks) for i, tasks in enumerate(plan)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert all(sent)
    return wall, cpu, len(sent)


async def main_async(opts) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = make_tokenizer_dir(tmp)
        args = make_args(ckpt, 0)
        tokenizer = sglang_rollout.GenerateState(args).tokenizer
        reply_ids = tokenizer.encode(REPLY, add_special_tokens=False)
        assert tokenizer.convert_ids_to_tokens(reply_ids[:1]) == ["<think>"], "<think> must be one added token"
        engine = ScriptedEngine(reply_ids)
        runner, port = await start_server(engine)
        args.sglang_router_port = port
        sample_hooks.set_current_rollout_id(0)
        n_rows = max(max(opts.in_flight), opts.turns_per_run // TURNS)
        rows = list(task_rows("gridnav", n_rows, seed=0, params={"size": 8, "walls": 0.1}, min_len=TURNS + 1))
        try:
            # Warm-up: env module import, the shared HTTP session and as many connections as will be in flight.
            warm = [[row] for row in rows[: max(opts.in_flight)]]
            await run_agent(args, warm)
            await run_single(args, warm)
            if opts.profile:
                prof = cProfile.Profile()
                prof.enable()
                await run_agent(args, lanes(rows, opts.in_flight[0], opts.turns_per_run))
                prof.disable()
                prof.dump_stats(opts.profile)
                pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            results = []
            for n in opts.in_flight:
                plan = lanes(rows, n, opts.turns_per_run)
                best = {"agent": None, "single": None}
                counts, best_cpu = {}, {}
                for rep in range(opts.repeats):
                    for side, fn in (("agent", run_agent), ("single", run_single)):
                        gc.collect()
                        wall, cpu, count = await fn(args, plan)
                        counts[side] = count
                        if best[side] is None or wall < best[side]:
                            best[side], best_cpu[side] = wall, cpu
                        print(f"  n={n} repeat {rep + 1} {side}: {count} in {wall:.3f} s ({count / wall:.0f}/s), "
                              f"CPU {cpu / count * 1e6:.0f} us each", flush=True)
                agent_rate = counts["agent"] / best["agent"]
                single_rate = counts["single"] / best["single"]
                results.append({
                    "in_flight": n,
                    "agent_turns": counts["agent"],
                    "agent_wall_s": round(best["agent"], 4),
                    "agent_turns_per_s": round(agent_rate, 1),
                    "agent_cpu_us_per_turn": round(best_cpu["agent"] / counts["agent"] * 1e6, 1),
                    "single_requests": counts["single"],
                    "single_wall_s": round(best["single"], 4),
                    "single_requests_per_s": round(single_rate, 1),
                    "single_cpu_us_per_request": round(best_cpu["single"] / counts["single"] * 1e6, 1),
                    "ratio": round(agent_rate / single_rate, 3),
                    "repeats": opts.repeats,
                    "episodes_per_lane": len(plan[0]),
                })
        finally:
            await http_utils.close_session()
            await runner.cleanup()
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--in-flight", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--turns-per-run", type=int, default=2048,
                        help="turns (agent) and requests (single) per timed run, spread over the lanes")
    parser.add_argument("--json", help="write the rows as JSON to this file")
    parser.add_argument("--profile", help="cProfile one agent run (first --in-flight) into this file")
    opts = parser.parse_args()
    results = asyncio.run(main_async(opts))
    print()
    print("| in flight | agent turns/s | single-turn requests/s | ratio | CPU us per turn / per request |")
    print("|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['in_flight']} | {r['agent_turns_per_s']:.0f} | {r['single_requests_per_s']:.0f} | "
              f"{r['ratio']:.2f} | {r['agent_cpu_us_per_turn']:.0f} / {r['single_cpu_us_per_request']:.0f} |")
    if opts.json:
        Path(opts.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
