#!/usr/bin/env bash
# When does TCOD's curriculum help (issue 24)? regime {tuned, official, unstable} x method {opd, f2b, b2f} x paired
# seeds on one setting, as a thin driver over benchmarks/tcod_vs_opd.sh (same SFT, teacher server, flags).
#   SETTING=gridnav-long STUDENT_STEPS=20 bash benchmarks/tcod_regimes.sh    # the settings in
#   SETTING=hanoi STEPS=48 LABEL=hanoi-48 bash benchmarks/tcod_regimes.sh    # docs/en/benchmarks.md
# (hanoi needs 48 rollout steps for tuned vanilla OPD to gain 10 points; its 24-step grid is LABEL=hanoi.)
# Regimes (episodes per rollout : optimizer batch : lr : --opd-loss):
#   tuned     16 : 16 : 1e-3 : full     (one optimizer step per rollout; the tcod_vs_opd.sh default)
#   official  16 :  4 : 1e-3 : sampled  (4 optimizer steps per rollout: the official configs take 16 tasks per
#                                        explore step in PPO updates of 64 turn-level experiences, i.e.
#                                        16 x turns / 64 = 2.6 (gridnav-long, ~10 turns) to ~7 (30 turns) steps)
#   unstable  32 :  2 : 1e-3 : sampled  (16 optimizer steps per rollout; docs/en/advanced/opd-regimes.md
#                                        measured vanilla OPD's trajectory KL to rise and eval to fall)
# Every regime runs STEPS rollouts (default 24) from the same student with the same teacher, tasks and eval.
# 1. teacher + student: TEACHER/STUDENT if given, else one SFT run (tcod_vs_opd.sh with no seeds);
#    their eval success: TEACHER_SUCCESS/STUDENT_SUCCESS if given, else measured once.
# 2. seed-major: for each seed, for each regime, every method (a cut-short sweep keeps whole seeds).
#    Each run's /proc/loadavg before/after is kept; one jsonl row per run (flags, seed, load, per-step
#    series) is appended to benchmarks/results/tcod_regimes/LABEL.jsonl (rerunning a seed replaces it).
# 3. report: python benchmarks/tcod_regimes_report.py (all settings' jsonl files).
# Environment: SETTING, SEEDS ("0 1 2 3 4"), METHODS ("opd f2b b2f"), REGIMES ("tuned official unstable"), STEPS,
# TUNED / OFFICIAL / UNSTABLE (episodes:global_batch:lr:loss), PYTHON, LABEL (SETTING), OUT_ROOT (outputs/tcod-regimes/LABEL),
# TEACHER, STUDENT, TEACHER_SUCCESS, STUDENT_SUCCESS, NO_REPORT=1.
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO_DIR}"
export PYTHON="${PYTHON:-python3}"
SETTING="${SETTING:-gridnav-long}"
SEEDS="${SEEDS:-0 1 2 3 4}"
METHODS="${METHODS:-opd f2b b2f}"
REGIMES="${REGIMES:-tuned official unstable}"
export STEPS="${STEPS:-24}"
TUNED="${TUNED:-16:16:1e-3:full}"
OFFICIAL="${OFFICIAL:-16:4:1e-3:sampled}"
UNSTABLE="${UNSTABLE:-32:2:1e-3:sampled}"
# LABEL names the results file (and its report section): one setting can have grids with different students.
LABEL="${LABEL:-${SETTING}}"
OUT_ROOT="${OUT_ROOT:-outputs/tcod-regimes/${LABEL}}"
RESULTS="benchmarks/results/tcod_regimes/${LABEL}.jsonl"
mkdir -p "${OUT_ROOT}" "$(dirname "${RESULTS}")"
T_START=${SECONDS}
phase() { printf '\n##### [%5ds] tcod_regimes %s: %s\n' "$(( SECONDS - T_START ))" "${SETTING}" "$*"; }
echo "tcod_regimes start $(date -u +%FT%TZ) loadavg $(cat /proc/loadavg)" | tee -a "${OUT_ROOT}/loadavg.log"

if [ -z "${TEACHER:-}" ] || [ -z "${STUDENT:-}" ] || [ -z "${TEACHER_SUCCESS:-}" ] || [ -z "${STUDENT_SUCCESS:-}" ]; then
  phase "teacher + student (SFT unless TEACHER/STUDENT given) and their eval success"
  # SEEDS=" " (not empty: empty means the default seeds there) runs no OPD run.
  SETTING="${SETTING}" SEEDS=" " NO_REPORT=1 OUT_DIR="${OUT_ROOT}/base" bash benchmarks/tcod_vs_opd.sh
  if [ -z "${TEACHER:-}" ] || [ -z "${STUDENT:-}" ]; then
    ckpt() { printf '%s/base/sft/iter_%07d/model/hf' "${OUT_ROOT}" "$(( $1 - 1 ))"; }
    TEACHER="$(ckpt "${TEACHER_STEPS:-90}")"; STUDENT="$(ckpt "${STUDENT_STEPS:-30}")"
  fi
  read -r TEACHER_SUCCESS STUDENT_SUCCESS < <(sed -E 's/.*teacher ([0-9.]+), student ([0-9.]+).*/\1 \2/' \
    "${OUT_ROOT}/base/sft_eval.txt")
fi
export TEACHER STUDENT TEACHER_SUCCESS STUDENT_SUCCESS
echo "teacher ${TEACHER} (${TEACHER_SUCCESS}), student ${STUDENT} (${STUDENT_SUCCESS})" | tee "${OUT_ROOT}/models.txt"

for seed in ${SEEDS}; do
  # touch OUT_ROOT/STOP to end the sweep after the seed in progress (whole seeds only).
  if [ -e "${OUT_ROOT}/STOP" ]; then phase "STOP file found: not starting seed ${seed}"; break; fi
  for regime in ${REGIMES}; do
    case "${regime}" in
      tuned) spec="${TUNED}" ;;
      official) spec="${OFFICIAL}" ;;
      unstable) spec="${UNSTABLE}" ;;
      *) echo "tcod_regimes: unknown regime ${regime}" >&2; exit 2 ;;
    esac
    IFS=: read -r episodes gbs lr loss <<< "${spec}"
    phase "seed ${seed}, regime ${regime} (${episodes} episodes : batch ${gbs} : lr ${lr} : ${loss})"
    SETTING="${SETTING}" SEEDS="${seed}" METHODS="${METHODS}" BATCH="${episodes}" GLOBAL_BATCH="${gbs}" LR="${lr}" \
      OPD_LOSS="${loss}" NO_REPORT=1 OUT_DIR="${OUT_ROOT}/${regime}" bash benchmarks/tcod_vs_opd.sh
    for method in ${METHODS}; do
      "${PYTHON}" benchmarks/tcod_regimes_report.py row --results "${RESULTS}" \
        --run-dir "${OUT_ROOT}/${regime}/seed${seed}/${method}" --setting "${SETTING}" --regime "${regime}" \
        --method "${method}" --seed "${seed}" --episodes "${episodes}" --global-batch "${gbs}" --lr "${lr}" \
        --opd-loss "${loss}" --steps "${STEPS}" --teacher "${TEACHER}" --student "${STUDENT}" \
        --teacher-success "${TEACHER_SUCCESS}" --student-success "${STUDENT_SUCCESS}" \
        || echo "tcod_regimes: could not record ${regime}/seed${seed}/${method} (rebuild from its metrics.jsonl)" >&2
    done
  done
done
echo "tcod_regimes end $(date -u +%FT%TZ) loadavg $(cat /proc/loadavg)" | tee -a "${OUT_ROOT}/loadavg.log"
if [ "${NO_REPORT:-0}" != 1 ]; then
  phase "report"
  "${PYTHON}" benchmarks/tcod_regimes_report.py report
fi
phase "done in $(( SECONDS - T_START )) s"
