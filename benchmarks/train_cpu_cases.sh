#!/usr/bin/env bash
# Wall time of each train_cpu.py case (slime's own train.py on this CPU) on each engine, one after the other, in one
# run: real SGLang 0.5.15.post1 servers and this repository's hf_engine side by side.
#
# usage: MEGATRON_LM_DIR=DIR [ENGINES="sglang hf_engine"] benchmarks/train_cpu_cases.sh SLIME_DIR [CASE...]
#   SLIME_DIR: a slime checkout (only read); the PR cases get ported copies made here with port.py.
#   CASE: pristine-grpo kl-adaptive tcod-f2b tcod-b2f tcod-megatron-teacher slime-engines (default: all six).
#   ENGINES: which engines to time (default both; slime-engines runs on sglang only: slime launches SGLang itself;
#   pristine-grpo and kl-adaptive train on saved rollout data and run once, engine 'none').
# Appends one row per case and engine to benchmarks/results/train_cpu/cases_by_engine.tsv (date, case, engine,
# result, wall seconds, load average at the start, the case's last line) and prints the table; a failed case
# leaves the tail of its log in benchmarks/results/train_cpu/CASE.ENGINE.failed.log. The target is <= 600 s a case
# on 2 quiet cores. (cases.tsv holds the rows of the runs before the engine column, all on hf_engine.)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
[[ $# -ge 1 ]] || { sed -n '2,12s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2; }
SLIME_DIR="$(cd "$1" && pwd)" && shift
CASES=("$@") && [[ ${#CASES[@]} -gt 0 ]] ||
    CASES=(pristine-grpo kl-adaptive tcod-f2b tcod-b2f tcod-megatron-teacher slime-engines)
read -r -a ENGINE_LIST <<<"${ENGINES:-sglang hf_engine}"
OUT="$REPO/benchmarks/results/train_cpu" && mkdir -p "$OUT"
TSV="$OUT/cases_by_engine.tsv"
WORK="$(mktemp -d)" && trap 'rm -rf "$WORK"' EXIT
[[ -f "$TSV" ]] || printf 'date\tcase\tengine\tresult\twall_s\tload_1min\tlast_line\n' >"$TSV"
for c in "${CASES[@]}"; do
    tree="$SLIME_DIR"
    pr=""
    case $c in kl-adaptive) pr=adaptive-kl ;; tcod-* | slime-engines) pr=tcod ;; esac
    if [[ -n $pr ]]; then
        # one ported copy per PR, made the first time a case needs it
        tree="$WORK/slime-$pr"
        if [[ ! -d $tree ]] && ! { cp -a "$SLIME_DIR" "$tree" && "$PY" "$REPO/tools/slime_pr/port.py" --pr "$pr" "$tree" \
                >"$WORK/port-$pr.log" 2>&1; }; then
            # a PR that does not port is this case's result, not the end of the table
            printf '%s\t%s\t-\tFAILED\t0\t-\tport.py --pr %s failed: %s\n' "$(date -u +%FT%TZ)" "$c" "$pr" \
                "$(tail -1 "$WORK/port-$pr.log" | sed "s|$WORK/||g" | cut -c1-300)" >>"$TSV"
            echo "$c: FAILED (port.py --pr $pr; see its last line in cases_by_engine.tsv)"
            rm -rf "$tree"
            continue
        fi
    fi
    engines=("${ENGINE_LIST[@]}")
    case $c in pristine-grpo | kl-adaptive) engines=(none) ;; esac # train-only on saved rollout data: no engine
    for engine in "${engines[@]}"; do
        [[ $c == slime-engines && $engine != sglang ]] && continue
        engine_opt=(--engine "$engine") && [[ $engine != none ]] || engine_opt=()
        load="$(cut -d' ' -f1 /proc/loadavg)"
        t0=$SECONDS
        "$PY" "$REPO/tools/slime_pr/train_cpu.py" "$tree" --case "$c" "${engine_opt[@]}" --out "$WORK/out-$c-$engine" \
            >"$WORK/$c.$engine.log" 2>&1 || true
        wall=$((SECONDS - t0))
        # the case's last line without its temporary output folder (no machine path goes into the results)
        last="$(tail -1 "$WORK/$c.$engine.log" | sed 's|; out /[^)]*)$|)|')"
        result=FAILED && [[ "$last" == "train_cpu $c: ok"* ]] && result=ok
        # a failed case keeps its log's tail (the work folder goes at exit)
        if [[ $result == ok ]]; then rm -f "$OUT/$c.$engine.failed.log"; else
            tail -300 "$WORK/$c.$engine.log" | sed "s|$WORK/||g" >"$OUT/$c.$engine.failed.log"; fi
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$c" "$engine" "$result" "$wall" "$load" \
            "${last:0:400}" >>"$TSV"
        echo "$c ($engine): $result in ${wall}s (load $load)"
    done
done
column -t -s $'\t' "$TSV" | cut -c1-170
