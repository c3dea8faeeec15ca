"""Start the engine: ``python -m slime.backends.hf_engine --model-path DIR --port P``.

Flag names follow ``sglang.launch_server`` where the two overlap (--model-path, --tokenizer-path,
--host, --port, --dtype, --random-seed, --max-prefill-tokens, --context-length, --disable-radix-cache,
--enable-deterministic-inference), so launch scripts read alike.
"""

from __future__ import annotations

import argparse
import logging
import os

import torch
from aiohttp import web


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="SGLang-protocol HTTP server on transformers (CPU and tests)")
    p.add_argument("--model-path", required=True, help="HF folder with the model (safetensors) and tokenizer")
    p.add_argument("--tokenizer-path", default=None, help="default: --model-path")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--max-batch-size", type=int, default=64, help="rows decoded together")
    p.add_argument("--max-prefill-tokens", type=int, default=16384,
                   help="padded tokens per prefill / scoring forward")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--random-seed", type=int, default=0, help="seeds requests that bring no sampling_seed")
    p.add_argument("--context-length", type=int, default=None,
                   help="SGLang's flag: the context in tokens (default: the model's max_position_embeddings)")
    p.add_argument("--prefix-cache-mb", type=float, default=512,
                   help="memory for the KV of finished requests, reused by requests that share their prefix")
    p.add_argument("--disable-radix-cache", action="store_true",
                   help="SGLang's name: turn the prefix cache off (every request is prefilled from scratch)")
    p.add_argument("--enable-deterministic-inference", action="store_true",
                   help="SGLang's flag: a request's tokens and log-probs do not depend on what shares its batch "
                        "(one forward per row, prefix cache off, unseeded requests get --random-seed); slower")
    p.add_argument("--log-level", default="info")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="exit when this process is gone (the launcher passes its own pid, so an engine never "
                        "outlives its run); without it the server runs until stopped")
    # One thread unless told otherwise: on a small shared CPU box (the demo runs trainer, policy engine
    # and teacher engine on 2 cores) torch's default spins OpenMP threads against the other processes;
    # measured there, the agent loop ran 7x slower with 2 threads than with 1 (docs/en/benchmarks.md).
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS") or 1),
                   help="torch threads (default: $OMP_NUM_THREADS, else 1; 0 keeps torch's default)")
    args = p.parse_args(argv)
    if args.max_batch_size < 1 or args.max_prefill_tokens < 1:
        p.error("--max-batch-size and --max-prefill-tokens must be >= 1")
    if args.threads < 0:
        p.error("--threads must be >= 0")
    if args.context_length is not None and args.context_length < 8:
        p.error("--context-length must be >= 8")
    if args.prefix_cache_mb < 0:
        p.error("--prefix-cache-mb must be >= 0")
    return args


def build(args):
    from slime.backends.hf_engine.model_runner import ModelRunner
    from slime.backends.hf_engine.scheduler import Scheduler
    from slime.backends.hf_engine.server import make_app

    if args.threads:
        torch.set_num_threads(args.threads)
    runner = ModelRunner(args.model_path, tokenizer_path=args.tokenizer_path, dtype=args.dtype, device=args.device,
                         context_length=args.context_length)
    cache_bytes = 0 if args.disable_radix_cache else int(args.prefix_cache_mb * 2**20)
    scheduler = Scheduler(runner, max_batch_size=args.max_batch_size, max_prefill_tokens=args.max_prefill_tokens,
                          seed=args.random_seed, prefix_cache_bytes=cache_bytes,
                          deterministic=args.enable_deterministic_inference)
    scheduler.start()
    return make_app(runner, scheduler, server_flags={"dtype": args.dtype, "random_seed": args.random_seed})


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s hf_engine %(levelname)s %(message)s")
    if args.parent_pid is not None:  # before the model loads: a parent may die during a long load too
        from slime.backends.sglang_utils.processes import watch_parent

        watch_parent(args.parent_pid)
    app = build(args)
    logging.getLogger("hf_engine").info("serving %s on http://%s:%d", args.model_path, args.host, args.port)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
