#!/usr/bin/env bash
# The CPU demo's numbers under the knobs that change float rounding between machines (issue: the demo on
# another machine). Each variant runs scripts/run-tiny-tcod.sh as written, SFT and vanilla OPD only
# (METHODS=opd: the demo's headline), once per seed; benchmarks/demo_variants_report.py then compares each run
# with the recorded one (benchmarks/results/demo_3seeds): from which SFT step the numbers part, and the spread
# of the headline (the share of the teacher-student gap vanilla OPD closes) over seeds and variants.
#   VARIANTS  default "native threads2 avx2":
#             native   this machine as the demo runs (the recorded runs' setting: a check that they repeat)
#             threads2 OMP_NUM_THREADS=2 (the trainer's and the teacher's kernels split over 2 threads)
#             avx2     ATEN_CPU_CAPABILITY=avx2 (the AVX2 kernels of a CPU without AVX-512)
#   SEEDS     default "0 1 2"; OUT_ROOT default outputs/demo-variants (VARIANT/seedN is the demo's OUT_DIR)
# Runs one after another; the report goes to OUT_ROOT/table.md. Nothing here is timed.
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO_DIR}"
# shellcheck source=scripts/find-python.sh
. scripts/find-python.sh
find_python demo_variants.sh torch transformers ray matplotlib
VARIANTS="${VARIANTS:-native threads2 avx2}"
SEEDS="${SEEDS:-0 1 2}"
OUT_ROOT="${OUT_ROOT:-outputs/demo-variants}"
variant_env() {
  case "$1" in
    native) echo "" ;;
    threads2) echo "OMP_NUM_THREADS=2" ;;
    avx2) echo "ATEN_CPU_CAPABILITY=avx2" ;;
    *) echo "demo_variants.sh: unknown variant '$1' (choose from: native threads2 avx2)" >&2; return 2 ;;
  esac
}
for variant in ${VARIANTS}; do variant_env "${variant}" > /dev/null || exit 2; done
for variant in ${VARIANTS}; do
  for seed in ${SEEDS}; do
    out="${OUT_ROOT}/${variant}/seed${seed}"
    if [ -d "${out}" ]; then echo "${variant} seed ${seed}: kept from an earlier run (${out})"; continue; fi
    mkdir -p "${OUT_ROOT}/${variant}"
    # shellcheck disable=SC2046  # variant_env prints NAME=VALUE words for env
    env $(variant_env "${variant}") SEED="${seed}" METHODS=opd OUT_DIR="${out}" PYTHON="${PYTHON}" \
      bash scripts/run-tiny-tcod.sh > "${out}.log" 2>&1 \
      || { echo "demo_variants.sh: ${variant} seed ${seed} failed; see ${out}.log" >&2; exit 1; }
    echo "${variant} seed ${seed}: done"
  done
done
# shellcheck disable=SC2086  # lists
"${PYTHON}" benchmarks/demo_variants_report.py --out-root "${OUT_ROOT}" --variants ${VARIANTS} --seeds ${SEEDS} --with-recorded \
  | tee "${OUT_ROOT}/table.md"
