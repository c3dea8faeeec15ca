#!/bin/bash

# TCOD (arXiv:2604.24005) on gridnav: Qwen3-8B student (Megatron), Qwen3-32B teacher on its own SGLang server,
# both in Qwen3's thinking mode. Data, checkpoints, usage and the smaller 4-GPU setting: README.md.
#   TCOD_MODE  f2b (default) or b2f; STUDENT, STUDENT_TORCH_DIST, TEACHER, DATA, EVAL_DATA, SAVE: paths
#   MODEL_SCRIPT=qwen3-8B.sh (the student's scripts/models/ file), TP=2 (the student's tensor parallelism)
#   NUM_GPUS=8, TEACHER_GPUS=2 (the last ones, outside Ray), ACTOR_GPUS=2 (the rest roll out)

set -ex

TCOD_MODE=${TCOD_MODE:-f2b}
MODEL_SCRIPT=${MODEL_SCRIPT:-qwen3-8B.sh}
STUDENT=${STUDENT:-/root/models/Qwen3-8B}
STUDENT_TORCH_DIST=${STUDENT_TORCH_DIST:-/root/models/Qwen3-8B_torch_dist}
TEACHER=${TEACHER:-/root/models/Qwen3-32B}
DATA=${DATA:-/root/data/tcod/gridnav_train.jsonl}
EVAL_DATA=${EVAL_DATA:-/root/data/tcod/gridnav_eval.jsonl}
SAVE=${SAVE:-/root/ckpt/${MODEL_SCRIPT%.sh}-tcod-gridnav-${TCOD_MODE}}
TP=${TP:-2}
NUM_GPUS=${NUM_GPUS:-8}
TEACHER_GPUS=${TEACHER_GPUS:-2}
ACTOR_GPUS=${ACTOR_GPUS:-2}
TRAIN_GPUS=$((NUM_GPUS - TEACHER_GPUS))

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
SLIME_DIR="$(cd -- "${SCRIPT_DIR}/../.." &>/dev/null && pwd)"
cd "${SLIME_DIR}"

# ETA as the official ALFWorld / ScienceWorld configs (F2B checkpoint_steps 6, B2F 5): the depth reaches
# max_turns (12) at step 66 (F2B) or 55 (B2F) of 96, about 70% of the run, as there.
NUM_ROLLOUT=${NUM_ROLLOUT:-96}
if [ "${TCOD_MODE}" = f2b ]; then ETA=${ETA:-6}; else ETA=${ETA:-5}; fi
CUSTOM_CONFIG=examples/multi_turn_tcod/multi_turn_tcod_config.yaml

# Start the teacher model server on the last TEACHER_GPUS devices; Ray never sees them.
TEACHER_IP="127.0.0.1"
TEACHER_PORT=13141
LOG_FILE="/tmp/sglang_$(head /dev/urandom | tr -dc A-Za-z0-9 | head -c 6).log"
CUDA_VISIBLE_DEVICES=$(seq -s, ${TRAIN_GPUS} $((NUM_GPUS - 1))) python3 -m sglang.launch_server \
    --model-path "${TEACHER}" --host $TEACHER_IP --port $TEACHER_PORT --tp-size ${TEACHER_GPUS} \
    --chunked-prefill-size 4096 --mem-fraction-static 0.7 > "$LOG_FILE" 2>&1 &
TEACHER_PID=$!
# On any exit, a failed `ray job submit` included: stop the teacher server and Ray.
trap 'kill ${TEACHER_PID} 2>/dev/null || true; ray stop --force >/dev/null 2>&1 || true' EXIT
until curl -sf http://$TEACHER_IP:$TEACHER_PORT/health_generate > /dev/null; do
    kill -0 ${TEACHER_PID} || { echo "teacher server exited, see $LOG_FILE" >&2; exit 1; }
    echo "Waiting for the teacher model server to start..."
    tail -n 10 "$LOG_FILE"
    sleep 5
done

export PYTHONUNBUFFERED=1
NVLINK_COUNT=$(nvidia-smi topo -m 2>/dev/null | grep -o 'NV[0-9][0-9]*' | wc -l)
if [ "$NVLINK_COUNT" -gt 0 ]; then HAS_NVLINK=1; else HAS_NVLINK=0; fi

source "${SLIME_DIR}/scripts/models/${MODEL_SCRIPT}"

# --ref-load gives the student's first weights while --load holds no checkpoint; without --use-kl-loss no
# reference model is loaded (pure OPD: the teacher is the only other model).
CKPT_ARGS=(
   --hf-checkpoint "${STUDENT}"
   --ref-load "${STUDENT_TORCH_DIST}"
   --load "${SAVE}"
   --save "${SAVE}"
   --save-interval 25
)

ROLLOUT_ARGS=(
   --prompt-data "${DATA}"
   --input-key input --label-key label --metadata-key metadata
   --rollout-shuffle
   --num-rollout ${NUM_ROLLOUT}
   # 16 tasks per step, one episode each, one optimizer step per rollout
   --rollout-batch-size 16
   --n-samples-per-prompt 1
   --global-batch-size 16
   # 12 turns of up to 1024 tokens (max_turn_response_len) plus the observations
   --rollout-max-response-len 15360
   --rollout-temperature 1.0
   # the agent loop; max_turns, max_turn_response_len and the environment come from the YAML
   --custom-generate-function-path examples.multi_turn_tcod.rollout.generate
   --custom-config-path "${CUSTOM_CONFIG}"
   --custom-rollout-log-function-path examples.multi_turn_tcod.metrics.log_rollout_data
)

TCOD_ARGS=(
   # the agent loop plays each episode at the current step's depth; evaluation plays full episodes
   --use-tcod
   --tcod-mode ${TCOD_MODE}
   --tcod-eta ${ETA}
)

RM_ARGS=(
   --custom-rm-path slime.rollout.on_policy_distillation.reward_func
   --custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards
   --rm-url http://$TEACHER_IP:$TEACHER_PORT/generate
)

EVAL_ARGS=(
   --eval-interval 25
   --eval-prompt-data gridnav "${EVAL_DATA}"
   --n-samples-per-eval-prompt 1
   --eval-max-response-len 15360
   --eval-temperature 0.4
)

PERF_ARGS=(
   --tensor-model-parallel-size ${TP}
   --sequence-parallel
   --pipeline-model-parallel-size 1
   --context-parallel-size 1
   --expert-model-parallel-size 1
   --expert-tensor-parallel-size 1
   --recompute-granularity full
   --recompute-method uniform
   --recompute-num-layers 1
   --use-dynamic-batch-size
   --max-tokens-per-gpu 16384
)

GRPO_ARGS=(
   --advantage-estimator grpo
   --use-opd
   --opd-type sglang
   --opd-kl-coef 1.0
   --entropy-coef 0.00
   --eps-clip 0.2
)

OPTIMIZER_ARGS=(
   --optimizer adam
   --lr 1e-6
   --lr-decay-style constant
   --weight-decay 0.1
   --adam-beta1 0.9
   --adam-beta2 0.98
)

SGLANG_ARGS=(
   --rollout-num-gpus-per-engine 1
   --sglang-mem-fraction-static 0.7
)

MISC_ARGS=(
   --attention-dropout 0.0
   --hidden-dropout 0.0
   --accumulate-allreduce-grads-in-fp32
   --attention-softmax-in-fp32
   --attention-backend flash
)

# launch the master node of ray in container, on the devices the teacher does not use
export CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((TRAIN_GPUS - 1)))
export MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
ray start --head --node-ip-address ${MASTER_ADDR} --num-gpus ${TRAIN_GPUS} --disable-usage-stats

RUNTIME_ENV_JSON="{
  \"env_vars\": {
    \"PYTHONPATH\": \"/root/Megatron-LM/:${SLIME_DIR}\",
    \"CUDA_DEVICE_MAX_CONNECTIONS\": \"1\",
    \"NCCL_NVLS_ENABLE\": \"${HAS_NVLINK}\"
  }
}"

ray job submit --address="http://127.0.0.1:8265" \
   --runtime-env-json="${RUNTIME_ENV_JSON}" \
   -- python3 train.py \
   --actor-num-nodes 1 \
   --actor-num-gpus-per-node ${ACTOR_GPUS} \
   --rollout-num-gpus $((TRAIN_GPUS - ACTOR_GPUS)) \
   "${MODEL_ARGS[@]}" \
   "${CKPT_ARGS[@]}" \
   "${ROLLOUT_ARGS[@]}" \
   "${TCOD_ARGS[@]}" \
   "${OPTIMIZER_ARGS[@]}" \
   "${GRPO_ARGS[@]}" \
   "${PERF_ARGS[@]}" \
   "${EVAL_ARGS[@]}" \
   "${SGLANG_ARGS[@]}" \
   "${MISC_ARGS[@]}" \
   "${RM_ARGS[@]}"
