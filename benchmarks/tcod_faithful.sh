#!/usr/bin/env bash
# TCOD tested on its own premise (issue 33): the official objective with turn-matched updates and a depth
# ramp over ~72% of training, compared only on settings where vanilla OPD's per-turn KL is first shown to
# grow with turn depth. A thin driver over benchmarks/tcod_vs_opd.sh (same SFT, teacher server, agent loop).
#   SETTING=gridnav-walls bash benchmarks/tcod_faithful.sh     # or SETTING=hanoi-4, gridnav-long, gridnav-xl
# Phases; each one resumes (what a previous call finished is read back, not rerun):
#   1. base  SFT teacher + student and their held-out success; eval puzzles disjoint from training ones
#   2. gate  vanilla OPD for GATE_STEPS steps on GATE_SEEDS -> benchmarks/tcod_premise.py -> gate.json.
#            A failed gate ends the setting: nothing is compared on it (the verdict is its result)
#   3. lr    vanilla OPD on seed 0 at each of LRS; the best final eval among runs whose trajectory KL fell is
#            fixed for every method (lr.txt)
#   4. grid  seed by seed, opd f2b b2f; each run's row is appended to RESULTS_DIR/LABEL.jsonl (one row per
#            setting, method and seed: a rerun replaces it)
#   5. report benchmarks/tcod_faithful_report.py (all settings' rows)
# Objective, as the official configs: slime's sampled OPD term (--opd-loss sampled, --opd-kl-coef 1), one
# optimizer step per batch of TURNS trained student turns (--turns-per-step, every method), the loss averaged
# over the step's tokens, old log-probs recomputed by the trainer; ETA so that k reaches K_MAX at RAMP (0.72) of
# STEPS; evaluation on held-out puzzles at temperature 1.0 and, from the final checkpoint, 0.4 (the official eval
# temperature).
# Environment: SETTING, SEEDS ("0 1 2 3 4"), STEPS (42), TURNS (64), K_MAX (16), RAMP (0.72), LRS
# ("3e-4 1e-3 3e-3"), LR (skip phase 3), GATE_SEEDS ("0 1 2"), GATE_STEPS (3), PYTHON, LABEL (SETTING), OUT_ROOT
# (outputs/tcod-faithful/LABEL), RESULTS_DIR (benchmarks/results/tcod_premise), TEACHER_STEPS / STUDENT_STEPS
# (SFT, 90 / 30), NO_REPORT_FAITHFUL=1.
# Touch OUT_ROOT/STOP to stop after the seed in progress.
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO_DIR}"
export PYTHON="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
SETTING="${SETTING:-gridnav-xl}"
SEEDS="${SEEDS:-0 1 2 3 4}"
STEPS="${STEPS:-42}"
TURNS="${TURNS:-64}"
K_MAX="${K_MAX:-16}"
RAMP="${RAMP:-0.72}"
LRS="${LRS:-3e-4 1e-3 3e-3}"
GATE_SEEDS="${GATE_SEEDS:-0 1 2}"
GATE_STEPS="${GATE_STEPS:-3}"
# LABEL names the results (default SETTING): one setting can be gated again with another teacher.
LABEL="${LABEL:-${SETTING}}"
OUT_ROOT="${OUT_ROOT:-outputs/tcod-faithful/${LABEL}}"
RESULTS_DIR="${RESULTS_DIR:-benchmarks/results/tcod_premise}"
RESULTS="${RESULTS_DIR}/${LABEL}.jsonl"
# k(n) = 1 + n // eta reaches K_MAX at n = (K_MAX - 1) * eta: the largest eta that gets there by RAMP x STEPS.
ETA="$("${PYTHON}" -c "import sys; print(max(1, int(float(sys.argv[1]) * int(sys.argv[2]) // (int(sys.argv[3]) - 1))))" \
  "${RAMP}" "${STEPS}" "${K_MAX}")"
mkdir -p "${OUT_ROOT}" "$(dirname "${RESULTS}")"
T_START=${SECONDS}
phase() { printf '\n##### [%5ds] tcod_faithful %s: %s\n' "$(( SECONDS - T_START ))" "${SETTING}" "$*"; }
# Every OPD run of every phase: the same objective and budget, only the method, seed, steps and lr vary.
export OPD_LOSS=sampled EVAL_TEMPERATURE=1.0 SAVE_FINAL=1 FINAL_EVAL_TEMPERATURES=0.4 ETA NO_REPORT=1
# --calculate-per-token-loss: the step's loss is the mean over its trained tokens, as Trinity-RFT's default
# token-mean over a batch of turn-level experiences (the official layout), whatever episodes they came from.
export EXTRA_ARGS="--turns-per-step ${TURNS} --opd-kl-coef 1.0 --tcod-k-max ${K_MAX} --calculate-per-token-loss"
phase "STEPS ${STEPS}, TURNS ${TURNS} per step, eta ${ETA} (k reaches ${K_MAX} at step $(( (K_MAX - 1) * ETA )))"

phase "1. base: teacher + student"
if [ ! -s "${OUT_ROOT}/base/sft_eval.txt" ]; then
  SETTING="${SETTING}" SEEDS=" " OUT_DIR="${OUT_ROOT}/base" bash benchmarks/tcod_vs_opd.sh
fi
ckpt() { printf '%s/base/sft/iter_%07d/model/hf' "${OUT_ROOT}" "$(( $1 - 1 ))"; }
export TEACHER="${TEACHER:-$(ckpt "${TEACHER_STEPS:-90}")}" STUDENT="${STUDENT:-$(ckpt "${STUDENT_STEPS:-30}")}"
read -r TEACHER_SUCCESS STUDENT_SUCCESS < <(sed -E 's/.*teacher ([0-9.]+), student ([0-9.]+).*/\1 \2/' \
  "${OUT_ROOT}/base/sft_eval.txt")
export TEACHER_SUCCESS STUDENT_SUCCESS
phase "teacher ${TEACHER_SUCCESS}, student ${STUDENT_SUCCESS} on held-out puzzles"

# Runs of one method and seed under OUT_ROOT/NAME; skipped when their final eval is already there.
opd_runs() {  # NAME STEPS LR SEEDS METHODS
  local name="$1" steps="$2" lr="$3" seeds="$4" methods="$5" seed method todo
  for seed in ${seeds}; do
    todo=""
    for method in ${methods}; do
      [ -s "${OUT_ROOT}/${name}/seed${seed}/${method}/eval_T0.4.txt" ] || todo="${todo} ${method}"
    done
    [ -z "${todo}" ] && continue
    SETTING="${SETTING}" SEEDS="${seed}" METHODS="${todo# }" STEPS="${steps}" LR="${lr}" \
      OUT_DIR="${OUT_ROOT}/${name}" bash benchmarks/tcod_vs_opd.sh
  done
}

phase "2. gate: vanilla OPD's per-turn KL against turn depth, first ${GATE_STEPS} steps, seeds ${GATE_SEEDS}"
GATE_LR="${LR:-1e-3}"
opd_runs gate "${GATE_STEPS}" "${GATE_LR}" "${GATE_SEEDS}" opd
gate_runs=(); for seed in ${GATE_SEEDS}; do gate_runs+=("${OUT_ROOT}/gate/seed${seed}/opd"); done
if ! "${PYTHON}" benchmarks/tcod_premise.py --runs "${gate_runs[@]}" --first-steps "${GATE_STEPS}" \
    --teacher-success "${TEACHER_SUCCESS}" --student-success "${STUDENT_SUCCESS}" \
    --out "${RESULTS_DIR}/${LABEL}_gate.json"; then
  phase "the premise gate failed: no method is compared on ${SETTING}"
  exit 0
fi

phase "3. lr: vanilla OPD on seed 0 at ${LRS}"
if [ -z "${LR:-}" ]; then
  if [ ! -s "${OUT_ROOT}/lr.txt" ]; then
    for lr in ${LRS}; do opd_runs "lr${lr}" "${STEPS}" "${lr}" 0 opd; done
    # Every rate's numbers go to the results beside the gate (LABEL_lr.txt), learned or not.
    if ! "${PYTHON}" benchmarks/tcod_faithful_report.py pick-lr --root "${OUT_ROOT}" --lrs ${LRS} \
        --student-success "${STUDENT_SUCCESS}" 2> "${RESULTS_DIR}/${LABEL}_lr.txt" > "${OUT_ROOT}/lr.txt"; then
      rm -f "${OUT_ROOT}/lr.txt"
      cat "${RESULTS_DIR}/${LABEL}_lr.txt" >&2
      phase "vanilla OPD learned at no lr of ${LRS}: no method is compared on ${SETTING}"
      exit 0
    fi
  fi
  LR="$(cat "${OUT_ROOT}/lr.txt")"
fi
phase "lr ${LR} for every method"

phase "4. grid: seeds ${SEEDS}"
for seed in ${SEEDS}; do
  if [ -e "${OUT_ROOT}/STOP" ]; then phase "STOP file found: not starting seed ${seed}"; break; fi
  opd_runs grid "${STEPS}" "${LR}" "${seed}" "opd f2b b2f"
  for method in opd f2b b2f; do
    "${PYTHON}" benchmarks/tcod_faithful_report.py row --results "${RESULTS}" \
      --run-dir "${OUT_ROOT}/grid/seed${seed}/${method}" --setting "${LABEL}" --method "${method}" --seed "${seed}" \
      --lr "${LR}" --steps "${STEPS}" --turns "${TURNS}" --eta "${ETA}" --k-max "${K_MAX}" \
      --teacher-success "${TEACHER_SUCCESS}" --student-success "${STUDENT_SUCCESS}"
  done
done

if [ "${NO_REPORT_FAITHFUL:-0}" != 1 ]; then
  phase "5. report"
  "${PYTHON}" benchmarks/tcod_faithful_report.py report --results-dir "${RESULTS_DIR}"
fi
phase "done"
