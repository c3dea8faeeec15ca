#!/usr/bin/env bash
# The CPU demo (`make demo`, scripts/run-tiny-tcod.sh) as written, once per seed: the figures of
# docs/en/demo.md#results come from here. Every other variable (STEPS, BATCH, TEACHER_STEPS, ...) passes
# through to the demo script unchanged, so a variant is measured the same way.
#   SEEDS     seeds to run (default "0 1 2"), one after another: wall times are only comparable alone
#   OUT_ROOT  default outputs/demo-seeds; seed N writes OUT_ROOT/seedN (the demo's OUT_DIR)
# Each seed's wall time and /proc/loadavg before and after go to OUT_ROOT/wall_and_load.txt; then
# benchmarks/demo_seeds_report.py prints the table (teacher, student, each method's held-out success and
# the share of the teacher-student gap it closed; mean +- sd over the seeds) into OUT_ROOT/table.md.
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO_DIR}"
# shellcheck source=scripts/find-python.sh
. scripts/find-python.sh
find_python demo_seeds.sh torch transformers ray matplotlib
SEEDS="${SEEDS:-0 1 2}"
OUT_ROOT="${OUT_ROOT:-outputs/demo-seeds}"
mkdir -p "${OUT_ROOT}"
LOG="${OUT_ROOT}/wall_and_load.txt"
: > "${LOG}"
for seed in ${SEEDS}; do
  start=${SECONDS}
  load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
  SEED="${seed}" OUT_DIR="${OUT_ROOT}/seed${seed}" PYTHON="${PYTHON}" bash scripts/run-tiny-tcod.sh \
    > "${OUT_ROOT}/seed${seed}.log" 2>&1 || { echo "demo_seeds.sh: seed ${seed} failed; see ${OUT_ROOT}/seed${seed}.log" >&2; exit 1; }
  echo "seed ${seed}: wall $(( SECONDS - start )) s, loadavg before ${load_before}, after $(cut -d' ' -f1-3 /proc/loadavg)" \
    | tee -a "${LOG}"
done
# shellcheck disable=SC2086  # SEEDS is a list
"${PYTHON}" benchmarks/demo_seeds_report.py --out-root "${OUT_ROOT}" --seeds ${SEEDS} | tee "${OUT_ROOT}/table.md"
