#!/usr/bin/env bash
# TCOD vs vanilla OPD over several seeds on one built-in environment (issue 8, item 1).
# Calls train.py exactly as scripts/run-tiny-tcod.sh does (same SFT recipe for the
# teacher/student, same OPD flags, same hf_engine teacher server); only the environment, the seeds,
# the step budget and the output layout are chosen here. Per setting:
#   1. teacher + student: reused from TEACHER/STUDENT (dirs of HF checkpoints) if both are given,
#      else one SFT run on expert trajectories (teacher = last checkpoint, student = early one)
#   2. one teacher server for all runs; for each seed: vanilla OPD, TCOD-F2B, TCOD-B2F
#      (seed-major order, so a cut-short sweep still has whole seeds)
#   3. benchmarks/tcod_vs_opd_report.py: mean +- std table and plots
# OPD runs in the regime measured to work (docs/en/advanced/opd-regimes.md): one optimizer step per
# rollout (global batch = BATCH episodes), evaluated at the rollout temperature 1.0 that OPD matches.
# Environment: SETTING (gridnav | hanoi | gridnav-long | hanoi-4 | hanoi-4-wide | gridnav-xl | gridnav-walls),
# SEEDS ("0 1 2 3 4"), STEPS, ETA, BATCH, LR, EVAL_INTERVAL (default STEPS: one evaluation, at the end), EVAL_N
# (held-out tasks, default 96; hanoi-4 48, hanoi-4-wide 64),
# EVAL_TEMPERATURE (default 1.0), OPD_LOSS (full | sampled, default full as in the demo), METHODS
# (default "opd f2b b2f"; b2ft = B2F with the teacher's own episode as prefix, expert paths hidden),
# TEACHER_STEPS, STUDENT_STEPS, TEACHER, STUDENT, LABEL (names the outputs and results, default
# SETTING), OUT_DIR (default outputs/tcod-vs-opd/LABEL). For benchmarks/tcod_regimes.sh: GLOBAL_BATCH
# (optimizer batch in episodes, default BATCH: one step per rollout), TEACHER_SUCCESS + STUDENT_SUCCESS
# (both given with TEACHER/STUDENT: skip their evaluation), NO_REPORT=1 (skip the report). Every run
# records /proc/loadavg before and after it in its metrics dir (loadavg.txt). For benchmarks/tcod_faithful.sh:
# EXTRA_ARGS (more train.py flags for every OPD run, e.g. "--turns-per-step 64"), SAVE_FINAL=1 (keep the last
# step's checkpoint under RUN_DIR/ckpt, for evaluations at other temperatures), N_TRAIN (training tasks,
# default 512; hanoi-4 and hanoi-4-wide 150), FINAL_EVAL_TEMPERATURES (with SAVE_FINAL=1: also evaluate the last
# checkpoint at each of these into RUN_DIR/eval_T{t}.txt), EVAL_EXCLUDE (default 1: the eval file leaves out every training puzzle, by label and first
# observation; 0 reproduces the published rows, whose eval sets repeated training puzzles: hanoi's 96 of 96,
# gridnav's about half; 3-disk hanoi has too few distinct puzzles for a disjoint eval set).
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO_DIR}"
PYTHON="${PYTHON:-python3}"
SETTING="${SETTING:-gridnav}"
LABEL="${LABEL:-${SETTING}}"
OUT_DIR="${OUT_DIR:-outputs/tcod-vs-opd/${LABEL}}"
SEEDS="${SEEDS:-0 1 2 3 4}"
STEPS="${STEPS:-24}"
ETA="${ETA:-1}"
BATCH="${BATCH:-16}"
GLOBAL_BATCH="${GLOBAL_BATCH:-${BATCH}}"
LR="${LR:-1e-3}"
OPD_LOSS="${OPD_LOSS:-full}"
EVAL_INTERVAL="${EVAL_INTERVAL:-${STEPS}}"
TEACHER_STEPS="${TEACHER_STEPS:-90}"
STUDENT_STEPS="${STUDENT_STEPS:-30}"
MAX_TURNS=10
TURN_LEN=8      # tokens per student turn: the longest action plus <|im_end|> must fit
RESPONSE_LEN=480
case "${SETTING}" in
  gridnav)      ENV_ARGS=(--env gridnav --size 6 --walls 0 --min-len 4 --max-len 8) ;;
  gridnav-long) ENV_ARGS=(--env gridnav --size 8 --walls 0 --min-len 7 --max-len 10); MAX_TURNS=14 ;;
  # "move A B" is 8 tokens, so 9 with <|im_end|>; a turn is ~55 tokens with its observation.
  hanoi)        ENV_ARGS=(--env hanoi --disks 3 --start random --min-len 2 --max-len 7); TURN_LEN=12
                RESPONSE_LEN=640 ;;
  # Long horizons for TCOD's premise (benchmarks/tcod_faithful.sh): 4 disks, up to the 15-move optimum.
  # Only 162 such puzzles exist (81 positions x 3 target pegs, 8+ moves): 150 training rows leave ~50 held out.
  hanoi-4)      ENV_ARGS=(--env hanoi --disks 4 --start random --min-len 8 --max-len 15); TURN_LEN=12
                MAX_TURNS=20; RESPONSE_LEN=1280; SETTING_N_TRAIN=150; SETTING_EVAL_N=48 ;;
  # 4 disks from 4 moves up: 216 puzzles, the shorter ones learnable by a tiny student.
  hanoi-4-wide) ENV_ARGS=(--env hanoi --disks 4 --start random --min-len 4 --max-len 15); TURN_LEN=12
                MAX_TURNS=20; RESPONSE_LEN=1280; SETTING_N_TRAIN=150; SETTING_EVAL_N=64 ;;
  gridnav-xl)   ENV_ARGS=(--env gridnav --size 10 --walls 0 --min-len 12 --max-len 16); MAX_TURNS=20
                RESPONSE_LEN=720 ;;
  # Walls (20% of the cells): the map is shown once, in the first observation; a wrong turn can lead into a
  # dead end, so the student's errors can compound where the open grids' cannot.
  gridnav-walls) ENV_ARGS=(--env gridnav --size 8 --walls 0.2 --min-len 7 --max-len 10); MAX_TURNS=14
                RESPONSE_LEN=720 ;;
  *) echo "tcod_vs_opd: unknown SETTING ${SETTING}" >&2; exit 2 ;;
esac
N_TRAIN="${N_TRAIN:-${SETTING_N_TRAIN:-512}}"
EVAL_N="${EVAL_N:-${SETTING_EVAL_N:-96}}"

T_START=${SECONDS}
phase() { printf '\n=== [%4ds] %s: %s\n' "$(( SECONDS - T_START ))" "${SETTING}" "$*"; }
die() { echo "tcod_vs_opd: $*" >&2; exit 1; }
TEACHER_PID=""
cleanup() { if [ -n "${TEACHER_PID}" ]; then kill "${TEACHER_PID}" 2>/dev/null || true; wait "${TEACHER_PID}" 2>/dev/null || true; fi; }
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "${OUT_DIR}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

phase "tasks (train seeds 0.., eval seeds 100000..)"
"${PYTHON}" -m examples.agent_envs.make_data "${ENV_ARGS[@]}" --n "${N_TRAIN}" --seed 0 \
  --out "${OUT_DIR}/train.jsonl"
EXCLUDE=(); if [ "${EVAL_EXCLUDE:-1}" = 1 ]; then EXCLUDE=(--exclude "${OUT_DIR}/train.jsonl"); fi
"${PYTHON}" -m examples.agent_envs.make_data "${ENV_ARGS[@]}" --n "${EVAL_N}" --seed 100000 \
  "${EXCLUDE[@]}" --out "${OUT_DIR}/eval.jsonl"
# The same training tasks with their expert paths removed, for B2F with the teacher's own prefix (b2ft).
"${PYTHON}" -c "
import json, sys
with open(sys.argv[1]) as src, open(sys.argv[2], 'w') as dst:
    for line in src:
        row = json.loads(line); row.pop('expert_actions', None); (row.get('metadata') or {}).pop('expert_actions', None)
        dst.write(json.dumps(row) + '\\n')
" "${OUT_DIR}/train.jsonl" "${OUT_DIR}/train_noexpert.jsonl"
# The run-tiny-tcod.sh flags minus the seeds, which vary per run below.
base_args() {
  printf '%s\n' --prompt-data "${OUT_DIR}/train.jsonl" --rollout-shuffle \
    --rollout-interaction-env-path examples.agent_envs \
    --custom-generate-function-path examples.multi_turn_tcod.rollout.generate \
    --max-turns "${MAX_TURNS}" --max-turn-response-len "${TURN_LEN}" --rollout-max-response-len "${RESPONSE_LEN}" \
    --eval-prompt-data "${SETTING}" "${OUT_DIR}/eval.jsonl" --eval-temperature "${EVAL_TEMPERATURE:-1.0}"
}
mapfile -t BASE < <(base_args)

if [ -n "${TEACHER:-}" ] && [ -n "${STUDENT:-}" ]; then
  phase "reusing teacher ${TEACHER} and student ${STUDENT}"
else
  phase "SFT: teacher ${TEACHER_STEPS} steps, student = checkpoint at ${STUDENT_STEPS}"
  "${PYTHON}" -m slime.utils.tiny_models --out "${OUT_DIR}/init" --hidden-size 64 --num-layers 2 --num-heads 4 \
    --seed 0 > /dev/null
  rm -rf "${OUT_DIR}/sft"
  "${PYTHON}" train.py "${BASE[@]}" --seed 0 --rollout-seed 0 --hf-checkpoint "${OUT_DIR}/init" \
    --loss-type sft_loss --rollout-function-path slime.rollout.sft_rollout.generate_rollout \
    --rollout-batch-size 64 --global-batch-size 8 --micro-batch-size 8 --lr 3e-3 --num-rollout "${TEACHER_STEPS}" \
    --save "${OUT_DIR}/sft" --save-interval "${STUDENT_STEPS}" \
    --eval-interval "${STUDENT_STEPS}" --skip-eval-before-train
  ckpt() { printf '%s/sft/iter_%07d/model/hf' "${OUT_DIR}" "$(( $1 - 1 ))"; }
  TEACHER="$(ckpt "${TEACHER_STEPS}")"
  STUDENT="$(ckpt "${STUDENT_STEPS}")"
  [ -d "${TEACHER}" ] && [ -d "${STUDENT}" ] || die "SFT checkpoints missing under ${OUT_DIR}/sft"
fi
# Full-episode eval success of teacher and student, measured here with this setting's rollout flags
# (an evaluation-only train.py call: --num-rollout 0 evaluates at step -1 and trains nothing).
evaluate() {  # NAME MODEL [TEMPERATURE]
  local dir="${OUT_DIR}/eval_$1"
  rm -rf "${dir}"
  "${PYTHON}" train.py "${BASE[@]}" --seed 0 --rollout-seed 0 --hf-checkpoint "$2" --num-rollout 0 \
    ${3:+--eval-temperature "$3"} \
    --eval-interval 1 --metrics-dir "${dir}" > "${dir}.log" 2>&1 || die "evaluation of $2 failed; see ${dir}.log"
  "${PYTHON}" -c "
import sys; from slime.utils.metrics import read_metrics
print(next(v for r in read_metrics(sys.argv[1]) for k, v in r.items() if k.endswith('/success_rate')))
" "${dir}/metrics.jsonl"
}
if [ -n "${TEACHER_SUCCESS:-}" ] && [ -n "${STUDENT_SUCCESS:-}" ]; then
  phase "reusing eval success: teacher ${TEACHER_SUCCESS}, student ${STUDENT_SUCCESS}"
else
phase "evaluating teacher and student (${EVAL_N} tasks, full episodes)"
TEACHER_SUCCESS="$(evaluate teacher "${TEACHER}")"
STUDENT_SUCCESS="$(evaluate student "${STUDENT}")"
fi
echo "full-episode eval success: teacher ${TEACHER_SUCCESS}, student ${STUDENT_SUCCESS}" | tee "${OUT_DIR}/sft_eval.txt"

phase "teacher server"
PORT="$("${PYTHON}" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")"
"${PYTHON}" -m slime.backends.hf_engine --model-path "${TEACHER}" --port "${PORT}" --random-seed 0 \
  > "${OUT_DIR}/teacher_server.log" 2>&1 &
TEACHER_PID=$!
"${PYTHON}" -m slime.backends.sglang_utils.wait_healthy --port "${PORT}" --pid "${TEACHER_PID}" \
  || die "teacher server did not come up; see ${OUT_DIR}/teacher_server.log"

declare -A RUN_ARGS=(
  [opd]=""
  [f2b]="--use-tcod --tcod-mode f2b --tcod-eta ${ETA}"
  [b2f]="--use-tcod --tcod-mode b2f --tcod-eta ${ETA} --tcod-prefix-source expert"
  # B2F whose prefix is the teacher's own episode: expert paths hidden from data and environment.
  [b2ft]="--use-tcod --tcod-mode b2f --tcod-eta ${ETA} --tcod-prefix-source teacher --prompt-data ${OUT_DIR}/train_noexpert.jsonl --rollout-interaction-env-path examples.agent_envs.no_expert"
)
for seed in ${SEEDS}; do
  for run in ${METHODS:-opd f2b b2f}; do
    phase "seed ${seed} ${run}: ${STEPS} steps x ${BATCH} episodes, optimizer batch ${GLOBAL_BATCH}"
    dir="${OUT_DIR}/seed${seed}/${run}"
    rm -rf "${dir}"; mkdir -p "${OUT_DIR}/seed${seed}"
    load_before="$(cat /proc/loadavg)"
    t0=${SECONDS}
    # shellcheck disable=SC2086  # RUN_ARGS values are flag lists
    "${PYTHON}" train.py "${BASE[@]}" --seed "${seed}" --rollout-seed "${seed}" --hf-checkpoint "${STUDENT}" \
      --rollout-batch-size "${BATCH}" --micro-batch-size 8 --global-batch-size "${GLOBAL_BATCH}" --num-rollout "${STEPS}" \
      --lr "${LR}" --rollout-temperature 1.0 --eval-interval "${EVAL_INTERVAL}" --skip-eval-before-train \
      --use-opd --opd-loss "${OPD_LOSS}" --opd-type sglang --rm-url "http://127.0.0.1:${PORT}/generate" \
      --custom-rm-path slime.rollout.on_policy_distillation.reward_func \
      --custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards \
      ${RUN_ARGS[${run}]} ${EXTRA_ARGS:-} ${SAVE_FINAL:+--save "${dir}/ckpt" --save-interval "${STEPS}"} \
      --metrics-dir "${dir}" > "${dir}.log" 2>&1 || die "run failed; see ${dir}.log"
    echo "$(( SECONDS - t0 ))" > "${dir}/process_wall_s.txt"
    # The final policy at other eval temperatures (the official configs evaluate at 0.4).
    for temperature in ${FINAL_EVAL_TEMPERATURES:-}; do
      final="$(ls -d "${dir}"/ckpt/iter_*/model/hf | tail -n 1)"
      evaluate "seed${seed}_${run}_T${temperature}" "${final}" "${temperature}" > "${dir}/eval_T${temperature}.txt"
    done
    printf 'before %s\nafter %s\n' "${load_before}" "$(cat /proc/loadavg)" > "${dir}/loadavg.txt"
  done
done

if [ "${NO_REPORT:-0}" != 1 ]; then
phase "report"
"${PYTHON}" benchmarks/tcod_vs_opd_report.py --dir "${OUT_DIR}" --setting "${LABEL}" \
  --teacher-success "${TEACHER_SUCCESS}" --start-eval "${STUDENT_SUCCESS}"
fi
phase "done in $(( SECONDS - T_START )) s"
