"""Run slime's own train.py, unmodified, on this CPU machine and check what a case is for.

    python tools/slime_pr/train_cpu.py SLIME_DIR --case CASE [--out DIR] [--engine sglang|hf_engine]
                                       [--extra-args '--lr 2e-5 ...'] [--compare EARLIER_OUT]

SLIME_DIR is a slime checkout (pristine, or with a PR ported by port.py); not one of its files changes (checked with a
digest before and after). The run happens in the harness's cached venv (train_cpu_env.py) with Megatron-LM from
MEGATRON_LM_DIR plus slime's megatron.patch, the CPU shims of cpu_shims/ on PYTHONPATH (sitecustomize arms them in the
driver and in every Ray worker), 2 training processes over gloo, a tiny Qwen3-shaped HF checkpoint made in the run.
The cases that generate (the TCOD ones, slime-engines) do it on real SGLang 0.5.15.post1 servers (``--engine sglang``,
the default) or on this repository's hf_engine (``--engine hf_engine``, faster to start).
The last line is ``train_cpu CASE: ok (...)`` or ``train_cpu CASE: FAILED: <why>``; the exit status is 0 only if ok.
Every training step's numbers, at full precision, go to OUT/steps.jsonl; ``--compare EARLIER_OUT`` prints them beside
an earlier run's. No process the case started outlives it (train_cpu_reaper.py).

Cases: pristine-grpo (slime's GRPO, train-only on saved rollout data, 2 steps, a checkpoint); kl-adaptive (the KL PR:
PPO with --kl-ctrl adaptive, see train_cpu_kl.py); tcod-f2b, tcod-b2f, tcod-megatron-teacher and slime-engines (the
TCOD PR, see train_cpu_tcod.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.slime_pr import train_cpu_reaper as reaper  # noqa: E402
from tools.slime_pr.train_cpu_run import (  # noqa: E402,F401  (parse_steps, require_ok: the tests' names)
    CPU_FLAGS,
    CaseFailed,
    Run,
    harness_env,
    hf_model_flags,
    parse_steps,
    require_ok,
    run_train,
    say,
    write_steps,
)

CASES = ("pristine-grpo", "kl-adaptive", "tcod-f2b", "tcod-b2f", "tcod-megatron-teacher", "slime-engines")
ENGINES = ("sglang", "hf_engine")
# Which numbers of slime's step lines --compare puts side by side (all of them go to steps.jsonl).
COMPARED = ("train/loss", "train/pg_loss", "train/grad_norm", "train/pg_clipfrac", "train/ppo_kl")


# ------------------------------------------------------------------------------------------ arguments
def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("slime_dir", type=Path, help="a slime checkout (only read)")
    ap.add_argument("--case", required=True, choices=CASES)
    ap.add_argument("--out", type=Path, default=None, help="where the run writes (default: a new temp dir)")
    ap.add_argument("--engine", choices=ENGINES, default="sglang",
                    help="what serves the student and the OPD teacher: real SGLang 0.5.15.post1 (default) or this "
                         "repository's hf_engine (starts in ~20 s instead of 1-3 min)")
    ap.add_argument("--extra-args", default="", metavar="'FLAGS'",
                    help="your own slime flags, one shell-quoted string, added after the case's flags of every "
                         "train.py invocation (so they win), e.g. --extra-args '--lr 2e-5 --eps-clip 0.1'")
    ap.add_argument("--compare", type=Path, default=None, metavar="EARLIER_OUT",
                    help="an earlier run's --out: print each step's loss and grad norm beside that run's")
    args = ap.parse_args(argv)
    try:
        args.extra_args = shlex.split(args.extra_args)
    except ValueError as exc:
        ap.error(f"--extra-args {args.extra_args!r} does not parse as shell words: {exc}")
    if args.compare is not None and not (args.compare / "steps.jsonl").is_file():
        ap.error(f"--compare {args.compare}: no steps.jsonl there (give the --out of an earlier train_cpu run)")
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
    return f"{len(run.steps)} steps on 2 ranks, checkpoint iter {num_rollout - 1}, train.py {run.seconds:.0f}s"


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
# These train on saved rollout data (--load-debug-rollout-data) and start no engine: --engine has no effect on them.
NO_ENGINE_CASES = ("pristine-grpo", "kl-adaptive")


def engine_said(args) -> str:
    return "no engine (saved rollouts)" if args.case in NO_ENGINE_CASES else f"engine {args.engine}"


def _tcod_case(case: str):
    """The TCOD PR's cases live in train_cpu_tcod.py, imported when one runs (it needs torch and transformers)."""
    def run(args, env):
        from tools.slime_pr import train_cpu_tcod

        return train_cpu_tcod.run_case(case)(args, env)

    return run


CASE_FUNCS.update({case: _tcod_case(case) for case in CASES if case.startswith("tcod-") or case == "slime-engines"})


def losses_line(runs: list[Run]) -> str:
    """Each step's loss and grad norm at full precision (repr): a change of 1e-4 in slime's loss shows."""
    steps = [s for r in runs for s in r.steps]
    return (f"losses {[s.get('train/loss') for s in steps]}, "
            f"grad norms {[s.get('train/grad_norm') for s in steps]}")


def compare(earlier: Path, now: Path) -> list[str]:
    """Lines putting this run's steps beside an earlier run's, key by key (COMPARED), with the difference."""
    def load(path):
        return [json.loads(line) for line in (path / "steps.jsonl").read_text().splitlines() if line.strip()]

    old, new = load(earlier), load(now)
    lines = [f"compare: {len(new)} step(s) here, {len(old)} in {earlier}"]
    for i, (a, b) in enumerate(zip(old, new)):
        for key in COMPARED:
            if key in a or key in b:
                x, y = a.get(key), b.get(key)
                diff = (y - x) if isinstance(x, (int, float)) and isinstance(y, (int, float)) else None
                mark = "same" if x == y else f"diff {diff:+.6g}" if diff is not None else "differs"
                lines.append(f"  {b.get('run', a.get('run', '?'))} step {b.get('_step', i)} {key}: "
                             f"earlier {x!r}  now {y!r}  ({mark})")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    before = tree_digest(args.slime_dir)
    t0 = time.monotonic()
    # Every process of the case carries this token; the watchdog sweeps them if this process dies, the finally
    # below if it does not.
    token, saved_env = reaper.new_token(), os.environ.get(reaper.ENV_KEY)
    os.environ[reaper.ENV_KEY] = token
    watchdog = reaper.start_watchdog(token)

    def terminated(signum, frame):  # `kill`, a CI timeout: end as Ctrl-C does, through the finally below
        raise KeyboardInterrupt

    previous_term = signal.signal(signal.SIGTERM, terminated)
    args.runs = []  # every train.py Run of the case, for steps.jsonl and the result line
    say(f"train_cpu {args.case}: {engine_said(args)}; output under {args.out}"
        + (f"; your flags: {' '.join(args.extra_args)}" if args.extra_args else ""))
    rc, last = 1, ""
    try:
        if args.case not in CASE_FUNCS:
            raise CaseFailed(f"case {args.case} is not implemented yet")
        env = harness_env(args)
        summary = CASE_FUNCS[args.case](args, env)
        after = tree_digest(args.slime_dir)
        if after != before:
            raise CaseFailed(f"SLIME_DIR {args.slime_dir} changed during the run (digest {before[:12]} -> {after[:12]})")
        rc = 0
        last = (f"train_cpu {args.case}: ok ({summary}; {losses_line(args.runs)}; {engine_said(args)}; "
                f"wall {time.monotonic() - t0:.0f}s; out {args.out})")
    except CaseFailed as exc:
        if exc.detail:
            print(exc.detail, flush=True)
        last = f"train_cpu {args.case}: FAILED: {exc}"
    except KeyboardInterrupt:
        rc, last = 130, f"train_cpu {args.case}: FAILED: interrupted after {time.monotonic() - t0:.0f}s"
    except Exception as exc:  # the harness itself (env build, a shim refusing, a check): still one last line
        last = f"train_cpu {args.case}: FAILED: {type(exc).__name__}: {exc}"
    finally:
        stray = reaper.sweep(token)
        reaper.stop_watchdog(watchdog)
        signal.signal(signal.SIGTERM, previous_term)
        if saved_env is None:
            os.environ.pop(reaper.ENV_KEY, None)
        else:
            os.environ[reaper.ENV_KEY] = saved_env
    write_steps(args.out / "steps.jsonl", args.runs)
    if stray:
        say(f"ended {len(stray)} process(es) of the case still running at its end (pids {stray[:8]})")
    if args.compare is not None:
        for line in compare(args.compare, args.out):
            print(line, flush=True)
    print(last, flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
