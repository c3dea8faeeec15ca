#!/usr/bin/env bash
# CPU demo of TCOD (arXiv:2604.24005) on tiny models, the project's main job (`make demo`).
#   1. tiny char-level tokenizer + model init, gridnav task files (train / eval, expert length 4..8)
#   2. teacher = SFT on expert trajectories (its full-episode eval success is printed);
#      student = a checkpoint of the same SFT run after far fewer steps (same tokenizer, weaker)
#   3. vanilla OPD, TCOD-F2B and TCOD-B2F from that student with the same teacher (an hf_engine
#      server, --opd-type sglang, as in run-qwen3-8B-tcod.sh), same steps, seeds and batch, in the
#      regime measured to work (docs/en/advanced/opd-regimes.md): one optimizer step per rollout and
#      --opd-loss full (the reverse KL over the teacher's top-20 tokens, not one sampled token)
#   4. table + plot (scripts/tcod_report.py) in OUT_DIR: each method's share of the teacher-student gap, beside
#      the teacher's and the student's held-out success it is computed from
# Environment: PYTHON (default this repository's .venv/bin/python if it exists, else python3), OUT_DIR
# (default outputs/tiny-tcod; a new folder: one that holds a run is refused, never overwritten; written in place, and
# moved to OUT_DIR.partial-* by a run that stops early), STEPS, TEACHER_STEPS, STUDENT_STEPS, BATCH, LR, ETA, SEED, OPD_LOSS (full |
# sampled), EVAL_N, TRAIN_BACKEND (fsdp | megatron: the same runs on the Megatron-core trainer), METHODS
# (default "opd f2b b2f": which of the three distillation runs of phase 4 to make, in that order), ROLLOUT_BACKEND
# (hf_engine | sglang: the students' engines and the teacher as real SGLang servers run by SGLANG_PYTHON, default
# the venv `python -m slime.backends.sglang_utils.sglang_env` builds, once; SGLang's seeds do not repeat on a CPU).
# Evaluation is at the rollout temperature 1.0, the distribution OPD matches (why:
# docs/en/advanced/opd-regimes.md). After SFT it warns when the teacher does not beat the student.
# Measured time: docs/en/demo.md.
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "${SCRIPT_DIR}/.." && pwd)"
# shellcheck source=scripts/find-python.sh
. "${SCRIPT_DIR}/find-python.sh"
find_python run-tiny-tcod.sh torch transformers ray matplotlib
cd "${REPO_DIR}"
OUT_DIR="${OUT_DIR:-outputs/tiny-tcod}"
SEED="${SEED:-0}"
TRAIN_BACKEND="${TRAIN_BACKEND:-fsdp}"
# SFT: each rollout step replays 64 expert episodes and takes 8 optimizer steps of 8 episodes. The script
# prints both checkpoints' full-episode eval success; the measured ones are in docs/en/demo.md (Results).
TEACHER_STEPS="${TEACHER_STEPS:-60}"   # SFT rollout steps of the teacher (480 optimizer steps)
STUDENT_STEPS="${STUDENT_STEPS:-20}"   # the student is the same SFT run's checkpoint after this many
STEPS="${STEPS:-40}"                   # OPD / TCOD steps per method
BATCH="${BATCH:-16}"                   # episodes per OPD step = one optimizer step (global batch)
LR="${LR:-2e-3}"                       # --opd-loss full; sampled OPD at 3e-3 diverged (KL 0.26 -> 0.56)
ETA="${ETA:-3}"                        # TCOD: steps per depth increment (depth reaches 10 at step 27)
OPD_LOSS="${OPD_LOSS:-full}"
MAX_TURNS=10
EVAL_N="${EVAL_N:-96}"
METHODS="${METHODS:-opd f2b b2f}"
ROLLOUT_BACKEND="${ROLLOUT_BACKEND:-hf_engine}"

T_START=${SECONDS}
phase() { printf '\n=== [%4ds] %s\n' "$(( SECONDS - T_START ))" "$*"; }
die() { echo "run-tiny-tcod: $*" >&2; exit 1; }

TEACHER_PID=""
WORK=""          # OUT_DIR while this run writes it; empty once the run has ended
OUT_WAS_EMPTY=0  # OUT_DIR was an empty folder (made by hand) before this run
cleanup() {
  if [ -n "${TEACHER_PID}" ]; then kill "${TEACHER_PID}" 2>/dev/null || true; wait "${TEACHER_PID}" 2>/dev/null || true; fi
  [ -n "${WORK}" ] || return 0
  # The run did not end: what it wrote moves aside, named, never removed, and OUT_DIR is left as it was found.
  local partial
  partial="$(mktemp -d "${OUT_DIR%/}.partial-XXXXXX")"
  if mv -T "${WORK}" "${partial}"; then
    [ "${OUT_WAS_EMPTY}" = 1 ] && mkdir -p "${OUT_DIR}"
    echo "run-tiny-tcod.sh: stopped before the end; OUT_DIR=${OUT_DIR} is as it was, this run's partial outputs" \
      "(logs included; the paths printed above under OUT_DIR) are in ${partial}" >&2
  else
    echo "run-tiny-tcod.sh: stopped before the end; this run's partial outputs are in ${WORK}" >&2
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

read -r -a RUNS <<< "${METHODS}"
for run in "${RUNS[@]}"; do
  case "${run}" in opd | f2b | b2f) ;; *) echo "run-tiny-tcod.sh: METHODS: unknown method '${run}' (choose from: opd f2b b2f)" >&2; exit 2 ;; esac
done
[ "${#RUNS[@]}" -gt 0 ] || { echo "run-tiny-tcod.sh: METHODS is empty (choose from: opd f2b b2f)" >&2; exit 2; }
case "${ROLLOUT_BACKEND}" in
  hf_engine) ENGINE=(--rollout-backend hf_engine --sglang-enable-deterministic-inference) ;;
  # SGLang refuses its deterministic mode on a CPU (docs/en/engines.md): its runs are not repeatable here.
  sglang) ENGINE=(--rollout-backend sglang) ;;
  *) echo "run-tiny-tcod.sh: ROLLOUT_BACKEND: unknown engine '${ROLLOUT_BACKEND}' (choose from: hf_engine sglang)" >&2; exit 2 ;;
esac
# The student is a checkpoint of the teacher's own SFT run, so it must come first.
[ "${STUDENT_STEPS}" -lt "${TEACHER_STEPS}" ] \
  || { echo "run-tiny-tcod.sh: STUDENT_STEPS (${STUDENT_STEPS}) must be below TEACHER_STEPS (${TEACHER_STEPS})" >&2; exit 2; }
# A demo never removes a run: a used OUT_DIR is refused. This run writes into OUT_DIR itself, so every path it
# prints is where the file stays; a run that stops early moves its outputs to OUT_DIR.partial-XXXXXX (named on
# the way out) and leaves OUT_DIR as it was.
if [ -e "${OUT_DIR}" ] && { [ ! -d "${OUT_DIR}" ] || [ -n "$(ls -A "${OUT_DIR}")" ]; }; then
  n=2; while [ -e "${OUT_DIR%/}-${n}" ]; do n=$(( n + 1 )); done
  echo "run-tiny-tcod.sh: OUT_DIR=${OUT_DIR} already holds a run, which is kept: run again with OUT_DIR=${OUT_DIR%/}-${n}, or remove that folder first" >&2
  exit 2
fi
[ -d "${OUT_DIR}" ] && OUT_WAS_EMPTY=1
mkdir -p "${OUT_DIR}"
WORK="${OUT_DIR%/}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ "${ROLLOUT_BACKEND}" = sglang ]; then  # SGLang pins its own torch: served from a venv of its own
  SGLANG_PYTHON="${SGLANG_PYTHON:-$("${PYTHON}" -m slime.backends.sglang_utils.sglang_env)}" \
    || die "no Python to serve SGLang (see above); set SGLANG_PYTHON"
  ENGINE+=(--sglang-python "${SGLANG_PYTHON}")
fi

# ---------------------------------------------------------------- 1. init + data
phase "1/5 tiny tokenizer + model init, gridnav tasks"
"${PYTHON}" -m slime.utils.tiny_models --out "${WORK}/init" --hidden-size 64 --num-layers 2 --num-heads 4 \
  --seed "${SEED}" > /dev/null
# Paths of 4..8 moves under a 10-turn limit: every episode has room to recover from a wrong move.
GRID=(--env gridnav --size 6 --walls 0 --min-len 4 --max-len 8)
# Held-out puzzles: the eval file leaves out every training puzzle (two seeds can deal the same grid).
"${PYTHON}" -m examples.agent_envs.make_data "${GRID[@]}" --n 512 --seed 0 --out "${WORK}/train.jsonl"
"${PYTHON}" -m examples.agent_envs.make_data "${GRID[@]}" --n "${EVAL_N}" --seed 100000 --exclude "${WORK}/train.jsonl" \
  --out "${WORK}/eval.jsonl"

COMMON=(
  --train-backend "${TRAIN_BACKEND}"
  --prompt-data "${WORK}/train.jsonl" --rollout-shuffle --seed "${SEED}" --rollout-seed "${SEED}"
  --rollout-interaction-env-path examples.agent_envs
  --custom-generate-function-path examples.multi_turn_tcod.rollout.generate
  --max-turns "${MAX_TURNS}" --max-turn-response-len 8 --rollout-max-response-len 480
  --eval-prompt-data gridnav "${WORK}/eval.jsonl" --eval-temperature 1.0
  # hf_engine: batch-invariant engines, a rerun with the same seeds repeats every figure (docs/en/engines.md).
  "${ENGINE[@]}"
)

# ---------------------------------------------------------------- 2. teacher + student by SFT
phase "2/5 SFT on expert trajectories: teacher (${TEACHER_STEPS} steps), student (checkpoint at ${STUDENT_STEPS})"
"${PYTHON}" train.py "${COMMON[@]}" --hf-checkpoint "${WORK}/init" \
  --loss-type sft_loss --rollout-function-path slime.rollout.sft_rollout.generate_rollout \
  --rollout-batch-size 64 --global-batch-size 8 --micro-batch-size 8 --lr 3e-3 --num-rollout "${TEACHER_STEPS}" \
  --save "${WORK}/sft" --save-interval "${STUDENT_STEPS}" \
  --eval-interval "${STUDENT_STEPS}" --skip-eval-before-train
ckpt() { printf '%s/sft/iter_%07d/model/hf' "${WORK}" "$(( $1 - 1 ))"; }
TEACHER="$(ckpt "${TEACHER_STEPS}")"
STUDENT="$(ckpt "${STUDENT_STEPS}")"
[ -d "${TEACHER}" ] && [ -d "${STUDENT}" ] || die "SFT checkpoints missing under sft/ of this run's folder"
# The SFT run evaluated every STUDENT_STEPS steps: at the student's checkpoint and at the teacher's. The
# helper prints both and warns (stderr) when the teacher is not ahead: the runs below would distil nothing.
read -r TEACHER_SUCCESS STUDENT_SUCCESS <<< "$("${PYTHON}" -m scripts.sft_eval "${WORK}/sft/metrics.jsonl" \
  --teacher-step "$(( TEACHER_STEPS - 1 ))" --student-step "$(( STUDENT_STEPS - 1 ))" --tasks "${EVAL_N}")"
[ -n "${STUDENT_SUCCESS}" ] || die "no SFT evaluation in sft/metrics.jsonl of this run's folder"
# Rounded for people; the SFT run's metrics.jsonl keeps every digit, and the report gets them all.
round2() { LC_ALL=C printf '%.2f' "$1"; }
echo "full-episode eval success (temperature 1.0, ${EVAL_N} held-out tasks): teacher $(round2 "${TEACHER_SUCCESS}")," \
  "student $(round2 "${STUDENT_SUCCESS}")"

# ---------------------------------------------------------------- 3. teacher server
phase "3/5 teacher server (${ROLLOUT_BACKEND}, SGLang protocol)"
# A port SGLang can take too (its gRPC port, this one + 10000, must exist).
PORT="$("${PYTHON}" -c "from slime.backends.sglang_utils.launcher import find_free_port; print(find_free_port())")"
# Served as train.py serves its engines (SGLang: its CPU settings, and it dies with this script).
"${PYTHON}" -m slime.backends.sglang_utils.serve "${ENGINE[@]}" --hf-checkpoint "${TEACHER}" --port "${PORT}" \
  --seed "${SEED}" > "${WORK}/teacher_server.log" 2>&1 &
TEACHER_PID=$!
"${PYTHON}" -m slime.backends.sglang_utils.wait_healthy --port "${PORT}" --pid "${TEACHER_PID}" --timeout 600 \
  || die "teacher server did not come up; see teacher_server.log in this run's folder"

# ---------------------------------------------------------------- 4. OPD, F2B, B2F
OPD=(
  "${COMMON[@]}" --hf-checkpoint "${STUDENT}" --rollout-batch-size "${BATCH}" --micro-batch-size 8
  --global-batch-size "${BATCH}" --num-rollout "${STEPS}" --lr "${LR}" --rollout-temperature 1.0
  # The student's start is the SFT run's evaluation of this same checkpoint: not repeated per run.
  # One evaluation, at the end: each costs about as much as five training steps.
  --eval-interval "${STEPS}" --skip-eval-before-train
  --use-opd --opd-loss "${OPD_LOSS}" --opd-type sglang --rm-url "http://127.0.0.1:${PORT}/generate"
  --custom-rm-path slime.rollout.on_policy_distillation.reward_func
  --custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards
)
declare -A RUN_ARGS=(
  [opd]=""
  [f2b]="--use-tcod --tcod-mode f2b --tcod-eta ${ETA}"
  [b2f]="--use-tcod --tcod-mode b2f --tcod-eta ${ETA} --tcod-prefix-source expert"
)
declare -A RUN_NAME=([opd]="vanilla OPD" [f2b]="TCOD-F2B" [b2f]="TCOD-B2F")
i=0
REPORT_RUNS=()
for run in "${RUNS[@]}"; do
  i=$(( i + 1 ))
  phase "4/5 (${i}/${#RUNS[@]}) ${run}: ${STEPS} steps x ${BATCH} episodes, --opd-loss ${OPD_LOSS}"
  REPORT_RUNS+=(--run "${RUN_NAME[${run}]}" "${WORK}/${run}/metrics.jsonl")
  # shellcheck disable=SC2086  # RUN_ARGS values are flag lists
  "${PYTHON}" train.py "${OPD[@]}" ${RUN_ARGS[${run}]} --metrics-dir "${WORK}/${run}"
done

# ---------------------------------------------------------------- 5. report
phase "5/5 table and plot"
"${PYTHON}" -m scripts.tcod_report "${REPORT_RUNS[@]}" --teacher-success "${TEACHER_SUCCESS}" \
  --start-eval "${STUDENT_SUCCESS}" --eval-tasks "${EVAL_N}" \
  --md "${WORK}/table.md" --png "${WORK}/tcod-tiny.png"
METRICS=(); for run in sft "${RUNS[@]}"; do METRICS+=("${OUT_DIR%/}/${run}/metrics.jsonl"); done
echo "metrics, every digit: ${METRICS[*]}"
WORK=""  # the run has ended: its outputs stay in OUT_DIR
phase "done in $(( SECONDS - T_START )) s; outputs in ${OUT_DIR}"
