#!/usr/bin/env bash
# Proof harness for the upstream contribution: port it onto a copy of an upstream slime tree and run
# upstream's own CPU tests and plugin contracts against it.
#
#   tools/slime_pr/verify.sh SLIME_DIR
#
# SLIME_DIR is an upstream THUDM/slime checkout (git repo or plain tree); it is only read. In a temp dir:
#   1. pristine/ and ported/ copies of SLIME_DIR; port.py applied to ported/, then run again, which must
#      change nothing (tree checksum before/after);
#   2. PYTHON made able to import what upstream's CPU tests import (missing light packages pip-installed
#      into PYTHON, said so; never ray/sglang/torch);
#   3. upstream's tests/test_sample.py, tests/test_rollout_metrics.py, tests/test_megatron_argument_validation.py
#      (slime_validate_args, which the PR edits) and tests/plugin_contracts/ run on
#      ported/ with SLIME_CONTRACT_* pointed at this contribution's hooks, and on pristine/ with upstream's
#      own counterpart hooks; each test classified PASS / FAIL-SHARED / FAIL-OURS (contracts.py has the
#      rules);
#   3b. upstream's CPU CI jobs as GitHub runs them (cpu_ci.py): a Python 3.10 virtualenv per CPU job of
#      pr-test.yml.j2 (cpu-unittest, agent-test) with exactly the job's pip lines, read from the template,
#      built once and cached under ${XDG_CACHE_HOME:-~/.cache}/slime-tcod/cpu-ci (torch from PyPI when
#      download.pytorch.org cannot be reached: the CUDA build, ~4.6 GB, runs on CPU); then, on copies of
#      pristine/ and ported/, `pip install -e . --no-deps` and `python tests/FILE` from the tree's root for
#      every file those jobs register: the ported tree must pass every file the pristine one passes, and
#      the PR's CPU tests (registered in cpu-unittest by port.py) must end in `N passed`, nothing skipped;
#   4. tools/slime_pr/smoke.py ported/, if that script exists;
#   5. verify_pr.py: the caps (the example's Python <= 1,000 lines, <= 150 lines added under slime/, the
#      whole PR <= 2,500 added lines), no PR line naming this repository's runtime (file:line per hit),
#      upstream's linters, the PR's tests as CI registers them (NUM_GPUS, runner, no conftest.py), links; verify_objective.py (both teacher modes train pure
#      OPD through upstream's reward post-processing and advantages, as this runtime does) and, with
#      MEGATRON_LM_DIR set, check_launch_flags.py.
# Exit status 0 only if every step passed (no FAIL-OURS, no other test failure, smoke ok).
#
# Environment:
#   PYTHON               interpreter (default: this repo's .venv/bin/python, else python3)
#   KEEP_TMP=1           keep the temp dir (its path is printed)
#   VERIFY_NO_INSTALL=1  never pip-install; fail listing what is missing
#   SMOKE_TIMEOUT        seconds for smoke.py (default 900)
#   VERIFY_PYTEST_TIMEOUT  seconds for each pytest run of upstream's tests (default 600)
#   PORT_PY              port script to use instead of port.py (for developing this harness)
#   PY310                the Python 3.10 of the CPU-CI step (default: python3.10 on PATH, else pyenv's 3.10.x)
#   CPU_CI_CACHE         where the CPU-CI venvs are cached (default ${XDG_CACHE_HOME:-~/.cache}/slime-tcod/cpu-ci)
#   CPU_CI_REBUILD=1     rebuild them; CPU_CI_TORCH  torch pin when torch comes from PyPI (default torch==2.13.0)
#   CPU_CI_TIMEOUT       seconds for each `python tests/FILE` of the CPU-CI step (default 1800)
#   CPU_CI_PARALLEL      files run at a time in the CPU-CI step (default 2)
#   MEGATRON_LM_DIR      a Megatron-LM tree at upstream's pinned commit: also check the launch flags
#   SGLANG_SERVER_ARGS   an sglang wheel (or its server_args.py) for the --sglang-* flags of that check
set -euo pipefail

# --pr adaptive-kl: the adaptive-KL PR has its own harness; --pr tcod (or no --pr): this one.
if [[ "${1:-}" == "--pr" ]]; then
    case "${2:-}" in
    adaptive-kl) exec bash "$(dirname "${BASH_SOURCE[0]}")/verify_adaptive_kl.sh" "${@:3}" ;;
    tcod) shift 2 ;;
    *) printf 'verify.sh: --pr takes tcod or adaptive-kl\n' >&2; exit 2 ;;
    esac
fi

VERIFIED_COMMIT=624b824a898ab0ec1fcb4d373004c7f3852bf515
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
REL_HERE="tools/slime_pr"

say() { printf '%s\n' "$*"; }
step() { printf '\n== %s\n' "$*"; }
die() { printf 'verify.sh: ERROR: %s\n' "$*" >&2; exit 2; }

usage() {
    cat >&2 <<EOF
usage: $REL_HERE/verify.sh SLIME_DIR

Ports this contribution onto a copy of the upstream slime tree SLIME_DIR (never modified) and runs
upstream's own CPU tests and plugin contracts against it. Verified against upstream commit
$VERIFIED_COMMIT. See the header of this script for environment variables.
EOF
    exit "${1:-2}"
}

if [[ $# -eq 1 && ( "$1" == "-h" || "$1" == "--help" ) ]]; then usage 0; fi
[[ $# -eq 1 ]] || usage

# ---- SLIME_DIR -----------------------------------------------------------------------------------------
[[ -n "$1" ]] || usage
[[ -e "$1" ]] || die "SLIME_DIR '$1' does not exist"
[[ -d "$1" ]] || die "SLIME_DIR '$1' is not a directory"
SLIME_DIR="$(cd "$1" && pwd -P)"
[[ "$SLIME_DIR" != "$(cd "$REPO" && pwd -P)" ]] ||
    die "SLIME_DIR is this project ($REPO), not an upstream slime tree"
for f in slime/__init__.py slime/utils/arguments.py slime/utils/types.py slime/rollout/sglang_rollout.py \
    tests/test_sample.py tests/test_rollout_metrics.py tests/plugin_contracts/_shared.py; do
    [[ -f "$SLIME_DIR/$f" ]] ||
        die "SLIME_DIR '$SLIME_DIR' is not an upstream slime tree (no $f); pass a THUDM/slime checkout"
done
for f in slime/rollout/tcod.py examples/multi_turn_tcod; do
    [[ ! -e "$SLIME_DIR/$f" ]] ||
        die "SLIME_DIR already has $f: it looks ported already; pass an unmodified upstream tree"
done

PYTHON="${PYTHON:-}"
if [[ -z "$PYTHON" ]]; then
    if [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON="python3"; fi
fi
command -v "$PYTHON" >/dev/null 2>&1 || die "PYTHON '$PYTHON' not found"
PY_VERSION="$("$PYTHON" -c 'import sys; print(sys.version.split()[0])')" || die "PYTHON '$PYTHON' does not run"

step "upstream tree"
say "SLIME_DIR: $SLIME_DIR"
UPSTREAM_COMMIT=""
if git -C "$SLIME_DIR" rev-parse --show-toplevel >/dev/null 2>&1 &&
    [[ "$(cd "$(git -C "$SLIME_DIR" rev-parse --show-toplevel)" && pwd -P)" == "$SLIME_DIR" ]]; then
    UPSTREAM_COMMIT="$(git -C "$SLIME_DIR" rev-parse HEAD)"
    say "upstream commit: $UPSTREAM_COMMIT"
    if [[ "$UPSTREAM_COMMIT" != "$VERIFIED_COMMIT" ]]; then
        say "WARNING: this contribution was verified against $VERIFIED_COMMIT; SLIME_DIR is at another commit"
    fi
    if [[ -n "$(git -C "$SLIME_DIR" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
        say "WARNING: SLIME_DIR has uncommitted changes; verifying its working tree as it is"
    fi
else
    say "upstream commit: unknown (not a git checkout); this contribution was verified against $VERIFIED_COMMIT"
fi
say "PYTHON: $PYTHON (Python $PY_VERSION)"

PORT_PY="${PORT_PY:-$HERE/port.py}"
[[ -f "$PORT_PY" ]] || die "port script not found: $PORT_PY"
DRIVER="$HERE/contracts.py"
[[ -f "$DRIVER" ]] || die "driver not found: $DRIVER"

# ---- temp dir (outside the repo) -----------------------------------------------------------------------
TMP_BASE="${TMPDIR:-/tmp}"
case "$(cd "$TMP_BASE" && pwd -P)/" in
"$(cd "$REPO" && pwd -P)"/*) TMP_BASE=/tmp ;;
esac
TMP="$(mktemp -d "$TMP_BASE/slime-tcod-verify.XXXXXX")"
cleanup() {
    if [[ "${KEEP_TMP:-0}" == "1" ]]; then
        say "kept temp dir (KEEP_TMP=1): $TMP"
    else
        rm -rf "$TMP"
    fi
}
trap cleanup EXIT
say "temp dir: $TMP"

SLIME_DIR_DIGEST="$("$PYTHON" "$DRIVER" digest "$SLIME_DIR")"

COMMIT_SHORT="${UPSTREAM_COMMIT:0:12}"
COMMIT_SHORT="${COMMIT_SHORT:-unknown}"
PORT="not run"
IDEMPOTENT="not checked"
DEPS_OK="not checked"
CONTRACTS_SUMMARY="not run"
CPU_CI="not run"
SMOKE="not run"
PR_CHECKS="not run"
OBJECTIVE="not run"
LAUNCH="not run"
summary() { # the last line of every run that got this far
    say "verify.sh SUMMARY: upstream $COMMIT_SHORT | port $PORT, idempotent $IDEMPOTENT | deps $DEPS_OK |" \
        "upstream tests: $CONTRACTS_SUMMARY | CPU CI: $CPU_CI | smoke: $SMOKE | PR checks: $PR_CHECKS | objective: $OBJECTIVE |" \
        "launch flags: $LAUNCH | RESULT: $1"
}
fail() { # an error after which nothing else can be checked
    printf 'verify.sh: ERROR: %s\n' "$*" >&2
    step "summary"
    summary FAILED
    exit 1
}

# ---- 1. copies and port --------------------------------------------------------------------------------
step "copies and port.py"
for copy in pristine ported; do
    "$PYTHON" "$DRIVER" copy-tree "$SLIME_DIR" "$TMP/$copy" >/dev/null || fail "could not copy SLIME_DIR to $copy/"
done
say "pristine/ and ported/ copied"
PRISTINE_DIGEST="$("$PYTHON" "$DRIVER" digest "$TMP/pristine")"

cd "$REPO"
say "\$ $PYTHON ${PORT_PY#"$REPO"/} $TMP/ported"
if ! "$PYTHON" "$PORT_PY" "$TMP/ported" 2>&1 | sed 's/^/  | /'; then
    PORT=FAILED
    fail "port.py failed on a fresh copy of SLIME_DIR (output above)"
fi
PORT=ok
PORTED_DIGEST="$("$PYTHON" "$DRIVER" digest "$TMP/ported")"
if [[ "$PORTED_DIGEST" == "$PRISTINE_DIGEST" ]]; then
    PORT="changed nothing"
    fail "port.py changed nothing in ported/"
fi
cp -a "$TMP/ported" "$TMP/ported.first-run"

say "\$ $PYTHON ${PORT_PY#"$REPO"/} $TMP/ported   # again: must change nothing"
if ! "$PYTHON" "$PORT_PY" "$TMP/ported" 2>&1 | sed 's/^/  | /'; then
    IDEMPOTENT="no (second run failed)"
    fail "port.py failed when run a second time on the ported tree (it must be idempotent)"
fi
SECOND_DIGEST="$("$PYTHON" "$DRIVER" digest "$TMP/ported")"
if [[ "$SECOND_DIGEST" == "$PORTED_DIGEST" ]]; then
    IDEMPOTENT=yes
    say "idempotent: yes (tree checksum ${PORTED_DIGEST:0:16} before and after the second run)"
else
    IDEMPOTENT=no
    say "idempotent: NO (tree checksum ${PORTED_DIGEST:0:16} -> ${SECOND_DIGEST:0:16})"
    say "changed by the second run:"
    (diff -rq -x __pycache__ "$TMP/ported.first-run" "$TMP/ported" || true) | sed 's/^/  /' | head -40
fi

# ---- 2. dependencies -----------------------------------------------------------------------------------
step "python dependencies of upstream's CPU tests"
DEPS_OK=yes
"$PYTHON" "$DRIVER" deps --tree "$TMP/pristine" || DEPS_OK=no

# ---- 3. upstream tests and contracts -------------------------------------------------------------------
step "upstream's CPU tests and plugin contracts"
CONTRACTS_RC=0
"$PYTHON" "$DRIVER" matrix --pristine "$TMP/pristine" --ported "$TMP/ported" --work "$TMP/work" \
    --summary "$TMP/contracts-summary" || CONTRACTS_RC=$?
CONTRACTS_SUMMARY="$(cat "$TMP/contracts-summary" 2>/dev/null || echo "did not complete")"

# ---- 3b. upstream's CPU CI jobs, in their own Python 3.10 environment ----------------------------------
step "upstream's CPU CI jobs as GitHub runs them (Python 3.10, each job's pip list, python tests/FILE)"
CPU_CI_RC=0
CPU_CI_START=$SECONDS
"$PYTHON" "$HERE/cpu_ci.py" run --pristine "$TMP/pristine" --ported "$TMP/ported" --work "$TMP/cpu-ci" \
    --summary "$TMP/cpu-ci-summary" || CPU_CI_RC=$?
CPU_CI="$(cat "$TMP/cpu-ci-summary" 2>/dev/null || echo "did not complete")"
CPU_CI="$CPU_CI ($((SECONDS - CPU_CI_START))s)"
[[ $CPU_CI_RC -eq 0 ]] || CPU_CI="FAILED: $CPU_CI"

# ---- 4. smoke ------------------------------------------------------------------------------------------
step "smoke"
SMOKE="not run (no $REL_HERE/smoke.py)"
SMOKE_RC=0
if [[ -f "$HERE/smoke.py" ]]; then
    say "\$ $PYTHON $REL_HERE/smoke.py $TMP/ported"
    set +e
    mkdir -p "$TMP/smoke-tmp" # smoke.py's own temp folders land here and go with ours
    TMPDIR="$TMP/smoke-tmp" timeout --kill-after=30 "${SMOKE_TIMEOUT:-900}" \
        "$PYTHON" "$REL_HERE/smoke.py" "$TMP/ported"
    SMOKE_RC=$?
    set -e
    if [[ $SMOKE_RC -eq 124 ]]; then SMOKE="TIMED OUT after ${SMOKE_TIMEOUT:-900}s"; else SMOKE="exit $SMOKE_RC"; fi
    say "smoke.py: $SMOKE"
else
    say "$SMOKE"
fi

# ---- 5. the PR as a maintainer reads it, and the objective it trains ----------------------------------
step "the PR: size, upstream's linters, its CPU tests, its links"
PR_RC=0
"$PYTHON" "$HERE/verify_pr.py" "$TMP/pristine" "$TMP/ported" | tee "$TMP/verify_pr.log" || PR_RC=${PIPESTATUS[0]}
PR_CHECKS="$([[ $PR_RC -eq 0 ]] && echo ok || echo FAILED)"
# The caps' counts go into the summary line (verify_pr.py prints them last but one).
COUNTS="$(sed -n 's/^verify_pr.py counts: //p' "$TMP/verify_pr.log")"
[[ -z "$COUNTS" ]] || PR_CHECKS="$PR_CHECKS ($COUNTS)"

step "same objective: both teacher modes train pure OPD, upstream and here"
OBJECTIVE_RC=0
"$PYTHON" "$HERE/verify_objective.py" "$TMP/ported" || OBJECTIVE_RC=$?
OBJECTIVE="$([[ $OBJECTIVE_RC -eq 0 ]] && echo ok || echo FAILED)"

LAUNCH="not run (set MEGATRON_LM_DIR to a Megatron-LM tree at upstream's pinned commit)"
LAUNCH_RC=0
if [[ -n "${MEGATRON_LM_DIR:-}" && -f "$HERE/check_launch_flags.py" ]]; then
    step "the launch script's and the GPU test's flags against upstream's parsers"
    SGLANG_OPT=()
    [[ -n "${SGLANG_SERVER_ARGS:-}" ]] && SGLANG_OPT=(--sglang-server-args "$SGLANG_SERVER_ARGS")
    "$PYTHON" "$HERE/check_launch_flags.py" "$TMP/ported" --megatron-dir "$MEGATRON_LM_DIR" "${SGLANG_OPT[@]}" ||
        LAUNCH_RC=$?
    LAUNCH="$([[ $LAUNCH_RC -eq 0 ]] && echo ok || echo FAILED)"
fi

# ---- summary -------------------------------------------------------------------------------------------
step "summary"
SLIME_DIR_UNCHANGED=yes
[[ "$("$PYTHON" "$DRIVER" digest "$SLIME_DIR")" == "$SLIME_DIR_DIGEST" ]] || SLIME_DIR_UNCHANGED=no
[[ $SLIME_DIR_UNCHANGED == yes ]] || say "WARNING: SLIME_DIR changed while this ran (not by this harness's copies)"

RESULT=OK
[[ $IDEMPOTENT == yes && $DEPS_OK == yes && $CONTRACTS_RC -eq 0 && $CPU_CI_RC -eq 0 && $SMOKE_RC -eq 0 &&
    $PR_RC -eq 0 &&
    $OBJECTIVE_RC -eq 0 && $LAUNCH_RC -eq 0 ]] || RESULT=FAILED
summary "$RESULT"
[[ $RESULT == OK ]]
