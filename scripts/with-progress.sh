#!/usr/bin/env bash
# Runs a long quiet command (pip -q) with a line every 10 s, so an install stage is never silent:
#   bash scripts/with-progress.sh "make venv: 3/5 torch" python -m pip install -q torch
# prints "LABEL" with the time, "LABEL: still running (N s)" every PROGRESS_EVERY (10) s, then
# "LABEL: done in N s"; exits with the command's status.
set -uo pipefail
label="$1"
shift
every="${PROGRESS_EVERY:-10}"
start=${SECONDS}
say() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*"; }
say "${label}"
"$@" &
pid=$!
trap 'kill "${pid}" 2> /dev/null' INT TERM
next=$(( start + every ))
while kill -0 "${pid}" 2> /dev/null; do
  sleep 1
  if [ "${SECONDS}" -ge "${next}" ] && kill -0 "${pid}" 2> /dev/null; then
    say "${label}: still running ($(( SECONDS - start )) s)"
    next=$(( next + every ))
  fi
done
wait "${pid}"
status=$?
if [ "${status}" -eq 0 ]; then say "${label}: done in $(( SECONDS - start )) s"; else say "${label}: failed (exit ${status})"; fi
exit "${status}"
