#!/usr/bin/env bash
# A short OPD run shaped like phase 4 of scripts/run-tiny-tcod.sh (same model size,
# task, turns, batch and server teacher), for the step-time breakdown and peak memory; it skips the
# demo's SFT phase: teacher and student are two random tiny models. Run it under the memory sampler:
#   python benchmarks/step_breakdown.py --measure -- bash benchmarks/tiny_opd_run.sh OUT_DIR [STEPS] [MODE]
#   python benchmarks/step_breakdown.py OUT_DIR/run/metrics.jsonl
# MODE: opd (vanilla, full episodes; default), f2b or b2f (TCOD).
set -euo pipefail
OUT="${1:?usage: tiny_opd_run.sh OUT_DIR [STEPS] [opd|f2b|b2f]}"
STEPS="${2:-10}"
MODE="${3:-opd}"
PYTHON="${PYTHON:-python}"
mkdir -p "${OUT}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
"${PYTHON}" -m slime.utils.tiny_models --out "${OUT}/student" --hidden-size 64 --num-layers 2 --seed 0 >/dev/null
"${PYTHON}" -m slime.utils.tiny_models --out "${OUT}/teacher" --hidden-size 64 --num-layers 2 --seed 1 >/dev/null
"${PYTHON}" -m examples.agent_envs.make_data --env gridnav --size 6 --walls 0 --min-len 4 --max-len 10 \
  --n 256 --seed 0 --out "${OUT}/train.jsonl"

PORT="$("${PYTHON}" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")"
"${PYTHON}" -m slime.backends.hf_engine --model-path "${OUT}/teacher" --port "${PORT}" > "${OUT}/teacher.log" 2>&1 &
TEACHER_PID=$!
trap 'kill ${TEACHER_PID} 2>/dev/null || true; wait ${TEACHER_PID} 2>/dev/null || true' EXIT
for _ in $(seq 240); do
  curl -sf "http://127.0.0.1:${PORT}/health_generate" >/dev/null && break
  kill -0 "${TEACHER_PID}"  # stop here if the server died
  sleep 0.5
done

case "${MODE}" in
  opd) EXTRA=() ;;
  f2b) EXTRA=(--use-tcod --tcod-mode f2b --tcod-eta 2) ;;
  b2f) EXTRA=(--use-tcod --tcod-mode b2f --tcod-eta 2 --tcod-prefix-source expert) ;;
  *) echo "unknown mode ${MODE}" >&2; exit 2 ;;
esac
rm -rf "${OUT}/run"
"${PYTHON}" train.py --hf-checkpoint "${OUT}/student" --prompt-data "${OUT}/train.jsonl" --rollout-shuffle \
  --seed 0 --rollout-seed 0 --rollout-interaction-env-path examples.agent_envs \
  --custom-generate-function-path examples.multi_turn_tcod.rollout.generate \
  --max-turns 10 --max-turn-response-len 8 --rollout-max-response-len 480 \
  --rollout-batch-size 8 --micro-batch-size 8 --num-rollout "${STEPS}" --lr 1e-4 --rollout-temperature 1.0 \
  --use-opd --opd-type sglang --rm-url "http://127.0.0.1:${PORT}/generate" \
  --custom-rm-path slime.rollout.on_policy_distillation.reward_func \
  --custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards \
  --metrics-dir "${OUT}/run" "${EXTRA[@]}"
