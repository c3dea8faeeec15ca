"""Peak memory of one FSDPActor.train step on CPU, against sequence length (issue 15's table).

The model is a tiny Qwen3 (2 layers, hidden 64) with the REAL Qwen3 vocabulary (151,936 tokens), built in
code (nothing downloaded), one sample per step, server-teacher OPD: almost all memory is the LM head's.
Each (setting, length) runs in a fresh process with a fixed malloc mmap threshold, so freed buffers go
back to the OS and resident memory tracks live tensors. Peak growth = the process's peak resident set
size during ``train`` (``VmHWM`` after resetting it through ``/proc/self/clear_refs``) minus the
resident size just before.

    python benchmarks/trainer_memory.py [--lengths 1024 2048 4096] [--settings before chunked recompute]
    python benchmarks/trainer_memory.py --validate   # the --dry-run memory estimate against measured peaks

Settings: ``before`` = whole-row log-softmax (``--log-probs-chunk-size -1``, the path before issue 15);
``chunked`` = the default chunked head; ``recompute`` = chunked + ``--gradient-checkpointing``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QWEN3_VOCAB = 151936
SETTINGS = {
    "before": ["--log-probs-chunk-size", "-1"],
    "chunked": [],
    "recompute": ["--gradient-checkpointing"],
}
# Freed blocks above this size are unmapped at once, so the resident set size follows live memory.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0", "OMP_NUM_THREADS": "1"}
GIB = 1024 ** 3
# Scaled-down configurations for checking slime/launch/memory_plan.py's estimate (CPU form) against a
# measured peak: head-dominated (real vocabulary), activation-dominated with GQA, a reference model and
# recomputation, and the whole-row head with two micro-batches per step (gradients live across them).
VALIDATION = [
    {"name": "vocab 151,936, hidden 64, 768 tokens", "seq": 768, "n": 1, "argv": [],
     "shape": {"hidden_size": 64, "num_layers": 2}},
    {"name": "GQA hidden 192 x 4 layers, reference, recompute, 2,048 tokens", "seq": 2048, "n": 1,
     "argv": ["--use-kl-loss", "--kl-loss-coef", "0.1", "--gradient-checkpointing"],
     "shape": {"vocab_size": 16384, "hidden_size": 192, "num_layers": 4, "num_heads": 6, "num_kv_heads": 2,
               "intermediate_size": 512}},
    {"name": "hidden 128 x 3 layers, whole rows, 2 micro-batches of 768 tokens", "seq": 768, "n": 2,
     "argv": ["--log-probs-chunk-size", "-1"],
     "shape": {"vocab_size": 32000, "hidden_size": 128, "num_layers": 3, "intermediate_size": 384}},
]


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def rss_bytes() -> int:
    return _status_kib("VmRSS") * 1024


def reset_peak() -> None:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_bytes() -> int:
    return _status_kib("VmHWM") * 1024


def build_checkpoint(out, *, vocab_size=QWEN3_VOCAB, hidden_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=None, intermediate_size=None, tie=False) -> str:
    """A random Qwen3 of the given shape with the project's char tokenizer (ids stay below 100)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from slime.utils.tiny_models import build_tokenizer, save_tiny_checkpoint

    tok = build_tokenizer()
    config = Qwen3Config(vocab_size=vocab_size, hidden_size=hidden_size,
                         intermediate_size=intermediate_size or 2 * hidden_size, num_hidden_layers=num_layers,
                         num_attention_heads=num_heads, num_key_value_heads=num_kv_heads or num_heads,
                         head_dim=hidden_size // num_heads, max_position_embeddings=65536,
                         tie_word_embeddings=tie, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         bos_token_id=None)
    torch.manual_seed(0)
    return str(save_tiny_checkpoint(out, model=Qwen3ForCausalLM(config).float(), tokenizer=tok))


def make_samples(n: int, seq_len: int, prompt_len: int = 16, seed: int = 0):
    """``n`` samples of ``seq_len`` tokens, every response token trained, server-teacher log-probs attached."""
    import random

    from slime.utils.types import Sample

    rng = random.Random(seed)
    samples = []
    for i in range(n):
        sample = Sample(group_index=i, index=i, prompt="", tokens=[rng.randrange(3, 100) for _ in range(prompt_len)],
                        reward=0.0)
        response = [rng.randrange(3, 100) for _ in range(seq_len - prompt_len)]
        sample.append_response_tokens(tokens=response, trainable=True, log_probs=[-1.0] * len(response))
        sample.teacher_log_probs = [-1.5] * len(response)
        sample.rollout_log_probs = None
        samples.append(sample)
    return samples


SERVER_OPD = ["--use-opd", "--opd-type", "sglang", "--rm-url", "http://127.0.0.1:1/generate"]


def trainer_argv(ckpt: str, seq_len: int, n_samples: int, extra: list[str]) -> list[str]:
    """Flags of a one-step run; server-teacher OPD unless ``extra`` picks its own ``--use-opd`` setup."""
    opd = [] if "--use-opd" in extra else SERVER_OPD
    return ["--hf-checkpoint", ckpt, "--rollout-batch-size", str(n_samples), "--n-samples-per-prompt", "1",
            "--micro-batch-size", "1", "--rollout-max-response-len", str(seq_len), "--lr", "1e-5", *opd, *extra]


def measure(ckpt: str, seq_len: int, extra: list[str], *, n_samples: int = 1, warmup: bool = False) -> dict:
    """In this process: build an FSDPActor, run ``train`` (after one warm-up step if asked) and report memory.

    ``total``: peak RSS during the measured step minus RSS before the actor was built (what a device
    would hold: weights, gradients, optimizer state, activations, workspace); ``growth``: peak minus RSS
    right before the step (issue 15's measure).
    """
    import gc

    import torch

    from slime.backends.fsdp_utils.actor import FSDPActor
    from slime.backends.fsdp_utils.launch import ensure_single_process_group
    from slime.utils.arguments import get_parser, validate_args

    torch.set_num_threads(1)
    ensure_single_process_group()
    gc.collect()
    base = rss_bytes()
    args = validate_args(get_parser().parse_args(trainer_argv(ckpt, seq_len, n_samples, extra)))
    actor = FSDPActor(args, 0, 1)
    if warmup:
        actor.train(0, make_samples(n_samples, seq_len, seed=1), kl_coef=0.0)
        gc.collect()
    before = rss_bytes()
    reset_peak()
    t0 = time.perf_counter()
    actor.train(1, make_samples(n_samples, seq_len), kl_coef=0.0)
    seconds = time.perf_counter() - t0
    peak = peak_bytes()
    del actor
    gc.collect()
    return {"seq_len": seq_len, "total": peak - base, "growth": peak - before, "seconds": seconds}


def estimate_for(ckpt: str, seq_len: int, n_samples: int, extra: list[str]) -> dict:
    """The memory plan's CPU estimate for the same run (``plan_memory(..., device="cpu")``)."""
    from slime.launch.memory_plan import plan_memory
    from slime.utils.arguments import get_parser, validate_args
    from slime.utils.hf_config import read_config

    args = validate_args(get_parser().parse_args(trainer_argv(ckpt, seq_len, n_samples, extra)))
    plan = plan_memory(args, read_config(ckpt), device="cpu", tokens=seq_len)
    return {"estimate": plan.total, "phase": plan.phase, "parts": plan.parts}


def validate() -> list[dict]:
    """Measured peak (``total``) against the estimate for every VALIDATION configuration, in this process."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, cfg in enumerate(VALIDATION):
            ckpt = build_checkpoint(Path(tmp) / f"m{i}", **cfg["shape"])
            measured = measure(ckpt, cfg["seq"], cfg["argv"], n_samples=cfg["n"], warmup=True)
            est = estimate_for(ckpt, cfg["seq"], cfg["n"], cfg["argv"])
            rows.append({"name": cfg["name"], **measured, **est,
                         "error": (est["estimate"] - measured["total"]) / measured["total"]})
    return rows


def _subprocess(*flags: str) -> str:
    env = {**os.environ, **MALLOC_ENV, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, __file__, *flags], capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(flags)} failed:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def run_validation() -> list[dict]:
    """``validate()`` in a fresh process with the measurement's malloc settings."""
    return json.loads(_subprocess("--validate", "--json"))


def _run_one(ckpt: str, setting: str, seq_len: int) -> dict:
    return json.loads(_subprocess("--one", setting, str(seq_len), "--ckpt", ckpt))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--one", nargs=2, metavar=("SETTING", "LENGTH"), help=argparse.SUPPRESS)
    parser.add_argument("--ckpt", help=argparse.SUPPRESS)
    parser.add_argument("--validate", action="store_true", help="estimate vs measured peak on VALIDATION configs")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    a = parser.parse_args(argv)
    if a.validate:
        if a.json:  # the fresh process run_validation starts
            print(json.dumps([{k: v for k, v in r.items() if k != "parts"} for r in validate()]))
            return
        print("| configuration | measured peak | estimate (peak phase) | error |\n|---|---|---|---|")
        for r in run_validation():
            print(f"| {r['name']} | {r['total'] / 2**20:.0f} MiB | {r['estimate'] / 2**20:.0f} MiB ({r['phase']}) "
                  f"| {r['error']:+.1%} |")
        return
    if a.one:
        import transformers

        transformers.utils.logging.disable_progress_bar()
        print(json.dumps(measure(a.ckpt, int(a.one[1]), SETTINGS[a.one[0]])))
        return
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = build_checkpoint(Path(tmp) / "qwen3_tiny_151936")
        rows = {s: [_run_one(ckpt, s, n) for n in a.lengths] for s in a.settings}
    print("| setting | " + " | ".join(f"{n:,} tokens" for n in a.lengths) + " | growth 1k->4k |")
    print("|---|" + "---|" * (len(a.lengths) + 1))
    for s, results in rows.items():
        cells = [f"{r['growth'] / GIB:.2f} GiB ({r['seconds']:.1f} s)" for r in results]
        spread = (results[-1]["growth"] - results[0]["growth"]) / GIB
        print(f"| {s} | " + " | ".join(cells) + f" | {spread:+.2f} GiB |")


if __name__ == "__main__":
    main()
