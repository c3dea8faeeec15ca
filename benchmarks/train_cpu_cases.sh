#!/usr/bin/env bash
# Wall time of each train_cpu.py case (slime's own train.py on this CPU), one after the other, in one run.
#
# usage: MEGATRON_LM_DIR=DIR benchmarks/train_cpu_cases.sh SLIME_DIR [CASE...]
#   SLIME_DIR: a slime checkout (only read); the PR cases get ported copies made here with port.py.
#   CASE: pristine-grpo kl-adaptive tcod-f2b tcod-b2f tcod-megatron-teacher (default: all five).
# Appends one row per case to benchmarks/results/train_cpu/cases.tsv (date, case, result, wall seconds, load
# average at the start, the case's last line) and prints the table; a failed case leaves the tail of its log in
# benchmarks/results/train_cpu/CASE.failed.log. The target is <= 600 s a case on 2 cores.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
[[ $# -ge 1 ]] || { sed -n '2,9s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2; }
SLIME_DIR="$(cd "$1" && pwd)" && shift
CASES=("$@") && [[ ${#CASES[@]} -gt 0 ]] || CASES=(pristine-grpo kl-adaptive tcod-f2b tcod-b2f tcod-megatron-teacher)
OUT="$REPO/benchmarks/results/train_cpu" && mkdir -p "$OUT"
WORK="$(mktemp -d)" && trap 'rm -rf "$WORK"' EXIT
[[ -f "$OUT/cases.tsv" ]] || printf 'date\tcase\tresult\twall_s\tload_1min\tlast_line\n' >"$OUT/cases.tsv"
for c in "${CASES[@]}"; do
    tree="$SLIME_DIR"
    pr=""
    case $c in kl-adaptive) pr=adaptive-kl ;; tcod-*) pr=tcod ;; esac
    if [[ -n $pr ]]; then
        # one ported copy per PR, made the first time a case needs it
        tree="$WORK/slime-$pr"
        if [[ ! -d $tree ]] && ! { cp -a "$SLIME_DIR" "$tree" && "$PY" "$REPO/tools/slime_pr/port.py" --pr "$pr" "$tree" \
                >"$WORK/port-$pr.log" 2>&1; }; then
            # a PR that does not port is this case's result, not the end of the table
            printf '%s\t%s\tFAILED\t0\t-\tport.py --pr %s failed: %s\n' "$(date -u +%FT%TZ)" "$c" "$pr" \
                "$(tail -1 "$WORK/port-$pr.log" | sed "s|$WORK/||g" | cut -c1-300)" >>"$OUT/cases.tsv"
            echo "$c: FAILED (port.py --pr $pr; see its last line in cases.tsv)"
            rm -rf "$tree"
            continue
        fi
    fi
    load="$(cut -d' ' -f1 /proc/loadavg)"
    t0=$SECONDS
    "$PY" "$REPO/tools/slime_pr/train_cpu.py" "$tree" --case "$c" --out "$WORK/out-$c" >"$WORK/$c.log" 2>&1 || true
    wall=$((SECONDS - t0))
    # the case's last line without its temporary output folder (no machine path goes into the results)
    last="$(tail -1 "$WORK/$c.log" | sed 's|; out /[^)]*)$|)|')"
    result=FAILED && [[ "$last" == "train_cpu $c: ok"* ]] && result=ok
    # a failed case keeps its log's tail (the work folder goes at exit)
    if [[ $result == ok ]]; then rm -f "$OUT/$c.failed.log"; else tail -300 "$WORK/$c.log" >"$OUT/$c.failed.log"; fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$c" "$result" "$wall" "$load" "${last:0:400}" >>"$OUT/cases.tsv"
    echo "$c: $result in ${wall}s (load $load)"
done
column -t -s $'\t' "$OUT/cases.tsv" | cut -c1-160
