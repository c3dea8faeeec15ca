"""The TCOD PR's cases of ``train_cpu.py``: the PR's launch settings shrunk, run by slime's own ``train.py``.

``tcod-f2b`` and ``tcod-b2f`` (teacher on an hf_engine server, ``--opd-type sglang``) and ``tcod-megatron-teacher``
(B2F, the teacher in the trainer, ``--opd-type megatron``: B2F's replayed expert steps earn an environment
return, which pure OPD must keep out of the reward; an untrained student's own F2B turns earn none).
Each trains a tiny Qwen3-shaped student on 2 gloo ranks
for ``FIRST_ROLLOUTS`` rollouts with a checkpoint after each, then resumes from the last checkpoint for one more,
with the student's rollouts served by hf_engine processes as slime's external engines (weights synced with
``--update-weight-transport disk``). The checks (``train_cpu_checks``) read slime's own debug dumps: every step's
depth k(n) counted in the tokens, pure OPD rewards, advantages ``-opd_kl_coef * (log p_student - log p_teacher)``
against a teacher recomputed here, finite losses, the resume at the next step and depth.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tools.slime_pr import train_cpu_checks as checks
from tools.slime_pr import train_cpu_engines as engines_mod
from tools.slime_pr.train_cpu_run import CPU_FLAGS, CaseFailed, Run, hf_model_flags, require_ok, run_train, say

# The GPU test's settings (tests/test_qwen3_0.6B_tcod.py: 4 turns, eta 1, so the depth grows 1, 2, 3), with
# 16-token turns and 2 tasks x 2 samples a step.
MAX_TURNS, TURN_LEN, ETA, K_START = 4, 16, 1, 1
FIRST_ROLLOUTS, TOTAL_ROLLOUTS = 2, 3
OPD_KL_COEF = 1.0
NUM_GPUS = 2


def _config(out: Path) -> Path:
    # The keys of examples/multi_turn_tcod/multi_turn_tcod_config.yaml, shrunk.
    path = out / "multi_turn_tcod_config.yaml"
    path.write_text(f"max_turns: {MAX_TURNS}\nmax_turn_response_len: {TURN_LEN}\n"
                    "rollout_interaction_env_path: examples.multi_turn_tcod.envs.gridnav\nenv_step_timeout: 60\n")
    return path


def tcod_flags(*, student: Path, train_data: Path, config: Path, out: Path, mode: str, opd_type: str,
               num_rollout: int, load: Path, save: Path, engine_flags: list[str],
               teacher_megatron: Path | None = None) -> list[str]:
    """The run script's flags (examples/multi_turn_tcod/run-qwen3-8B-tcod.sh) at this size, plus the CPU ones."""
    flags = [*hf_model_flags(student), *CPU_FLAGS,
             "--hf-checkpoint", str(student), "--load", str(load), "--save", str(save), "--save-interval", "1",
             "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
             "--actor-num-nodes", "1", "--actor-num-gpus-per-node", str(NUM_GPUS),
             "--prompt-data", str(train_data), "--input-key", "input", "--label-key", "label",
             "--metadata-key", "metadata", "--rollout-shuffle", "--num-rollout", str(num_rollout),
             "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4",
             "--micro-batch-size", "1", "--seq-length", "2048", "--rollout-max-response-len", "1024",
             "--rollout-temperature", "1.0",
             "--custom-generate-function-path", "examples.multi_turn_tcod.rollout.generate",
             "--custom-config-path", str(config),
             "--custom-rollout-log-function-path", "examples.multi_turn_tcod.metrics.log_rollout_data",
             "--use-tcod", "--tcod-mode", mode, "--tcod-eta", str(ETA),
             "--advantage-estimator", "grpo", "--use-opd", "--opd-type", opd_type, "--opd-kl-coef", str(OPD_KL_COEF),
             "--entropy-coef", "0.0", "--eps-clip", "0.2",
             "--optimizer", "adam", "--lr", "1e-5", "--lr-decay-style", "constant", "--weight-decay", "0.1",
             "--adam-beta1", "0.9", "--adam-beta2", "0.98", "--seed", "1234",
             *engine_flags,
             "--update-weight-transport", "disk", "--update-weight-disk-dir", str(out / "weight_sync"),
             "--save-debug-rollout-data", str(out / "rollout" / "{rollout_id}.pt"),
             # No --ci-test: slime's CI asserts mean log-probs in (-1, 0), which an untrained tiny model is not.
             "--save-debug-train-data", str(out / "train" / "{rollout_id}_{rank}.pt")]
    if opd_type == "sglang":
        flags += ["--custom-rm-path", "slime.rollout.on_policy_distillation.reward_func",
                  "--custom-reward-post-process-path", "slime.rollout.on_policy_distillation.post_process_rewards"]
    else:
        flags += ["--opd-teacher-load", str(teacher_megatron)]
    return flags


def _teacher_megatron(args, env, teacher: Path) -> Path:
    """--opd-type megatron loads the teacher from a Megatron checkpoint: slime's own converter writes it."""
    import subprocess

    dst = args.out / "teacher_torch_dist"
    if (dst / "latest_checkpointed_iteration.txt").is_file():
        return dst
    cmd = [env["TRAIN_CPU_PYTHON"], "-m", "torch.distributed.run", "--nproc-per-node", "1",
           str(args.slime_dir / "tools/convert_hf_to_torch_dist.py"), *hf_model_flags(teacher), *CPU_FLAGS,
           "--hf-checkpoint", str(teacher), "--save", str(dst)]
    log = args.out / "convert_teacher.log"
    with open(log, "w") as fh:
        done = subprocess.run(cmd, cwd=args.out, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=900)
    if done.returncode != 0 or not (dst / "latest_checkpointed_iteration.txt").is_file():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise CaseFailed(f"converting the teacher to a Megatron checkpoint failed (exit {done.returncode}); "
                         f"{log}:\n{tail}")
    return dst


def _check_run(out: Path, run: Run, tokenizer, teacher, *, mode: str, opd_type: str, experts, steps: int,
               loaded_student=None) -> tuple[dict[str, str], dict[int, list[dict]]]:
    """The run's checks by name, and its rollout dumps (the resume check compares two runs' dumps). With
    ``loaded_student`` (the first run: no update yet) the trainer's first log-probs are checked against it."""
    rollouts = checks.load_rollout_dumps(str(out / "rollout" / "{rollout_id}.pt"))
    train = checks.load_train_dumps(str(out / "train" / "{rollout_id}_{rank}.pt"))
    # trained tokens first: an observation trained by mistake also shifts the turns the depth check counts, and
    # this check names it
    found = {"trained": checks.check_trained_tokens(rollouts, tokenizer),
             "depths": checks.check_depths(rollouts, tokenizer, mode=mode, k_start=K_START, eta=ETA, k_max=MAX_TURNS,
                                           max_turns=MAX_TURNS, experts=experts),
             "rewards": checks.check_opd_rewards(rollouts, teacher, opd_type=opd_type),
             "advantages": checks.check_opd_advantages(train, rollouts, teacher, opd_kl_coef=OPD_KL_COEF,
                                                       teacher_in_trainer=opd_type == "megatron"),
             "losses": checks.check_losses_finite(run.text(), min_steps=steps)}
    if loaded_student is not None:
        found["loaded"] = checks.check_trainer_logprobs(train[min(train)], loaded_student)
    return found, rollouts


# slime-engines: slime's RolloutManager starts this many SGLang engines itself, one (fake) GPU each, beside the
# trainer's NUM_GPUS; the CPU settings reach them as slime's --sglang-* flags (slime hands every ServerArgs field it
# finds as args.sglang_<field> to the engine it launches). One: each SGLang server takes ~2.9 GB, and the teacher's
# is a second one (TRAIN_CPU_SLIME_ENGINES=2 runs two behind slime's router).
SLIME_ENGINES = int(os.environ.get("TRAIN_CPU_SLIME_ENGINES", "1"))


def slime_engine_flags() -> list[str]:
    """slime's own flags for engines it launches on a CPU: engines_mod.SGLANG_CPU_ARGS, each under --sglang-."""
    flags, cpu_args = [], list(engines_mod.SGLANG_CPU_ARGS)
    for word in cpu_args:
        if word == "--skip-server-warmup":  # slime always skips the warm-up itself and has no flag for it
            continue
        flags.append("--sglang-" + word[2:] if word.startswith("--") else word)
    return ["--rollout-num-gpus", str(SLIME_ENGINES), "--rollout-num-gpus-per-engine", "1", *flags]


def case_tcod(args, env, *, mode: str, opd_type: str, slime_engines: bool = False) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    student, teacher = engines_mod.make_checkpoints(args.out / "models")
    train_data, _ = engines_mod.make_gridnav_data(args.slime_dir, args.out / "data", max_len=MAX_TURNS)
    experts = checks.expert_actions_by_label(train_data)
    config = _config(args.out)
    teacher_megatron = _teacher_megatron(args, env, teacher) if opd_type == "megatron" else None
    tokenizer = AutoTokenizer.from_pretrained(student)
    teacher_model = AutoModelForCausalLM.from_pretrained(teacher).eval()
    student_model = AutoModelForCausalLM.from_pretrained(student).eval()
    save = args.out / "ckpt"
    num_gpus = NUM_GPUS
    if slime_engines:
        # The engine actors inherit the driver's environment: SGLang's CPU switch reaches them that way.
        env = dict(env, SGLANG_USE_CPU_ENGINE="1")
        num_gpus += SLIME_ENGINES
    with engines_mod.start_engines(student, teacher if opd_type == "sglang" else None, args.out / "engine_logs",
                                   students=0 if slime_engines else 2, engine=args.engine, progress=say,
                                   sglang_python=env["TRAIN_CPU_PYTHON"]) as engines:
        engine_flags = engines_mod.rollout_flags(engines)
        if slime_engines:
            engine_flags = [*engine_flags[engine_flags.index("--rm-url"):], *slime_engine_flags()]
        common = dict(student=student, train_data=train_data, config=config, mode=mode, opd_type=opd_type,
                      save=save, engine_flags=engine_flags, teacher_megatron=teacher_megatron)
        first_out = args.out / "first"
        first = run_train(args, env, Run("first", tcod_flags(out=first_out, num_rollout=FIRST_ROLLOUTS, load=student,
                                                             **common), first_out / "train.log"), num_gpus)
        logs = {f"{e.engine} {e.role}": e.log for e in engines.all}
        require_ok(first, logs)
        first_checks, first_rollouts = _check_run(first_out, first, tokenizer, teacher_model, mode=mode,
                                                   opd_type=opd_type, experts=experts, steps=FIRST_ROLLOUTS,
                                                   loaded_student=student_model)
        latest = save / "latest_checkpointed_iteration.txt"
        saved = int(latest.read_text().strip()) if latest.is_file() else None
        if saved != FIRST_ROLLOUTS - 1:
            raise CaseFailed(f"no checkpoint of rollout {FIRST_ROLLOUTS - 1} under {save} (latest: {saved})")
        resumed_out = args.out / "resumed"
        resumed = run_train(args, env, Run("resumed", tcod_flags(out=resumed_out, num_rollout=TOTAL_ROLLOUTS,
                                                                 load=save, **common), resumed_out / "train.log"),
                            num_gpus)
        require_ok(resumed, logs)
        resumed_checks, resumed_rollouts = _check_run(resumed_out, resumed, tokenizer, teacher_model, mode=mode,
                                                       opd_type=opd_type, experts=experts,
                                                       steps=TOTAL_ROLLOUTS - FIRST_ROLLOUTS)
        resume = checks.check_resume(first_rollouts, resumed_rollouts, saved_step=saved)
    (args.out / "tcod_checks.json").write_text(json.dumps({"first": first_checks, "resumed": resumed_checks,
                                                           "resume": resume}, indent=1))
    return (f"{first_checks['depths']}, resumed {resumed_checks['depths']}; {first_checks['trained']}; "
            f"{first_checks['advantages']}; {first_checks['loaded']}; {resume}; "
            f"train.py {first.seconds + resumed.seconds:.0f}s")


def run_case(case: str):
    """The case function ``train_cpu.CASE_FUNCS`` registers for ``case``: a failed check is the case's FAILED line."""
    mode, opd_type = {"tcod-f2b": ("f2b", "sglang"), "tcod-b2f": ("b2f", "sglang"),
                      "tcod-megatron-teacher": ("b2f", "megatron"), "slime-engines": ("f2b", "sglang")}[case]

    def case_func(args, env):
        if case == "slime-engines" and args.engine != "sglang":
            raise CaseFailed("slime-engines runs the engines slime itself launches, which are SGLang: "
                             "drop --engine hf_engine")
        try:
            return case_tcod(args, env, mode=mode, opd_type=opd_type, slime_engines=case == "slime-engines")
        except checks.CheckFailed as exc:
            raise CaseFailed(str(exc)) from None

    return case_func
