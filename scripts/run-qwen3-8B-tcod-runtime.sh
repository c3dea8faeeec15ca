#!/usr/bin/env bash
# TCOD on GPUs with THIS repository's runtime (its train.py, metrics.jsonl, --dry-run plan): Qwen3-8B
# student, Qwen3-32B teacher on an SGLang server (--opd-type sglang). The launch script of the slime pull
# request, for upstream slime's train.py, is examples/multi_turn_tcod/run-qwen3-8B-tcod.sh.
# Official TCOD settings (arXiv:2604.24005) are the defaults; override with environment variables:
#   TCOD_MODE=f2b|b2f  TASK_ENV=scienceworld|alfworld|webshop  NUM_GPUS=8  TEACHER_GPUS=2
#   STUDENT=/path/Qwen3-8B  TEACHER=/path/Qwen3-32B  SAVE=/path/ckpt
#   DATA / EVAL_DATA: task files (default DATA_DIR/TASK_ENV_train.jsonl and _eval.jsonl, DATA_DIR = data/
#   of this repository); a missing one is named with the make_data command that writes it
#   PYTHON: default this repository's .venv/bin/python if it exists, else python3; it must have torch
#   TRAIN_BACKEND=fsdp|megatron  TP=2 (megatron: tensor-parallel size; the trainer's GPUs are rounded down
#   to a multiple of it and the rest go to the rollout engines)
# DRY_RUN=1 checks the flags, plugin paths and data files (DATA and EVAL_DATA must exist) and prints the
# plan without starting anything (no GPU; without STUDENT's weights here, the plan uses its config.json or
# Qwen3-8B's shape and says so). REHEARSAL=1 runs these flags on CPU for 2 rollouts with tiny models and
# the hf_engine in place of the checkpoints and SGLang (scripts/rehearsal.py lists every swap), writing
# under REHEARSAL_DIR (default: a new temporary folder); the test suite runs it. Without either, the run needs
# NUM_GPUS GPUs (as nvidia-smi lists them), SGLang in PYTHON, ray and curl: refused at once, in one line, without.
# The teacher server's log is SAVE.teacher.log (beside SAVE), named when the server exits before it is healthy.
# GPUs: the teacher gets the last TEACHER_GPUS devices, outside Ray. Ray gets the other TRAIN_GPUS, and
# within them reserves ROLLOUT_GPUS for the SGLang rollout engines and ACTOR_GPUS for the trainer, as
# disjoint placement groups (slime/ray/engine_placement.py): nothing is pinned by hand inside Ray's set.
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "${SCRIPT_DIR}/.." && pwd)"
CALLER_DIR="${PWD}"  # relative paths given to the script are the caller's; it runs train.py from REPO_DIR
# shellcheck source=scripts/find-python.sh
. "${SCRIPT_DIR}/find-python.sh"
find_python run-qwen3-8B-tcod-runtime.sh torch transformers ray

TCOD_MODE="${TCOD_MODE:-b2f}"
TRAIN_BACKEND="${TRAIN_BACKEND:-fsdp}"
TP="${TP:-2}"
TASK_ENV="${TASK_ENV:-scienceworld}"
NUM_GPUS="${NUM_GPUS:-8}"
TEACHER_GPUS="${TEACHER_GPUS:-2}"
STUDENT="${STUDENT:-/root/models/Qwen3-8B}"
TEACHER="${TEACHER:-/root/models/Qwen3-32B}"
TEACHER_PORT="${TEACHER_PORT:-13141}"
DATA_DIR="${DATA_DIR:-${REPO_DIR}/data}"
DATA="${DATA:-${DATA_DIR}/${TASK_ENV}_train.jsonl}"
EVAL_DATA="${EVAL_DATA:-${DATA_DIR}/${TASK_ENV}_eval.jsonl}"
case "${DATA}" in /*) ;; *) DATA="${CALLER_DIR}/${DATA}" ;; esac
case "${EVAL_DATA}" in /*) ;; *) EVAL_DATA="${CALLER_DIR}/${EVAL_DATA}" ;; esac
SAVE="${SAVE:-/root/ckpt/qwen3-8b-tcod-${TASK_ENV}-${TCOD_MODE}}"

# This script's own variables, checked before anything derives flags from them: an error names the variable.
bad() { echo "run-qwen3-8B-tcod-runtime.sh: $*" >&2; exit 2; }
for var in NUM_GPUS TEACHER_GPUS TP TEACHER_PORT; do
  [[ "${!var}" =~ ^[0-9]+$ ]] && [ "${!var}" -ge 1 ] || bad "${var}=${!var} must be a whole number >= 1"
done
case "${TCOD_MODE}" in f2b|b2f) ;; *) bad "TCOD_MODE=${TCOD_MODE} must be f2b or b2f" ;; esac
[ "${TEACHER_PORT}" -le 65535 ] || bad "TEACHER_PORT=${TEACHER_PORT} must be a port number (1-65535)"
MIN_TRAIN=2; [ "${TRAIN_BACKEND}" = megatron ] && MIN_TRAIN=$(( TP + 1 ))
[ $(( NUM_GPUS - TEACHER_GPUS )) -ge "${MIN_TRAIN}" ] || bad "NUM_GPUS=${NUM_GPUS} with TEACHER_GPUS=${TEACHER_GPUS}" \
  "leaves $(( NUM_GPUS - TEACHER_GPUS )) GPU(s) for training; it needs ${MIN_TRAIN} (the trainer and the rollout" \
  "engines get GPUs of their own$([ "${TRAIN_BACKEND}" = megatron ] && echo ", TP=${TP} for the trainer")): raise" \
  "NUM_GPUS or lower TEACHER_GPUS"
# A real run needs the GPUs and SGLang on this machine: refused here at once, not by a teacher server that dies.
if [ "${REHEARSAL:-0}" != 1 ] && [ "${DRY_RUN:-0}" != 1 ]; then
  GPUS_HERE="$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ' || true)"
  [ "${GPUS_HERE}" -ge "${NUM_GPUS}" ] || bad "NUM_GPUS=${NUM_GPUS} but this machine shows ${GPUS_HERE} GPU(s)" \
    "(nvidia-smi -L): DRY_RUN=1 checks the flags and prints the plan without a GPU (REHEARSAL=1 runs them on CPU)"
  "${PYTHON}" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("sglang") is None)' \
    || bad "PYTHON=${PYTHON} has no SGLang, which serves the teacher and the rollouts (pip install -e \".[gpu]\"):" \
      "DRY_RUN=1 checks the flags and prints the plan without it"
  # Ray's command beside PYTHON (an unactivated venv's), else on PATH; curl asks the teacher for its health.
  RAY="$(dirname "${PYTHON}")/ray"; [ -x "${RAY}" ] || RAY="$(command -v ray || true)"
  [ -n "${RAY}" ] || bad "no ray command beside PYTHON=${PYTHON} or on PATH: install ray into that Python's environment"
  command -v curl > /dev/null || bad "curl is not installed: the script asks the teacher server's health with it"
  for var in STUDENT TEACHER; do
    [ -d "${!var}" ] || bad "${var}=${!var} is not a folder: point it at the local checkpoint (models are not downloaded)"
  done
fi

# Per-environment horizon (k_max = max_env_steps), curriculum speed eta and step budget (official).
case "${TASK_ENV}" in
  scienceworld) MAX_TURNS=30; STEPS=250; if [ "${TCOD_MODE}" = f2b ]; then ETA=6; else ETA=5; fi ;;
  alfworld)     MAX_TURNS=30; STEPS=250; if [ "${TCOD_MODE}" = f2b ]; then ETA=6; else ETA=5; fi ;;
  webshop)      MAX_TURNS=15; STEPS=150; ETA=4 ;;
  *) echo "TASK_ENV must be scienceworld, alfworld or webshop (got ${TASK_ENV})" >&2; exit 2 ;;
esac
# The env package dispatches on each row's metadata["env"] (upstream's build_env(sample, args) contract).
ENV_PATH="examples.agent_envs"
TRAIN_GPUS=$(( NUM_GPUS - TEACHER_GPUS ))
ROLLOUT_GPUS=$(( TRAIN_GPUS / 2 ))
ACTOR_GPUS=$(( TRAIN_GPUS - ROLLOUT_GPUS ))
case "${TRAIN_BACKEND}" in
  fsdp) ;;
  megatron)
    # Tensor parallelism needs a multiple of TP trainer GPUs (8 GPUs, 2 for the teacher, TP 2: 2 train and
    # 4 roll out, as in upstream's run-qwen3-8B-opd.sh; TP 4: 4 and 2).
    ACTOR_GPUS=$(( ACTOR_GPUS / TP * TP ))
    [ "${ACTOR_GPUS}" -gt 0 ] || ACTOR_GPUS="${TP}"
    ROLLOUT_GPUS=$(( TRAIN_GPUS - ACTOR_GPUS ))
    [ "${ROLLOUT_GPUS}" -ge 1 ] || { echo "TP=${TP} leaves no GPU for the rollout engines" >&2; exit 2; } ;;
  *) echo "TRAIN_BACKEND must be fsdp or megatron (got ${TRAIN_BACKEND})" >&2; exit 2 ;;
esac

CKPT_ARGS=(--hf-checkpoint "${STUDENT}" --ref-load "${STUDENT}" --save "${SAVE}" --save-interval 25)
# A SAVE that holds a run (a checkpoint, or metrics rows of a run that stopped before its first one) is resumed:
# train.py refuses a fresh run into it.
if [ -f "${SAVE}/latest_checkpointed_iteration.txt" ] || [ -s "${SAVE}/metrics.jsonl" ]; then
  CKPT_ARGS+=(--load "${SAVE}")
fi

ROLLOUT_ARGS=(
  --prompt-data "${DATA}" --input-key input --label-key label --metadata-key metadata
  --rollout-batch-size 16 --n-samples-per-prompt 1 --num-rollout "${STEPS}"
  --rollout-temperature 1.0 --rollout-top-p 1.0
  --rollout-max-response-len 16384 --max-turn-response-len 512
  --custom-generate-function-path examples.multi_turn_tcod.rollout.generate
)
MULTI_TURN_ARGS=(--max-turns "${MAX_TURNS}" --rollout-interaction-env-path "${ENV_PATH}")
EVAL_ARGS=(--eval-prompt-data "${TASK_ENV}" "${EVAL_DATA}" --eval-interval 25 --eval-temperature 0.4)
OPD_ARGS=(
  --use-opd --opd-type sglang --opd-kl-coef 1.0
  --custom-rm-path slime.rollout.on_policy_distillation.reward_func
  --custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards
  --rm-url "http://127.0.0.1:${TEACHER_PORT}/generate"
)
TCOD_ARGS=(--use-tcod --tcod-mode "${TCOD_MODE}" --tcod-k-start 1 --tcod-eta "${ETA}" --tcod-k-max "${MAX_TURNS}")
[ "${TCOD_MODE}" = b2f ] && TCOD_ARGS+=(--tcod-prefix-source expert)
ALGO_ARGS=(--advantage-estimator grpo --eps-clip 0.2 --kl-coef 0.0 --entropy-coef 0.0)
OPTIMIZER_ARGS=(--lr 1e-6 --weight-decay 0.0 --adam-beta1 0.9 --adam-beta2 0.999 --clip-grad 1.0)
CLUSTER_ARGS=(
  --train-backend "${TRAIN_BACKEND}" --actor-num-nodes 1 --actor-num-gpus-per-node "${ACTOR_GPUS}"
  --rollout-backend sglang --rollout-num-gpus "${ROLLOUT_GPUS}" --rollout-num-gpus-per-engine 1
  --global-batch-size 16 --micro-batch-size 1
)
# Memory (as upstream's OPD script): recompute every layer in backward, and pack micro-batches by tokens
# so a 16k-token trajectory and short ones share a budget (see the --dry-run memory plan).
PERF_ARGS=(--recompute-granularity full --use-dynamic-batch-size --max-tokens-per-gpu 16384)
MODEL_ARGS=()
MISC_ARGS=()
if [ "${TRAIN_BACKEND}" = megatron ]; then
  # Qwen3-8B as upstream's scripts/models/qwen3-8B.sh describes it; start-up checks it against
  # ${STUDENT}/config.json (docs/en/megatron_backend.md).
  MODEL_ARGS=(
    --swiglu --num-layers 36 --hidden-size 4096 --ffn-hidden-size 12288
    --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128
    --use-rotary-position-embeddings --rotary-base 1000000 --disable-bias-linear
    --normalization RMSNorm --norm-epsilon 1e-6 --qk-layernorm
    --vocab-size 151936 --untie-embeddings-and-output-weights
  )
  PERF_ARGS=(
    --tensor-model-parallel-size "${TP}" --sequence-parallel --pipeline-model-parallel-size 1
    --context-parallel-size 1 --expert-model-parallel-size 1 --expert-tensor-parallel-size 1
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
    --use-dynamic-batch-size --max-tokens-per-gpu 16384
  )
  MISC_ARGS=(
    --attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32
    --attention-softmax-in-fp32 --attention-backend flash
  )
fi
ALL_ARGS=("${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${MULTI_TURN_ARGS[@]}" "${EVAL_ARGS[@]}" "${OPD_ARGS[@]}"
          "${TCOD_ARGS[@]}" "${ALGO_ARGS[@]}" "${OPTIMIZER_ARGS[@]}" "${CLUSTER_ARGS[@]}" "${PERF_ARGS[@]}"
          "${MODEL_ARGS[@]}" "${MISC_ARGS[@]}")

cd "${REPO_DIR}"
if [ "${REHEARSAL:-0}" = 1 ]; then
  REHEARSAL_ARGS=(--task-env "${TASK_ENV}" --dir "${REHEARSAL_DIR:-$(mktemp -d -t slime-rehearsal-XXXXXX)}")
  exec "${PYTHON}" -m scripts.rehearsal "${REHEARSAL_ARGS[@]}" -- "${ALL_ARGS[@]}"
fi
# Checked here rather than by train.py, to say how to make the file. ScienceWorld numbers the variations of
# a task by seed: 0..149 are its train split and 150..224 its dev split; some variations of the two open
# with the same observation, so the eval file is made excluding the train file's tasks: the two are disjoint.
# make_data is a module of this checkout, so the command it prints runs from the repository root.
need_data() {  # need_data VARIABLE PATH TASKS FIRST_SEED [FILE_OF_TASKS_TO_LEAVE_OUT]
  [ -f "$2" ] && return 0
  local cd_repo=""
  [ "${CALLER_DIR}" = "${REPO_DIR}" ] || cd_repo="cd ${REPO_DIR} && "
  case "${TASK_ENV}" in
    scienceworld) echo "run-qwen3-8B-tcod-runtime.sh: ${1}=${2} does not exist; make it with: ${cd_repo}${PYTHON} -m examples.agent_envs.make_data --env scienceworld --n ${3} --seed ${4}${5:+ --exclude ${5}} --out ${2}" >&2 ;;
    *) echo "run-qwen3-8B-tcod-runtime.sh: ${1}=${2} does not exist; ${TASK_ENV} tasks are rows written from its downloaded data (examples/agent_envs/README.md, ALFWorld and WebShop)" >&2 ;;
  esac
  exit 2
}
need_data DATA "${DATA}" 150 0
need_data EVAL_DATA "${EVAL_DATA}" 75 150 "${DATA}"
if [ "${DRY_RUN:-0}" = 1 ]; then
  # train.py's dry run checks the model folders as the real run does. Without STUDENT's weights on this
  # machine, the plan is made from its config.json (--model-config-json), or from Qwen3-8B's shape, this
  # script's model, when STUDENT is not here at all; the line below says which.
  PLAN_ARGS=()
  if ! compgen -G "${STUDENT}/*.safetensors" > /dev/null; then
    CONFIG="${STUDENT}/config.json"
    if [ ! -f "${CONFIG}" ]; then
      CONFIG="$(mktemp -t qwen3-8b-config-XXXXXX.json)"
      cat > "${CONFIG}" <<'JSON'
{"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
 "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
 "tie_word_embeddings": false, "max_position_embeddings": 40960}
JSON
    fi
    echo "run-qwen3-8B-tcod-runtime.sh: STUDENT=${STUDENT} has no weights on this machine: the plan reads ${CONFIG}; the real run needs the folder" >&2
    PLAN_ARGS=(--model-config-json "${CONFIG}")
  fi
  exec "${PYTHON}" train.py --dry-run "${ALL_ARGS[@]}" "${PLAN_ARGS[@]}"
fi

# 1. The teacher: an SGLang server on the last TEACHER_GPUS devices (outside Ray), scoring only. Its log sits
#    beside SAVE, whose parent folder is made first, so the log a failure names is there to read.
TEACHER_LOG="${SAVE%/}.teacher.log"
mkdir -p "$(dirname "${TEACHER_LOG}")" || bad "SAVE=${SAVE}: cannot make its parent folder for ${TEACHER_LOG}"
TEACHER_DEVICES=$(seq -s, $(( NUM_GPUS - TEACHER_GPUS )) $(( NUM_GPUS - 1 )))
CUDA_VISIBLE_DEVICES="${TEACHER_DEVICES}" "${PYTHON}" -m sglang.launch_server --model-path "${TEACHER}" \
  --host 127.0.0.1 --port "${TEACHER_PORT}" --tp-size "${TEACHER_GPUS}" --mem-fraction-static 0.8 \
  > "${TEACHER_LOG}" 2>&1 &
TEACHER_PID=$!
trap 'kill ${TEACHER_PID} 2>/dev/null || true' EXIT
echo "run-qwen3-8B-tcod-runtime.sh: starting the teacher server on GPU(s) ${TEACHER_DEVICES}; its log: ${TEACHER_LOG}"
until curl -sf "http://127.0.0.1:${TEACHER_PORT}/health_generate" > /dev/null; do
  if ! kill -0 "${TEACHER_PID}" 2> /dev/null; then
    echo "run-qwen3-8B-tcod-runtime.sh: the teacher server exited before it was healthy; its log: ${TEACHER_LOG}" \
      "(last line: $(tail -n 1 "${TEACHER_LOG}"))" >&2
    exit 1
  fi
  sleep 5
done

# 2. Ray with only the remaining devices, then the job: RolloutManager reserves ROLLOUT_GPUS of them for
#    the engines (one Ray actor per engine, the server inherits its CUDA_VISIBLE_DEVICES), the trainer's
#    placement group gets the other ACTOR_GPUS.
export CUDA_VISIBLE_DEVICES=$(seq -s, 0 $(( TRAIN_GPUS - 1 )))
ray() { "${RAY}" "$@"; }  # the command found above
ray start --head --num-gpus "${TRAIN_GPUS}" --disable-usage-stats
ray job submit --address="http://127.0.0.1:8265" \
  --runtime-env-json="{\"working_dir\": \"${REPO_DIR}\"}" \
  -- "${PYTHON}" train.py "${ALL_ARGS[@]}"
