#!/usr/bin/env bash
# Proof harness of the adaptive-KL pull request (THUDM/slime #2387); run through verify.sh --pr adaptive-kl.
#
#   tools/slime_pr/verify.sh --pr adaptive-kl SLIME_DIR
#
# SLIME_DIR (an upstream checkout) is only read. In a temp dir:
#   1. pristine/ and ported/ copies; `port.py --pr adaptive-kl` on ported/, then again (must change nothing);
#      also on a copy that holds the TCOD PR first (port.py without --pr), where it must apply as well;
#   2. upstream's pinned linters (black, isort, ruff, autoflake at upstream's config) on every Python file
#      the PR adds or edits, in ported/;
#   3. upstream's CPU CI as GitHub runs it (cpu_ci.py --pr adaptive-kl: Python 3.10, each CPU job's pip list,
#      `python tests/FILE`): every file passing on pristine still passes, the PR's CPU tests end in `N passed`;
#   4. with nothing new asked, ppo / grpo / reinforce_plus_plus(_baseline) advantages, returns and KL are
#      bit-identical between pristine/ and ported/ (kl_bit_identity.py, in the CPU-CI venv);
#   5. sizes: added lines under slime/ (<= 300) and in all (<= 1,500), from a diff of the two trees.
# Environment: PYTHON, KEEP_TMP=1, and cpu_ci.py's (CPU_CI_CACHE, CPU_CI_PARALLEL, CPU_CI_TIMEOUT, ...).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
say() { printf '%s\n' "$*"; }
step() { printf '\n== %s\n' "$*"; }
die() { printf 'verify_adaptive_kl.sh: ERROR: %s\n' "$*" >&2; exit 2; }

[[ $# -eq 1 && -d "$1" ]] || die "usage: verify.sh --pr adaptive-kl SLIME_DIR"
SLIME_DIR="$(cd "$1" && pwd -P)"
[[ -f "$SLIME_DIR/slime/backends/megatron_utils/loss.py" ]] || die "$SLIME_DIR is not an upstream slime tree"
[[ ! -e "$SLIME_DIR/slime/utils/kl_controller.py" ]] || die "$SLIME_DIR holds slime/utils/kl_controller.py already"
PYTHON="${PYTHON:-}"
[[ -n "$PYTHON" ]] || { [[ -x "$REPO/.venv/bin/python" ]] && PYTHON="$REPO/.venv/bin/python" || PYTHON=python3; }
DRIVER="$HERE/contracts.py"

TMP="$(mktemp -d /tmp/slime-kl-verify.XXXXXX)"
cleanup() { if [[ "${KEEP_TMP:-0}" == "1" ]]; then say "kept $TMP"; else rm -rf "$TMP"; fi; }
trap cleanup EXIT
say "SLIME_DIR: $SLIME_DIR ($(git -C "$SLIME_DIR" rev-parse --short=12 HEAD 2>/dev/null || echo 'no git'))"
say "temp dir: $TMP"

PORT=FAILED IDEMPOTENT=no AFTER_TCOD="not run" LINT="not run" CPU_CI="not run" IDENTICAL="not run" SIZES="not run"
RC=0
summary() {
    say "verify.sh --pr adaptive-kl SUMMARY: port $PORT, idempotent $IDEMPOTENT, after TCOD $AFTER_TCOD |" \
        "linters: $LINT | CPU CI: $CPU_CI | defaults bit-identical: $IDENTICAL | sizes: $SIZES | RESULT: $1"
}

# ---- 1. port -------------------------------------------------------------------------------------------
step "copies and port.py --pr adaptive-kl"
for copy in pristine ported tcod; do "$PYTHON" "$DRIVER" copy-tree "$SLIME_DIR" "$TMP/$copy" >/dev/null; done
cd "$REPO"
if "$PYTHON" "$HERE/port.py" --pr adaptive-kl --no-commit "$TMP/ported" | sed 's/^/  | /'; then PORT=ok; else
    summary FAILED
    exit 1
fi
FIRST="$("$PYTHON" "$DRIVER" digest "$TMP/ported")"
"$PYTHON" "$HERE/port.py" --pr adaptive-kl --no-commit "$TMP/ported" | sed 's/^/  | /'
[[ "$("$PYTHON" "$DRIVER" digest "$TMP/ported")" == "$FIRST" ]] && IDEMPOTENT=yes || RC=1

step "after the TCOD PR: port.py, then port.py --pr adaptive-kl"
if ! "$PYTHON" "$HERE/port.py" --no-commit "$TMP/tcod" >"$TMP/tcod-port.log" 2>&1; then
    AFTER_TCOD="not checked (the TCOD port failed: $(tail -1 "$TMP/tcod-port.log"))"
elif "$PYTHON" "$HERE/port.py" --pr adaptive-kl --no-commit "$TMP/tcod" | sed 's/^/  | /'; then
    AFTER_TCOD=ok
    for rel in slime/backends/megatron_utils/loss.py slime/backends/megatron_utils/actor.py; do
        cmp -s "$TMP/ported/$rel" "$TMP/tcod/$rel" || { AFTER_TCOD="FAILED ($rel differs)"; RC=1; }
    done
else
    AFTER_TCOD=FAILED
    RC=1
fi
say "after TCOD: $AFTER_TCOD"

# ---- 2. linters ----------------------------------------------------------------------------------------
step "upstream's pinned linters on the files the PR adds or edits"
mapfile -t PYFILES < <("$PYTHON" -c "
import sys; sys.path.insert(0, '$REPO')
from tools.slime_pr import manifest_adaptive_kl as m
print('\n'.join(sorted({*m.python_files(), *(f for f in m.EDITED_FILES if f.endswith('.py'))})))")
MISSING="$("$PYTHON" -c "
import sys; sys.path.insert(0, '$REPO')
from tools.slime_pr import lint; print(' '.join(lint.missing_linters()))")"
if [[ -n "$MISSING" ]]; then
    LINT="not run (install $MISSING)"
    RC=1
else
    CFG="$HERE/upstream_lint/pyproject.toml"
    cd "$TMP/ported"
    FINDINGS=0
    "$PYTHON" -m black --config "$CFG" --check -q "${PYFILES[@]}" || FINDINGS=$((FINDINGS + 1))
    "$PYTHON" -m isort --settings-path "$CFG" --filter-files --check-only -q "${PYFILES[@]}" || FINDINGS=$((FINDINGS + 1))
    "$PYTHON" -m ruff check --config "$CFG" -q "${PYFILES[@]}" || FINDINGS=$((FINDINGS + 1))
    "$PYTHON" -m autoflake --remove-all-unused-imports --check "${PYFILES[@]}" >/dev/null || FINDINGS=$((FINDINGS + 1))
    cd "$REPO"
    if [[ $FINDINGS -eq 0 ]]; then LINT="clean (${#PYFILES[@]} files)"; else LINT="FAILED ($FINDINGS linter(s))"; RC=1; fi
fi
say "linters: $LINT"

# ---- 3. CPU CI -----------------------------------------------------------------------------------------
step "upstream's CPU CI jobs as GitHub runs them (cpu_ci.py --pr adaptive-kl)"
CI_RC=0
"$PYTHON" "$HERE/cpu_ci.py" run --pr adaptive-kl --pristine "$TMP/pristine" --ported "$TMP/ported" --work "$TMP/cpu-ci" \
    --summary "$TMP/cpu-ci-summary" || CI_RC=$?
CPU_CI="$(cat "$TMP/cpu-ci-summary" 2>/dev/null || echo 'did not complete')"
[[ $CI_RC -eq 0 ]] || { CPU_CI="FAILED: $CPU_CI"; RC=1; }

# ---- 4. bit-identical defaults -------------------------------------------------------------------------
step "defaults bit-identical: advantages, returns and KL of pristine/ and ported/"
VENV_PY="$(ls -d "$TMP"/cpu-ci/venv-cpu-unittest-ported/bin/python 2>/dev/null || true)"
[[ -n "$VENV_PY" ]] || VENV_PY="$PYTHON"
for t in pristine ported; do
    PYTHONPATH="$TMP/$t" "$VENV_PY" "$HERE/kl_bit_identity.py" dump "$TMP/$t" "$TMP/identity-$t.pt" || true
done
if "$VENV_PY" "$HERE/kl_bit_identity.py" compare "$TMP/identity-pristine.pt" "$TMP/identity-ported.pt"; then
    IDENTICAL=yes
else
    IDENTICAL=NO
    RC=1
fi

# ---- 5. sizes ------------------------------------------------------------------------------------------
step "sizes"
read -r CORE ALL < <(git diff --no-index --numstat "$TMP/pristine" "$TMP/ported" 2>/dev/null |
    awk '$0 !~ /pr-test\.yml|_cache/ {all += $1; if ($0 ~ /ported[}]?\/slime\//) core += $1} END {print core + 0, all + 0}')
SIZES="$CORE added under slime/ (<= 300), $ALL in all (<= 1500; rendered pr-test.yml not counted)"
((CORE <= 300 && ALL <= 1500)) || { SIZES="FAILED: $SIZES"; RC=1; }
say "$SIZES"

step "summary"
if [[ $RC -eq 0 ]]; then summary OK; else summary FAILED; fi
exit $RC
