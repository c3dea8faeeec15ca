#!/usr/bin/env bash
# Proof harness of this repository's pull requests for THUDM/slime: port one onto copies of an upstream tree and
# check it as slime's CI and its reviewers would.
#
# usage: tools/slime_pr/verify.sh [--pr tcod|tcod-core-only|adaptive-kl] SLIME_DIR        (the TCOD PR by default)
#
# SLIME_DIR (an upstream checkout; git repo or plain tree) is only read. In a temp dir, each step a script here:
#   1. pristine/ and ported/ copies (trees.py); port.py on ported/, then again: must change nothing (checksums);
#      adaptive-kl: also on a copy that holds the TCOD PR first, where loss.py and actor.py must come out the same;
#   2. tcod: contracts.py: PYTHON made able to import what upstream's CPU tests import, then those tests and its
#      plugin contracts on ported/ with the PR's hooks, on pristine/ with its own: PASS / FAIL-SHARED / FAIL-OURS;
#   3. cpu_ci.py: upstream's CPU CI jobs as GitHub runs them (a cached Python 3.10 venv per job, its pip lines),
#      every registered file on both trees: ported/ passes what pristine/ passes, the PR's own end in `N passed`;
#   4. tcod: smoke.py on ported/ (F2B and B2F through upstream's rollout flow, tiny models on CPU);
#   5. verify_pr.py: the PR's caps, wording, upstream's pinned linters, its tests' registration, its links;
#   6. tcod: verify_objective.py (both teacher modes train pure OPD, upstream and here) and, with MEGATRON_LM_DIR,
#      check_launch_flags.py (the launch script's and GPU test's flags against upstream's parsers);
#   7. adaptive-kl: kl_bit_identity.py (CPU-CI venv): pristine/'s and ported/'s advantages, returns and KL
#      bit-identical when nothing new is asked (ppo, grpo, reinforce_plus_plus(_baseline)).
#   8. opt-in (VERIFY_TRAIN_CPU=1): train_cpu.py, slime's own train.py on CPU: pristine-grpo on pristine/, the
#      PR's cases on ported/ (tcod-f2b, tcod-b2f, tcod-megatron-teacher, slime-engines | kl-adaptive), rolling out
#      on real SGLang 0.5.15.post1 servers (TRAIN_CPU_ENGINE=hf_engine: this repository's stand-in instead).
# tcod-core-only (the getter alone, PR.md's second path) runs steps 1, 3 and 5 (8: pristine-grpo only).
# Exit status 0 only if every step passed; the last line sums them up.
#
# Environment: PYTHON (default: this repo's .venv/bin/python, else python3); KEEP_TMP=1 keeps the temp dir;
# VERIFY_NO_INSTALL=1 never pip-installs (fails listing what is missing); SMOKE_TIMEOUT (s, default 900);
# VERIFY_PYTEST_TIMEOUT (s per pytest run of upstream's tests, default 600); PORT_PY (another port script, to
# develop this harness); the CPU-CI step's PY310 and CPU_CI_CACHE, CPU_CI_REBUILD, CPU_CI_TORCH, CPU_CI_TIMEOUT,
# CPU_CI_PARALLEL (cpu_ci_env.py, cpu_ci.py); MEGATRON_LM_DIR (Megatron-LM at upstream's pinned commit: check the
# launch flags) and SGLANG_SERVER_ARGS (an sglang wheel or its server_args.py, for that check's --sglang-* flags).
# VERIFY_TRAIN_CPU=1 (with MEGATRON_LM_DIR): step 8, slime's own train.py on CPU through train_cpu.py (minutes a case).
set -euo pipefail

VERIFIED_COMMIT=624b824a898ab0ec1fcb4d373004c7f3852bf515
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"

say() { printf '%s\n' "$*"; }
step() { printf '\n== %s\n' "$*"; }
die() { printf 'verify.sh: ERROR: %s\n' "$*" >&2; exit 2; }

usage() { # the header's first lines; the steps and environment variables follow them there
    sed -n '2,7s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2 && exit "${1:-2}"
}

PR=tcod
if [[ "${1:-}" == "--pr" ]]; then
    case "${2:-}" in
    tcod | tcod-core-only | adaptive-kl) PR="$2" && shift 2 ;;
    *) die "--pr takes tcod, tcod-core-only or adaptive-kl" ;;
    esac
fi
case "$PR" in # a tree that holds these is ported already
tcod) PORTED_MARKERS=(slime/rollout/tcod.py examples/multi_turn_tcod) ;;
adaptive-kl) PORTED_MARKERS=(slime/utils/kl_controller.py) ;;
tcod-core-only) PORTED_MARKERS=() ;; # no file of its own: a ported tree fails step 1 ('port changed nothing')
esac
if [[ $# -eq 1 && ("$1" == "-h" || "$1" == "--help") ]]; then usage 0; fi
[[ $# -eq 1 && -n "$1" ]] || usage

# ---- SLIME_DIR and PYTHON ------------------------------------------------------------------------------
[[ -e "$1" ]] || die "SLIME_DIR '$1' does not exist"
[[ -d "$1" ]] || die "SLIME_DIR '$1' is not a directory"
SLIME_DIR="$(cd "$1" && pwd -P)"
[[ "$SLIME_DIR" != "$(cd "$REPO" && pwd -P)" ]] || die "SLIME_DIR is this project ($REPO), not an upstream slime tree"
for f in slime/__init__.py slime/utils/arguments.py slime/utils/types.py slime/rollout/sglang_rollout.py \
    tests/test_sample.py tests/test_rollout_metrics.py tests/plugin_contracts/_shared.py; do
    [[ -f "$SLIME_DIR/$f" ]] || die "SLIME_DIR '$SLIME_DIR' is not an upstream slime tree (no $f); pass a checkout"
done
for f in "${PORTED_MARKERS[@]}"; do
    [[ ! -e "$SLIME_DIR/$f" ]] || die "SLIME_DIR already has $f: it looks ported already; pass an unmodified tree"
done
[[ -n "${PYTHON:-}" ]] || { [[ -x "$REPO/.venv/bin/python" ]] && PYTHON="$REPO/.venv/bin/python" || PYTHON=python3; }
command -v "$PYTHON" >/dev/null 2>&1 || die "PYTHON '$PYTHON' not found"
PY_VERSION="$("$PYTHON" -c 'import sys; print(sys.version.split()[0])')" || die "PYTHON '$PYTHON' does not run"
PORT_PY="${PORT_PY:-$HERE/port.py}"
[[ -f "$PORT_PY" ]] || die "port script not found: $PORT_PY"
TREES=("$PYTHON" "$HERE/trees.py")

step "upstream tree"
say "SLIME_DIR: $SLIME_DIR"
UPSTREAM_COMMIT=""
if git -C "$SLIME_DIR" rev-parse --show-toplevel >/dev/null 2>&1 &&
    [[ "$(cd "$(git -C "$SLIME_DIR" rev-parse --show-toplevel)" && pwd -P)" == "$SLIME_DIR" ]]; then
    UPSTREAM_COMMIT="$(git -C "$SLIME_DIR" rev-parse HEAD)"
    say "upstream commit: $UPSTREAM_COMMIT"
    [[ "$UPSTREAM_COMMIT" == "$VERIFIED_COMMIT" ]] ||
        say "WARNING: this contribution was verified against $VERIFIED_COMMIT; SLIME_DIR is at another commit"
    [[ -z "$(git -C "$SLIME_DIR" status --porcelain --untracked-files=no 2>/dev/null)" ]] ||
        say "WARNING: SLIME_DIR has uncommitted changes; verifying its working tree as it is"
else
    say "upstream commit: unknown (not a git checkout); this contribution was verified against $VERIFIED_COMMIT"
fi
say "PYTHON: $PYTHON (Python $PY_VERSION); PR: $PR"

# ---- temp dir (outside the repo) and the summary -------------------------------------------------------
TMP_BASE="${TMPDIR:-/tmp}"
case "$(cd "$TMP_BASE" && pwd -P)/" in "$(cd "$REPO" && pwd -P)"/*) TMP_BASE=/tmp ;; esac
TMP="$(mktemp -d "$TMP_BASE/slime-pr-verify.XXXXXX")"
trap 'if [[ "${KEEP_TMP:-0}" == "1" ]]; then say "kept temp dir (KEEP_TMP=1): $TMP"; else rm -rf "$TMP"; fi' EXIT
say "temp dir: $TMP"

COMMIT_SHORT="${UPSTREAM_COMMIT:0:12}"
PARTS=("upstream ${COMMIT_SHORT:-unknown}") # "what: result" of every step run, in order
ALL_OK=1
part() { PARTS+=("$1"); } # a step's result
bad() { ALL_OK=0; }       # a step failed
summary() { say "verify.sh --pr $PR SUMMARY:$(printf ' %s |' "${PARTS[@]}") RESULT: $1"; } # the last line
fail() { # an error after which nothing else can be checked
    printf 'verify.sh: ERROR: %s\n' "$*" >&2 && step "summary" && summary FAILED && exit 1
}

# ---- 1. copies and port --------------------------------------------------------------------------------
step "copies and port.py --pr $PR"
COPIES=(pristine ported)
[[ $PR != adaptive-kl ]] || COPIES+=(tcod)
for copy in "${COPIES[@]}"; do
    "${TREES[@]}" copy "$SLIME_DIR" "$TMP/$copy" >/dev/null || fail "could not copy SLIME_DIR to $copy/"
done
say "${COPIES[*]} copied"
PRISTINE_DIGEST="$("${TREES[@]}" digest "$TMP/pristine")"
cd "$REPO"
PORT=("$PYTHON" "$PORT_PY" --pr "$PR")
say "\$ $PYTHON ${PORT_PY#"$REPO"/} --pr $PR $TMP/ported"
if ! "${PORT[@]}" "$TMP/ported" 2>&1 | sed 's/^/  | /'; then
    part "port FAILED"
    fail "port.py failed on a fresh copy of SLIME_DIR (output above)"
fi
PORTED_DIGEST="$("${TREES[@]}" digest "$TMP/ported")"
[[ "$PORTED_DIGEST" != "$PRISTINE_DIGEST" ]] || { part "port changed nothing" && fail "port.py changed nothing"; }
cp -a "$TMP/ported" "$TMP/ported.first-run"
say "\$ $PYTHON ${PORT_PY#"$REPO"/} --pr $PR $TMP/ported   # again: must change nothing"
if ! "${PORT[@]}" "$TMP/ported" 2>&1 | sed 's/^/  | /'; then
    part "port ok, idempotent no (second run failed)"
    fail "port.py failed when run a second time on the ported tree (it must be idempotent)"
fi
if [[ "$("${TREES[@]}" digest "$TMP/ported")" == "$PORTED_DIGEST" ]]; then
    PORT_RESULT="port ok, idempotent yes"
    say "idempotent: yes (tree checksum ${PORTED_DIGEST:0:16} before and after the second run)"
else
    PORT_RESULT="port ok, idempotent no" && bad
    say "idempotent: NO; changed by the second run:"
    (diff -rq -x __pycache__ "$TMP/ported.first-run" "$TMP/ported" || true) | sed 's/^/  /' | head -40
fi

if [[ $PR == adaptive-kl ]]; then
    step "after the TCOD PR: port.py --pr tcod, then port.py --pr adaptive-kl"
    if ! "$PYTHON" "$PORT_PY" --pr tcod "$TMP/tcod" >"$TMP/tcod-port.log" 2>&1; then
        AFTER_TCOD="not checked (the TCOD port failed: $(tail -1 "$TMP/tcod-port.log"))"
    elif "${PORT[@]}" "$TMP/tcod" | sed 's/^/  | /'; then
        AFTER_TCOD=ok
        for rel in slime/backends/megatron_utils/loss.py slime/backends/megatron_utils/actor.py; do
            cmp -s "$TMP/ported/$rel" "$TMP/tcod/$rel" || { AFTER_TCOD="FAILED ($rel differs)" && bad; }
        done
    else
        AFTER_TCOD=FAILED && bad
    fi
    say "after TCOD: $AFTER_TCOD"
    PORT_RESULT="$PORT_RESULT, after TCOD $AFTER_TCOD"
fi
part "$PORT_RESULT"

# ---- 2. upstream's CPU tests and plugin contracts (tcod) -----------------------------------------------
if [[ $PR == tcod ]]; then
    step "python dependencies of upstream's CPU tests"
    DEPS=yes
    "$PYTHON" "$HERE/contracts.py" deps --tree "$TMP/pristine" || { DEPS=no && bad; }
    part "deps $DEPS"
    step "upstream's CPU tests and plugin contracts"
    "$PYTHON" "$HERE/contracts.py" matrix --pristine "$TMP/pristine" --ported "$TMP/ported" --work "$TMP/work" \
        --summary "$TMP/contracts-summary" || bad
    part "upstream tests: $(cat "$TMP/contracts-summary" 2>/dev/null || echo "did not complete")"
fi

# ---- 3. upstream's CPU CI jobs, in their own Python 3.10 environment ----------------------------------
step "upstream's CPU CI jobs as GitHub runs them (Python 3.10, each job's pip list, python tests/FILE)"
CPU_CI_START=$SECONDS
CPU_CI_RC=0
"$PYTHON" "$HERE/cpu_ci.py" --pr "$PR" --pristine "$TMP/pristine" --ported "$TMP/ported" --work "$TMP/cpu-ci" \
    --summary "$TMP/cpu-ci-summary" || { CPU_CI_RC=1 && bad; }
CPU_CI="$(cat "$TMP/cpu-ci-summary" 2>/dev/null || echo "did not complete") ($((SECONDS - CPU_CI_START))s)"
part "CPU CI: $([[ $CPU_CI_RC -eq 0 ]] || echo "FAILED: ")$CPU_CI"

# ---- 4. smoke (tcod) -----------------------------------------------------------------------------------
if [[ $PR == tcod ]]; then
    step "smoke"
    say "\$ $PYTHON ${HERE#"$REPO"/}/smoke.py $TMP/ported"
    mkdir -p "$TMP/smoke-tmp" # smoke.py's own temp folders land here and go with ours
    SMOKE_RC=0
    TMPDIR="$TMP/smoke-tmp" timeout --kill-after=30 "${SMOKE_TIMEOUT:-900}" \
        "$PYTHON" "$HERE/smoke.py" "$TMP/ported" || SMOKE_RC=$?
    if [[ $SMOKE_RC -eq 124 ]]; then SMOKE="TIMED OUT after ${SMOKE_TIMEOUT:-900}s"; else SMOKE="exit $SMOKE_RC"; fi
    [[ $SMOKE_RC -eq 0 ]] || bad
    say "smoke.py: $SMOKE"
    part "smoke: $SMOKE"
fi

# ---- 5. the PR as a maintainer reads it ----------------------------------------------------------------
step "the PR: size, wording, upstream's linters, its tests' registration, its links"
PR_RC=0
"$PYTHON" "$HERE/verify_pr.py" --pr "$PR" "$TMP/pristine" "$TMP/ported" | tee "$TMP/verify_pr.log" ||
    PR_RC=${PIPESTATUS[0]}
COUNTS="$(sed -n 's/^verify_pr.py counts: //p' "$TMP/verify_pr.log")" # the caps' counts, printed last but one
[[ $PR_RC -eq 0 ]] || bad
part "PR checks: $([[ $PR_RC -eq 0 ]] && echo ok || echo FAILED)${COUNTS:+ ($COUNTS)}"

# ---- 6. the objective it trains and its launch flags (tcod) --------------------------------------------
if [[ $PR == tcod ]]; then
    step "same objective: both teacher modes train pure OPD, upstream and here"
    OBJECTIVE=ok
    "$PYTHON" "$HERE/verify_objective.py" "$TMP/ported" || { OBJECTIVE=FAILED && bad; }
    part "objective: $OBJECTIVE"
    LAUNCH="not run (set MEGATRON_LM_DIR to a Megatron-LM tree at upstream's pinned commit)"
    if [[ -n "${MEGATRON_LM_DIR:-}" ]]; then
        step "the launch script's and the GPU test's flags against upstream's parsers"
        SGLANG_OPT=()
        [[ -z "${SGLANG_SERVER_ARGS:-}" ]] || SGLANG_OPT=(--sglang-server-args "$SGLANG_SERVER_ARGS")
        LAUNCH=ok
        "$PYTHON" "$HERE/check_launch_flags.py" "$TMP/ported" --megatron-dir "$MEGATRON_LM_DIR" "${SGLANG_OPT[@]}" ||
            { LAUNCH=FAILED && bad; }
    fi
    part "launch flags: $LAUNCH"
fi

# ---- 7. bit-identical defaults (adaptive-kl) -----------------------------------------------------------
if [[ $PR == adaptive-kl ]]; then
    step "defaults bit-identical: advantages, returns and KL of pristine/ and ported/"
    VENV_PY="$TMP/cpu-ci/venv-cpu-unittest-ported/bin/python" # the CPU-CI venv: upstream's torch
    [[ -x "$VENV_PY" ]] || VENV_PY="$PYTHON"
    for t in pristine ported; do
        PYTHONPATH="$TMP/$t" "$VENV_PY" "$HERE/kl_bit_identity.py" dump "$TMP/$t" "$TMP/identity-$t.pt" || true
    done
    IDENTICAL=yes
    "$VENV_PY" "$HERE/kl_bit_identity.py" compare "$TMP/identity-pristine.pt" "$TMP/identity-ported.pt" ||
        { IDENTICAL=NO && bad; }
    part "defaults bit-identical: $IDENTICAL"
fi

# ---- 8. slime's own train.py on this CPU (opt-in: VERIFY_TRAIN_CPU=1, minutes per case) ----------------
if [[ "${VERIFY_TRAIN_CPU:-0}" == 1 ]]; then
    step "slime's train.py on CPU: train_cpu.py (pristine-grpo on pristine/, the PR's cases on ported/)"
    case "$PR" in
    tcod) TRAIN_CASES=(tcod-f2b tcod-b2f tcod-megatron-teacher slime-engines) ;;
    adaptive-kl) TRAIN_CASES=(kl-adaptive) ;;
    tcod-core-only) TRAIN_CASES=() ;; # the example is not in the tree: slime's own GRPO only
    esac
    TRAIN_RESULTS=()
    for c in pristine-grpo "${TRAIN_CASES[@]}"; do
        tree="$TMP/ported" && [[ $c != pristine-grpo ]] || tree="$TMP/pristine"
        engine=(--engine "${TRAIN_CPU_ENGINE:-sglang}") && [[ $c != slime-engines ]] || engine=()
        "$PYTHON" "$HERE/train_cpu.py" "$tree" --case "$c" "${engine[@]}" --out "$TMP/train-cpu-$c" 2>&1 |
            tee "$TMP/train-cpu-$c.log" |
            tail -1 || true
        if [[ "$(tail -1 "$TMP/train-cpu-$c.log")" == "train_cpu $c: ok"* ]]; then TRAIN_RESULTS+=("$c ok"); else
            TRAIN_RESULTS+=("$c FAILED") && bad; fi
    done
    part "train.py on CPU: ${TRAIN_RESULTS[*]}"
else
    part "train.py on CPU: not run (VERIFY_TRAIN_CPU=1 and MEGATRON_LM_DIR run it)"
fi

# ---- summary -------------------------------------------------------------------------------------------
step "summary"
if [[ $ALL_OK -eq 1 ]]; then summary OK; else summary FAILED; fi
[[ $ALL_OK -eq 1 ]]
