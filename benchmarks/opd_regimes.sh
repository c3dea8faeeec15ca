#!/usr/bin/env bash
# Which OPD regime moves the student (issue 13): the same student, teacher, tasks and seed trained under
# several (episodes per rollout, optimizer batch, lr, --opd-loss) settings, with the in-trainer
# teacher so every step logs the exact whole-vocabulary KL (opd/exact_kl) next to the sampled one,
# plus per-optimizer-step PPO ratio drift (per_step ppo_kl, pg_clipfrac) and advantage sizes.
#   TEACHER=... STUDENT=... DATA=dir-with-train.jsonl+eval.jsonl bash benchmarks/opd_regimes.sh OUT CONFIG...
# CONFIG = name:episodes:global_batch:lr:loss[:steps], e.g. multi:8:2:2e-4:sampled one:32:32:1e-3:full
# Environment: PYTHON, STEPS (default 24), SEED (0), EVAL_INTERVAL (default STEPS/2), TEACHER_TYPE
# (megatron = in-trainer teacher, default; sglang = hf_engine server with --opd-teacher-top-k 20),
# EVAL_TEMPERATURE (default 1.0, the rollout temperature OPD matches).
# Report: python benchmarks/opd_regimes_report.py OUT/*/metrics.jsonl
set -euo pipefail
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO_DIR}"
OUT="${1:?usage: opd_regimes.sh OUT CONFIG...}"; shift
PYTHON="${PYTHON:-python3}"
STEPS="${STEPS:-24}"
SEED="${SEED:-0}"
TEACHER_TYPE="${TEACHER_TYPE:-megatron}"
: "${TEACHER:?set TEACHER (HF folder)}" "${STUDENT:?set STUDENT (HF folder)}" "${DATA:?set DATA (folder)}"
mkdir -p "${OUT}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

TEACHER_PID=""
trap 'if [ -n "${TEACHER_PID}" ]; then kill "${TEACHER_PID}" 2>/dev/null || true; fi' EXIT
if [ "${TEACHER_TYPE}" = sglang ]; then
  PORT="$("${PYTHON}" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")"
  "${PYTHON}" -m slime.backends.hf_engine --model-path "${TEACHER}" --port "${PORT}" --random-seed "${SEED}" \
    > "${OUT}/teacher_server.log" 2>&1 &
  TEACHER_PID=$!
  "${PYTHON}" -m slime.backends.sglang_utils.wait_healthy --port "${PORT}" --pid "${TEACHER_PID}"
  TEACHER_ARGS=(--opd-type sglang --rm-url "http://127.0.0.1:${PORT}/generate" --opd-teacher-top-k 20
                --custom-rm-path slime.rollout.on_policy_distillation.reward_func
                --custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards)
else
  TEACHER_ARGS=(--opd-type megatron --opd-teacher-load "${TEACHER}")
fi

for config in "$@"; do
  IFS=: read -r name episodes gbs lr loss steps <<< "${config}"
  steps="${steps:-${STEPS}}"
  echo "=== ${name}: ${episodes} episodes/rollout, global batch ${gbs}, lr ${lr}, --opd-loss ${loss}, ${steps} steps"
  rm -rf "${OUT:?}/${name}"
  "${PYTHON}" train.py --hf-checkpoint "${STUDENT}" --prompt-data "${DATA}/train.jsonl" --rollout-shuffle \
    --seed "${SEED}" --rollout-seed "${SEED}" \
    --rollout-interaction-env-path examples.agent_envs \
    --custom-generate-function-path examples.multi_turn_tcod.rollout.generate \
    --max-turns 10 --max-turn-response-len 8 --rollout-max-response-len 480 \
    --eval-prompt-data gridnav "${DATA}/eval.jsonl" --eval-temperature "${EVAL_TEMPERATURE:-1.0}" \
    --rollout-batch-size "${episodes}" --global-batch-size "${gbs}" --micro-batch-size 8 \
    --num-rollout "${steps}" --lr "${lr}" --rollout-temperature 1.0 \
    --eval-interval "${EVAL_INTERVAL:-$(( steps / 2 ))}" \
    --use-opd --opd-loss "${loss}" "${TEACHER_ARGS[@]}" --metrics-dir "${OUT}/${name}" 2>&1 \
    | grep -E "Error|error|Traceback" || true
  [ -f "${OUT}/${name}/metrics.jsonl" ] || { echo "opd_regimes: ${name} wrote no metrics" >&2; exit 1; }
done
