"""Throughput of the hf_engine under N concurrent clients against in-process transformers on the same batch.

Generation: N clients each ask for G new tokens (ignore_eos, temperature 1) against ``model.generate``
on the same N left-padded prompts (sampling, G tokens, no early stop). Scoring: N clients each send a
score-only request (``max_new_tokens: 0``, log-probs of every token) against one batched forward plus
the log-prob gather. Both sides run on the same model, dtype and thread count; the engine runs as its
own process (as in training) and is measured after a warm-up. The four measurements alternate within
each repeat (so drifting machine load hits both sides alike); the best of ``--repeats`` is kept.

    python benchmarks/engine_throughput.py [--clients 16] [--prompt-len 64] [--new-tokens 64]
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


def make_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    # Lengths vary a little, as real prompts do; ids avoid the 3 special tokens.
    return [torch.randint(3, vocab, (length - (i % 4),), generator=gen).tolist() for i in range(n)]


def left_pad(prompts, pad_id):
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids, mask


def best_of(repeats, fn):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


@torch.inference_mode()
def inprocess_generate(model, prompts, new_tokens, pad_id):
    ids, mask = left_pad(prompts, pad_id)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=pad_id)
    assert out.shape[1] == ids.shape[1] + new_tokens


@torch.inference_mode()
def inprocess_score(model, seqs, pad_id):
    ids, mask = left_pad(seqs, pad_id)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])
    return logp.squeeze(-1).tolist()


def engine_run(url, payloads):
    async def go():
        try:
            return await asyncio.gather(*(http_utils.post(f"{url}/generate", p, max_retries=1) for p in payloads))
        finally:
            await http_utils.close_session()

    return asyncio.run(go())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads on both sides (default: torch's choice); 1 is steadier on a busy machine")
    a = p.parse_args(argv)
    env = dict(os.environ)
    if a.threads:
        torch.set_num_threads(a.threads)
    # The engine process reads it at start-up (it defaults to 1 thread otherwise): same count both sides.
    env["OMP_NUM_THREADS"] = str(torch.get_num_threads())

    from transformers import AutoModelForCausalLM

    tok = build_tokenizer()
    workdir = Path(tempfile.mkdtemp(prefix="engine_bench_"))
    ckpt = save_tiny_checkpoint(workdir / "model", hidden_size=a.hidden_size, num_layers=a.num_layers, num_heads=8)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    pad = tok.pad_token_id
    prompts = make_prompts(a.clients, a.prompt_len, len(tok))
    scored = make_prompts(a.clients, a.prompt_len + a.new_tokens, len(tok), seed=1)
    gen_tokens = a.clients * a.new_tokens
    score_tokens = sum(len(s) for s in scored)

    args = Namespace(rollout_backend="hf_engine", engine_host="127.0.0.1", seed=0, rollout_concurrency=a.clients,
                     hf_checkpoint=str(ckpt))
    engine = launch_engine(args, log_dir=workdir / "logs", timeout=300, env=env)
    gen_payloads = [{"input_ids": pr, "sampling_params": {"max_new_tokens": a.new_tokens, "temperature": 1.0,
                                                          "ignore_eos": True, "seed": i}}
                    for i, pr in enumerate(prompts)]
    score_payloads = [{"input_ids": s, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
                       "logprob_start_len": 0} for s in scored]

    def served_gen():
        outs = engine_run(engine.url, gen_payloads)
        assert all(len(o["output_ids"]) == a.new_tokens for o in outs)

    sides = {
        "gen_local": lambda: inprocess_generate(model, prompts, a.new_tokens, pad),
        "gen_engine": served_gen,
        "score_local": lambda: inprocess_score(model, scored, pad),
        "score_engine": lambda: engine_run(engine.url, score_payloads),
    }
    try:
        inprocess_generate(model, prompts, 4, pad)  # warm-ups
        engine_run(engine.url, gen_payloads[:2])
        engine_run(engine.url, score_payloads[:2])
        # Alternate the sides within each repeat so a change in machine load hits both alike.
        best = {name: float("inf") for name in sides}
        for _ in range(a.repeats):
            for name, fn in sides.items():
                best[name] = min(best[name], best_of(1, fn))
    finally:
        engine.stop()
    t_gen_local, t_gen_engine = best["gen_local"], best["gen_engine"]
    t_score_local, t_score_engine = best["score_local"], best["score_engine"]

    rows = [("generation", gen_tokens, t_gen_local, t_gen_engine), ("scoring", score_tokens, t_score_local, t_score_engine)]
    print(f"model: Qwen3 hidden {a.hidden_size}, {a.num_layers} layers, vocab {len(tok)}, fp32; "
          f"{a.clients} clients, prompt ~{a.prompt_len}, {a.new_tokens} new tokens; torch threads "
          f"{torch.get_num_threads()}")
    print(f"{'':<11}{'in-process tok/s':>18}{'hf_engine tok/s':>18}{'ratio':>8}")
    for name, tokens, local, served in rows:
        print(f"{name:<11}{tokens / local:>18.0f}{tokens / served:>18.0f}{local / served:>8.2f}")


if __name__ == "__main__":
    main()
