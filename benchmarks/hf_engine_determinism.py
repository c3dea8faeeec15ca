"""What ``--enable-deterministic-inference`` costs the hf_engine: the same requests, both modes, tokens/s.

Two engines on the same tiny checkpoint (by default the demo's: Qwen3 hidden 64, 2 layers, fp32, one
torch thread each), one started with the flag. Three workloads, as an OPD step sends them: N clients each
generate G tokens (seeded, temperature 1, ignore_eos); a next turn, each client's first-turn sequence
plus an observation of ``--obs-len`` tokens as the prompt, G tokens again (the throughput mode finds the
first turn in its prefix cache, the deterministic one has none); and N score-only requests (a teacher's
log-probs of every token of the next turn's full sequence). Each engine's prefix cache is flushed before
the first turn. The two modes alternate within each repeat, so drifting machine load hits both alike; the
best of ``--repeats`` is kept. Generation rates count new tokens, scoring rates scored tokens.

    python benchmarks/hf_engine_determinism.py [--clients 16] [--prompt-len 160] [--new-tokens 32]
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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slime.backends.sglang_utils.launcher import launch_engine  # noqa: E402
from slime.utils import http_utils  # noqa: E402
from slime.utils.tiny_models import build_tokenizer, save_tiny_checkpoint  # noqa: E402


def ids(gen, n, length, vocab):
    # Lengths vary a little, so a shared batch pads; ids avoid the 3 special tokens.
    return [torch.randint(3, vocab, (length - (i % 4),), generator=gen).tolist() for i in range(n)]


def post_all(url, payloads):
    async def go():
        try:
            return await asyncio.gather(*(http_utils.post(f"{url}{route}", body, max_retries=1)
                                          for route, body in payloads))
        finally:
            await http_utils.close_session()

    return asyncio.run(go())


def one_step(url, prompts, observations, new_tokens):
    """First turn, next turn, scoring; returns the seconds of each."""
    def gen(seqs):
        return [("/generate", {"input_ids": s, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 1.0,
                                                                   "ignore_eos": True, "sampling_seed": i}})
                for i, s in enumerate(seqs)]

    post_all(url, [("/flush_cache", {})])
    times, start = [], time.perf_counter()
    first = post_all(url, gen(prompts))
    times.append(time.perf_counter() - start)
    turn2 = [p + o["output_ids"] + obs for p, o, obs in zip(prompts, first, observations)]
    start = time.perf_counter()
    second = post_all(url, gen(turn2))
    times.append(time.perf_counter() - start)
    full = [s + o["output_ids"] for s, o in zip(turn2, second)]
    start = time.perf_counter()
    post_all(url, [("/generate", {"input_ids": s, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
                                  "logprob_start_len": 0}) for s in full])
    times.append(time.perf_counter() - start)
    return times, sum(map(len, full))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=160)
    p.add_argument("--obs-len", type=int, default=40)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    tok = build_tokenizer()
    workdir = Path(tempfile.mkdtemp(prefix="determinism_bench_"))
    ckpt = save_tiny_checkpoint(workdir / "model", hidden_size=a.hidden_size, num_layers=a.num_layers, num_heads=4)
    gen = torch.Generator().manual_seed(0)
    prompts = ids(gen, a.clients, a.prompt_len, len(tok))
    observations = ids(gen, a.clients, a.obs_len, len(tok))
    engines = {}
    try:
        for name, flag in (("throughput", False), ("deterministic", True)):
            args = Namespace(rollout_backend="hf_engine", engine_host="127.0.0.1", seed=0, hf_checkpoint=str(ckpt),
                             rollout_concurrency=a.clients, sglang_enable_deterministic_inference=flag)
            engines[name] = launch_engine(args, log_dir=workdir / "logs", timeout=300, env=env)
        for engine in engines.values():  # warm-up
            one_step(engine.url, prompts[:2], observations[:2], 2)
        best = {name: [float("inf")] * 3 for name in engines}
        for _ in range(a.repeats):
            for name, engine in engines.items():
                times, scored = one_step(engine.url, prompts, observations, a.new_tokens)
                best[name] = [min(b, t) for b, t in zip(best[name], times)]
    finally:
        for engine in engines.values():
            engine.stop()
    counts = (a.clients * a.new_tokens, a.clients * a.new_tokens, scored)
    print(f"model: Qwen3 hidden {a.hidden_size}, {a.num_layers} layers, vocab {len(tok)}, fp32, "
          f"{env['OMP_NUM_THREADS']} thread(s) per engine; {a.clients} clients, prompt ~{a.prompt_len}, "
          f"{a.new_tokens} new tokens per turn, observation ~{a.obs_len}; best of {a.repeats}")
    print(f"{'':<12}{'throughput tok/s':>18}{'deterministic tok/s':>21}{'ratio':>8}")
    for i, label in enumerate(("first turn", "next turn", "scoring")):
        fast, det = counts[i] / best["throughput"][i], counts[i] / best["deterministic"][i]
        print(f"{label:<12}{fast:>18.0f}{det:>21.0f}{det / fast:>8.2f}")
    total = {name: sum(counts) / sum(best[name]) for name in best}
    print(f"{'all':<12}{total['throughput']:>18.0f}{total['deterministic']:>21.0f}"
          f"{total['deterministic'] / total['throughput']:>8.2f}")


if __name__ == "__main__":
    main()
