"""One invocation of slime's train.py for train_cpu.py's cases: the harness's environment, the flags every case
shares, the run itself (its log named at the start, a heartbeat while it runs), and what it printed.

train_cpu.py (the command line and the GRPO / KL cases) and train_cpu_tcod.py (the TCOD PR's cases) both import
this module; neither imports the other.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIMS = HERE / "cpu_shims"
RUN_TIMEOUT = int(os.environ.get("TRAIN_CPU_TIMEOUT", "1800"))  # a loaded 2-core machine: minutes per import
HEARTBEAT_S = 10.0
STEP_LINE = re.compile(r"\bstep (\d+): (\{.*\})\s*$")


class CaseFailed(RuntimeError):
    """Why a case failed (one line), with optional detail (a log's tail) printed before that last line."""

    def __init__(self, why: str, detail: str = ""):
        super().__init__(why)
        self.detail = detail


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Run:
    """One train.py invocation: its flags, its log, what it printed."""

    name: str
    flags: list[str]
    log: Path
    rc: int | None = None
    seconds: float = 0.0
    steps: list[dict] = field(default_factory=list)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def hf_model_flags(ckpt: Path) -> list[str]:
    """Megatron's model flags for the HF Qwen3 checkpoint (as slime's scripts/models/qwen3-*.sh spell them)."""
    cfg = json.loads((ckpt / "config.json").read_text())
    rope = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 1000000)
    # Megatron pads the vocabulary to a multiple of --make-vocab-size-divisible-by (128 by default), and the
    # padded rows' logits (0) join every softmax: with a tiny vocab of 100 that shifts every log-prob by
    # log(128/100). slime's scripts set the divisor where a vocab is not a multiple of 128 (glm4.7: 64); here the
    # largest power of two dividing the vocab, so Megatron's vocabulary is the checkpoint's.
    divisor = cfg["vocab_size"] & -cfg["vocab_size"]
    return ["--swiglu", "--num-layers", str(cfg["num_hidden_layers"]), "--hidden-size", str(cfg["hidden_size"]),
            "--ffn-hidden-size", str(cfg["intermediate_size"]), "--num-attention-heads", str(cfg["num_attention_heads"]),
            "--group-query-attention", "--num-query-groups", str(cfg["num_key_value_heads"]),
            "--kv-channels", str(cfg["head_dim"]), "--use-rotary-position-embeddings", "--disable-bias-linear",
            "--normalization", "RMSNorm", "--norm-epsilon", str(cfg["rms_norm_eps"]), "--rotary-base", str(int(rope)),
            "--vocab-size", str(cfg["vocab_size"]), "--make-vocab-size-divisible-by", str(divisor),
            "--qk-layernorm", "--untie-embeddings-and-output-weights"]


# What a CPU cannot do, and Megatron's defaults that assume it can: TransformerEngine (local spec), fused kernels,
# CUDA initialisation; no dropout so runs repeat. Megatron computes in bf16 here too, as slime makes it
# (megatron_utils/arguments.py: args.bf16 = not args.fp16).
CPU_FLAGS = ["--transformer-impl", "local", "--use-cpu-initialization", "--no-persist-layer-norm",
             "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion", "--no-bias-swiglu-fusion",
             "--no-bias-dropout-fusion", "--no-rope-fusion", "--attention-dropout", "0", "--hidden-dropout", "0",
             "--distributed-backend", "gloo", "--distributed-timeout-minutes", "10",
             # slime sizes the LR / weight-decay schedules from --num-rollout, and Megatron refuses a resume whose
             # schedule lengths differ from the checkpoint's: each case resumes with one more rollout, so the
             # schedule comes from the checkpoint (Megatron's own flag for it).
             "--use-checkpoint-opt_param-scheduler"]


def harness_env(args) -> dict:
    """The environment of every process of the run: the harness venv, the shims, slime before Megatron-LM."""
    from tools.slime_pr import train_cpu_env

    venv = train_cpu_env.build_venv()
    meg = train_cpu_env.megatron_copy(train_cpu_env.megatron_dir_from_env(), args.slime_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "CUDA_"))}
    env.update({
        "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        "VIRTUAL_ENV": str(venv),
        "TRAIN_CPU_PYTHON": str(venv / "bin/python"),
        # SLIME_DIR before Megatron-LM, whose examples/ package would hide slime's.
        "PYTHONPATH": os.pathsep.join([str(SHIMS), str(args.slime_dir), str(meg)]),
        # No __pycache__ written into SLIME_DIR (or the Megatron copy) by any process of the run.
        "PYTHONPYCACHEPREFIX": str(args.out / "pycache"),
        "SLIME_TRAIN_CPU_SHIMS": "1",
        "SLIME_ACCELERATOR": "cpu",
        "RAY_AUTH_MODE": "disabled",
        "RAY_raylet_start_wait_time_s": "180",
        # Ray's memory monitor kills workers when the whole machine passes 95% of its memory, other people's
        # processes included (a 2-core laptop running 3 SGLang servers beside other work got there): the kernel's
        # limit is the one that holds here.
        "RAY_memory_monitor_refresh_ms": "0",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "WANDB_MODE": "disabled",
        "RAY_DEDUP_LOGS": "0",
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    })
    return env


def _log_tail(log: Path, nbytes: int) -> list[str]:
    """The last ``nbytes`` of a growing log, as lines (empty when it cannot be read)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - nbytes))
            return fh.read().decode(errors="replace").splitlines()
    except OSError:
        return []


def _latest_step_line(log: Path) -> str:
    """The last ``step N: {...}`` line of a growing log (its tail only), shortened for a heartbeat."""
    for line in reversed(_log_tail(log, 65536)):
        m = STEP_LINE.search(line)
        if m:
            return f"step {m.group(1)}: {m.group(2)[:160]}"
    return ""


def _latest_line(log: Path) -> str:
    """The log's last line that is not a warning (what train.py is doing before its first step)."""
    for line in reversed(_log_tail(log, 8192)):
        if line.strip() and not line.startswith(" ") and "warn" not in line.lower():
            return line.strip()[-140:]
    return ""


def run_train(args, env: dict, run: Run, num_gpus: int) -> Run:
    """Run SLIME_DIR/train.py with ``run.flags`` (plus the contributor's ``--extra-args``, last so they win) under
    the driver shim, logging to ``run.log``; a heartbeat every HEARTBEAT_S seconds says how long and the latest step."""
    extra = list(getattr(args, "extra_args", None) or [])
    cmd = [env["TRAIN_CPU_PYTHON"], "-m", "slime_cpu_shims.driver", str(num_gpus), str(args.slime_dir / "train.py"),
           *run.flags, *extra]
    run.log.parent.mkdir(parents=True, exist_ok=True)
    say(f"train.py ({run.name}) starts; its log: {run.log}")
    t0 = time.monotonic()
    with open(run.log, "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n\n")
        fh.flush()
        # Its own session, so that a timeout ends it and every Ray process it started, and nothing else.
        proc = subprocess.Popen(cmd, cwd=args.out, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            while True:
                try:
                    run.rc = proc.wait(timeout=HEARTBEAT_S)
                    break
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - t0
                    if elapsed > RUN_TIMEOUT:
                        run.rc = 124
                        break
                    latest = _latest_step_line(run.log)
                    say(f"train.py ({run.name}) running {elapsed:.0f}s; "
                        + (f"latest {latest}" if latest else f"no training step yet; log: {_latest_line(run.log)}"))
        finally:  # ok, timed out or interrupted: the run's process group goes with it
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    run.seconds = time.monotonic() - t0
    run.steps = parse_steps(run.text())
    if isinstance(getattr(args, "runs", None), list):
        args.runs.append(run)
    say(f"train.py ({run.name}) exit {run.rc} after {run.seconds:.0f}s, {len(run.steps)} step line(s)")
    return run


def parse_steps(text: str) -> list[dict]:
    """slime's per-step training log lines (``step N: {...}``, model.py) as dicts."""
    out = []
    for line in text.splitlines():
        m = STEP_LINE.search(line)
        if m:
            try:
                d = ast.literal_eval(m.group(2))
            except (ValueError, SyntaxError):
                continue
            d["_step"] = int(m.group(1))
            out.append(d)
    return out


# A Python exception's last line, as a server's log ends a traceback with it ("TypeError: Unexpected keyword ...").
EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.+)$")


def engine_errors(logs: dict[str, Path]) -> list[str]:
    """The last exception each engine logged (``name: Type: message``): a request an engine refused reaches slime
    only as an HTTP 500 (SGLang answers "Internal Server Error" and logs why), so the reason is read here."""
    found = []
    for name, log in logs.items():
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        hits = [m for m in map(EXCEPTION_LINE.match, (ln.strip() for ln in lines)) if m]
        if hits:
            found.append(f"{name}: {hits[-1].group(1)}: {hits[-1].group(2)[:300]}")
    return found


# slime's http_utils.post logs each failed try with the body the server answered: "... (attempt 60/60,
# url=http://.../generate, response={"error":{"message":"top_p must be in (0, 1], got 1.5."}})".
RETRY_RESPONSE = re.compile(r"url=(\S+?), response=(.*)\)\s*$")


def engine_answer(lines: list[str]) -> str | None:
    """The last error body an engine (or the router in front of it) answered slime with, its ``message`` when it is
    SGLang's JSON error: a 400 names the refused field only there; the exception's own line is httpx's status."""
    for line in reversed(lines):
        m = RETRY_RESPONSE.search(line)
        if not m:
            continue
        body = m.group(2).strip()
        try:
            err = json.loads(body).get("error")
            body = err.get("message", body) if isinstance(err, dict) else str(err or body)
        except (ValueError, AttributeError):
            pass
        return f"{m.group(1)} answered: {body[:300]}"
    return None


def require_ok(run: Run, engine_logs: dict[str, Path] | None = None) -> None:
    """A failed run as one line: how it ended, its last error and, when engines served it, what they refused."""
    if run.rc != 0:
        lines = run.text().splitlines()
        errors = [ln.strip() for ln in lines if re.search(r"(Error|Exception)\b.*:", ln) and "Warning" not in ln]
        why = "timed out" if run.rc == 124 else f"exit {run.rc}"
        last_error = f": {errors[-1][:400]}" if errors else ""
        answer = engine_answer(lines)
        answered = f"; {answer}" if answer else ""
        engines = engine_errors(engine_logs or {})
        said = f"; the engines logged: {' | '.join(engines)}" if engines else ""
        raise CaseFailed(f"train.py ({run.name}) {why} after {run.seconds:.0f}s{last_error}{answered}{said} "
                         f"(log {run.log})",
                         "\n".join(lines[-40:]))


def write_steps(path: Path, runs: list[Run]) -> None:
    """Every training step's numbers, at full precision, one JSON object a line (``--compare`` reads them)."""
    with open(path, "w") as fh:
        for run in runs:
            for step in run.steps:
                fh.write(json.dumps({"run": run.name, **step}) + "\n")
