"""Run slime's own train.py, unmodified, on this CPU machine and check what a case is for.

    python tools/slime_pr/train_cpu.py SLIME_DIR --case CASE [--out DIR]

SLIME_DIR is a slime checkout (pristine, or with a PR ported by port.py); not one of its files changes (checked with a
digest before and after). The run happens in the harness's cached venv (train_cpu_env.py) with Megatron-LM from
MEGATRON_LM_DIR plus slime's megatron.patch, the CPU shims of cpu_shims/ on PYTHONPATH (sitecustomize arms them in the
driver and in every Ray worker), 2 training processes over gloo, a tiny Qwen3-shaped HF checkpoint made in the run.
The last line is ``train_cpu CASE: ok (...)`` or ``train_cpu CASE: FAILED: <why>``; the exit status is 0 only if ok.

Cases: pristine-grpo (slime's GRPO, train-only on saved rollout data, 2 steps, a checkpoint); kl-adaptive (the KL PR:
PPO with --kl-ctrl adaptive, see train_cpu_kl.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SHIMS = HERE / "cpu_shims"
CASES = ("pristine-grpo", "kl-adaptive", "tcod-f2b", "tcod-b2f", "tcod-megatron-teacher")
RUN_TIMEOUT = int(os.environ.get("TRAIN_CPU_TIMEOUT", "900"))
STEP_LINE = re.compile(r"\bstep (\d+): (\{.*\})\s*$")


class CaseFailed(RuntimeError):
    """Why a case failed (one line), with optional detail (a log's tail) printed before that last line."""

    def __init__(self, why: str, detail: str = ""):
        super().__init__(why)
        self.detail = detail


# ------------------------------------------------------------------------------------------ arguments
def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("slime_dir", type=Path, help="a slime checkout (only read)")
    ap.add_argument("--case", required=True, choices=CASES)
    ap.add_argument("--out", type=Path, default=None, help="where the run writes (default: a new temp dir)")
    args = ap.parse_args(argv)
    if not (args.slime_dir / "train.py").is_file() or not (args.slime_dir / "slime/utils/arguments.py").is_file():
        ap.error(f"SLIME_DIR {args.slime_dir} is not a slime checkout (no train.py / slime/utils/arguments.py)")
    args.slime_dir = args.slime_dir.resolve()
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix=f"train-cpu-{args.case}-"))
    args.out = args.out.resolve()
    if args.out == args.slime_dir or args.slime_dir in args.out.parents:
        ap.error(f"--out {args.out} lies inside SLIME_DIR, which must stay unchanged; pick a folder outside it")
    return args


# ------------------------------------------------------------------------------------------ the tree stays unchanged
def tree_digest(root: Path) -> str:
    """sha256 over every path, mode and content under ``root`` but .git: a __pycache__ or egg-info written by the
    run changes it too."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not (dirpath == str(root) and d == ".git"))
        for name in sorted(filenames) + [d + "/" for d in dirnames]:
            path = Path(dirpath, name.rstrip("/"))
            rel = os.path.relpath(path, root)
            st = path.lstat()
            h.update(f"{rel}\0{st.st_mode:o}\0".encode())
            if path.is_file() and not path.is_symlink():
                h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


# ------------------------------------------------------------------------------------------ a run of train.py
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


def run_train(args, env: dict, run: Run, num_gpus: int) -> Run:
    cmd = [env["TRAIN_CPU_PYTHON"], "-m", "slime_cpu_shims.driver", str(num_gpus), str(args.slime_dir / "train.py"),
           *run.flags]
    run.log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(run.log, "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n\n")
        fh.flush()
        # Its own session, so that a timeout ends it and every Ray process it started, and nothing else.
        proc = subprocess.Popen(cmd, cwd=args.out, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            run.rc = proc.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            run.rc = 124
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    run.seconds = time.monotonic() - t0
    run.steps = parse_steps(run.text())
    return run


def parse_steps(text: str) -> list[dict]:
    """slime's per-step training log lines (``step N: {...}``, model.py) as dicts."""
    import ast

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


def require_ok(run: Run) -> None:
    if run.rc != 0:
        lines = run.text().splitlines()
        errors = [ln.strip() for ln in lines if re.search(r"(Error|Exception)\b.*:", ln) and "Warning" not in ln]
        why = "timed out" if run.rc == 124 else f"exit {run.rc}"
        last_error = f": {errors[-1][:300]}" if errors else ""
        raise CaseFailed(f"train.py ({run.name}) {why} after {run.seconds:.0f}s{last_error} (log {run.log})",
                         "\n".join(lines[-40:]))


def harness_env(args) -> dict:
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
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "WANDB_MODE": "disabled",
        "RAY_DEDUP_LOGS": "0",
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    })
    return env


def make_student(out: Path, seed: int = 0, name: str = "student_hf") -> Path:
    from slime.utils.tiny_models import save_tiny_checkpoint

    ckpt = out / name
    if not (ckpt / "config.json").is_file():
        save_tiny_checkpoint(ckpt, hidden_size=64, num_layers=2, num_heads=4, seed=seed)
    return ckpt


def write_rollout_data(env: dict, ckpt: Path, out: Path, num_rollouts: int, prompts: int, per_prompt: int) -> str:
    template = str(out / "rollout_data" / "{rollout_id}.pt")
    (out / "rollout_data").mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([env["TRAIN_CPU_PYTHON"], "-m", "slime_cpu_shims.rollout_data", str(ckpt), template,
                           str(num_rollouts), str(prompts), str(per_prompt), "0"], env=env, cwd=out,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise CaseFailed(f"writing the rollout data failed: {proc.stderr[-1500:]}")
    return template


def grpo_flags(ckpt: Path, out: Path, data_template: str, num_rollout: int, save: Path) -> list[str]:
    return [*hf_model_flags(ckpt), *CPU_FLAGS,
            "--hf-checkpoint", str(ckpt), "--load", str(ckpt), "--save", str(save), "--save-interval", "1",
            "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
            "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "2",
            "--debug-train-only", "--load-debug-rollout-data", data_template,
            "--num-rollout", str(num_rollout), "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
            "--global-batch-size", "4", "--micro-batch-size", "1", "--seq-length", "256",
            "--rollout-max-response-len", "32", "--rollout-max-prompt-len", "200",
            "--advantage-estimator", "grpo", "--optimizer", "adam", "--lr", "1e-4", "--lr-decay-style", "constant",
            "--weight-decay", "0.0", "--adam-beta1", "0.9", "--adam-beta2", "0.98", "--seed", "1234",
            "--eps-clip", "0.2", "--eps-clip-high", "0.28", "--entropy-coef", "0.0"]


# ------------------------------------------------------------------------------------------ cases
def case_pristine_grpo(args, env) -> str:
    ckpt = make_student(args.out)
    data = write_rollout_data(env, ckpt, args.out, num_rollouts=2, prompts=2, per_prompt=2)
    save = args.out / "ckpt"
    dumps = str(args.out / "train" / "{rollout_id}_{rank}.pt")
    flags = [*grpo_flags(ckpt, args.out, data, 2, save), "--save-debug-train-data", dumps]
    run = run_train(args, env, Run("grpo", flags, args.out / "train.log"), 2)
    require_ok(run)
    trained = check_trained(run, save, num_rollout=2)
    from transformers import AutoModelForCausalLM

    from tools.slime_pr import train_cpu_checks as checks

    # slime's own GRPO never compares its log-probs with the checkpoint's: a Megatron model built otherwise would
    # train on and on (this check found the padded vocabulary).
    loaded = checks.check_trainer_logprobs(checks.load_train_dumps(dumps)[0],
                                           AutoModelForCausalLM.from_pretrained(ckpt).eval())
    return f"{trained}; {loaded}"


def check_trained(run: Run, save: Path, num_rollout: int) -> str:
    if len({s["_step"] for s in run.steps}) < num_rollout:
        raise CaseFailed(f"{len(run.steps)} training step line(s) in {run.log}, expected {num_rollout}")
    for s in run.steps:
        for k, v in s.items():
            if isinstance(v, float) and not (v == v and abs(v) != float("inf")):
                raise CaseFailed(f"step {s['_step']}: {k} = {v} (not finite)")
    latest = save / "latest_checkpointed_iteration.txt"
    if not latest.is_file() or latest.read_text().strip() != str(num_rollout - 1):
        raise CaseFailed(f"no checkpoint of rollout {num_rollout - 1} under {save} "
                         f"(latest_checkpointed_iteration.txt: {latest.read_text().strip() if latest.is_file() else '-'})")
    if not all(s.get("train/grad_norm", 0) > 0 for s in run.steps):
        raise CaseFailed(f"a step without a gradient: {[s.get('train/grad_norm') for s in run.steps]}")
    losses = [f"{s.get('train/loss', float('nan')):.3g}" for s in run.steps]
    norms = [f"{s['train/grad_norm']:.3g}" for s in run.steps]
    return (f"{len(run.steps)} steps on 2 ranks, losses {losses}, grad norms {norms}, checkpoint iter "
            f"{num_rollout - 1}, train.py {run.seconds:.0f}s")


def case_kl_adaptive(args, env) -> str:
    from tools.slime_pr import train_cpu_kl as K

    if not (args.slime_dir / "slime/utils/kl_controller.py").is_file():
        raise CaseFailed(f"{args.slime_dir} does not hold the KL PR (no slime/utils/kl_controller.py); port it onto a "
                         "copy first: `python tools/slime_pr/port.py --pr adaptive-kl COPY`")
    student = make_student(args.out)
    ref = make_student(args.out, seed=1, name="ref_hf")  # another model as the reference: a KL from step 0 on
    data = write_rollout_data(env, student, args.out, num_rollouts=4, prompts=2, per_prompt=2)
    save, critic = args.out / "ckpt", args.out / "ckpt_critic"

    def flags(num_rollout: int, load: bool, trace: Path) -> list[str]:
        # Role overrides through slime's own --megatron-config-path: the critic saves / loads apart from the actor,
        # and neither offloads (slime turns --offload-train on for PPO, and with it the buffers without CPU backup:
        # both go through torch_memory_saver, which needs CUDA).
        no_offload = "".join(f"      {k}: false\n" for k in ("offload_train", "disable_grad_buffers_cpu_backup",
                                                                "disable_param_buffers_cpu_backup"))
        cfg = args.out / f"megatron_roles_{num_rollout}.yaml"
        cfg.write_text("megatron:\n  - name: default\n    role: critic\n    overrides:\n" + no_offload
                       + f"      save: {critic}\n" + (f"      load: {critic}\n" if load else "")
                       + "  - name: default\n    role: actor\n    overrides:\n" + no_offload)
        base = grpo_flags(student, args.out, data, num_rollout, save)
        i = base.index("--advantage-estimator")
        base[i + 1] = "ppo"
        if load:
            base[base.index("--load") + 1] = str(save)
        ppo = ["--megatron-config-path", str(cfg), "--ref-load", str(ref), "--lr", "1e-3",
                     "--kl-coef", str(K.KL_COEF), "--kl-ctrl", "adaptive", "--kl-target", str(K.KL_TARGET),
                     "--kl-horizon", str(K.KL_HORIZON), "--kl-loss-type", "k1", "--gamma", "1", "--lambd", "1"]
        return base + ppo

    def run(name: str, num_rollout: int, load: bool):
        trace = args.out / f"kl_trace_{num_rollout}"
        run_env = dict(env, TRAIN_CPU_KL_TRACE=str(trace))
        r = run_train(args, run_env, Run(name, flags(num_rollout, load, trace), args.out / f"train_{num_rollout}.log"),
                      2)
        require_ok(r)
        return r, K.read_trace(trace)

    try:  # the first run's checks come before the resume: a wrong coefficient fails without a second run
        run1, rec1 = run("3 steps", 3, False)
        steps1 = K.check_run(rec1, K.KL_COEF, K.KL_COEF, "run 1")
        if len(steps1) != 3:
            raise K.KLCheckFailed(f"run 1 made {len(steps1)} controller steps, expected 3")
        K.check_saved_state(save, 2, steps1[-1]["after"])
        run2, rec2 = run("resume", 4, True)
        restored = K.check_resume(rec2, steps1[-1]["after"])
        steps2 = K.check_run(rec2, restored, K.KL_COEF, "resume")
        if len(steps2) != 1:
            raise K.KLCheckFailed(f"the resume made {len(steps2)} controller steps, expected 1 (rollout 3)")
    except K.KLCheckFailed as exc:
        raise CaseFailed(str(exc)) from None
    return (f"coefficient {K.summary(steps1)}, resumed at {restored:.6g} -> {steps2[-1]['after']:.5g}, equal on 2 "
            f"ranks, rewards shaped with it (fit rtol {K.FIT_RTOL}); runs {run1.seconds:.0f}s + {run2.seconds:.0f}s")


CASE_FUNCS = {"pristine-grpo": case_pristine_grpo, "kl-adaptive": case_kl_adaptive}


def _tcod_case(case: str):
    """The TCOD PR's cases live in train_cpu_tcod.py (which imports this module, so it is imported late)."""
    def run(args, env):
        from tools.slime_pr import train_cpu_tcod

        try:
            return train_cpu_tcod.run_case(case)(args, env)
        except train_cpu_tcod.CaseFailed as exc:  # another class object when this file runs as __main__
            raise CaseFailed(str(exc)) from None

    return run


CASE_FUNCS.update({case: _tcod_case(case) for case in ("tcod-f2b", "tcod-b2f", "tcod-megatron-teacher")})


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    before = tree_digest(args.slime_dir)
    t0 = time.monotonic()
    try:
        if args.case not in CASE_FUNCS:
            raise CaseFailed(f"case {args.case} is not implemented yet")
        env = harness_env(args)
        summary = CASE_FUNCS[args.case](args, env)
        after = tree_digest(args.slime_dir)
        if after != before:
            raise CaseFailed(f"SLIME_DIR {args.slime_dir} changed during the run (digest {before[:12]} -> {after[:12]})")
    except CaseFailed as exc:
        if exc.detail:
            print(exc.detail, flush=True)
        print(f"train_cpu {args.case}: FAILED: {exc}", flush=True)
        return 1
    except Exception as exc:  # the harness itself (env build, a shim refusing): still one last line
        print(f"train_cpu {args.case}: FAILED: {type(exc).__name__}: {exc}", flush=True)
        return 1
    print(f"train_cpu {args.case}: ok ({summary}; wall {time.monotonic() - t0:.0f}s; out {args.out})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
