"""PPO with --kl-ctrl adaptive, then a resume from its checkpoint.

Under --ci-test the actor asserts at every step that the PPO rewards were shaped with the controller's coefficient
(``check_reward_kl_coef`` logs the fitted slope and its tolerance; no KL to fit fails after rollout 0), that the
coefficient is the same on every rank, and on resume that the controller state of the loaded rollout was restored.
"""

import os
import tempfile

import slime.utils.external_utils.command_utils as U

MODEL_NAME = "Qwen3-4B"
MODEL_TYPE = "qwen3-4B"
NUM_GPUS = 8
SAVE_DIR = f"/root/{MODEL_NAME}_ppo_adaptive_kl"
# The critic's args are a copy of the actor's: without its own directory it would save into (and on resume
# load from) the actor's checkpoint. Its save / load go through its role overrides in --megatron-config-path.
CRITIC_SAVE_DIR = f"{SAVE_DIR}_critic"


def prepare():
    U.exec_command("mkdir -p /root/models /root/datasets")
    U.exec_command(f"hf download Qwen/{MODEL_NAME} --local-dir /root/models/{MODEL_NAME}")
    U.hf_download_dataset("zhuzilin/dapo-math-17k")
    U.convert_checkpoint(model_name=MODEL_NAME, megatron_model_type=MODEL_TYPE, num_gpus_per_node=NUM_GPUS)
    U.exec_command(f"rm -rf {SAVE_DIR} {CRITIC_SAVE_DIR}")


def execute(num_rollout: int, load: bool):
    megatron_config = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    critic_ckpt = f"      save: {CRITIC_SAVE_DIR}\n" + (f"      load: {CRITIC_SAVE_DIR}\n" if load else "")
    megatron_config.write(
        "megatron:\n"
        f"  - name: default\n    role: critic\n    overrides:\n      lr: 1e-5\n{critic_ckpt}"
        "  - name: default\n    role: actor\n    overrides:\n      lr: 1e-6\n"
    )
    megatron_config.close()

    ckpt_args = (
        f"--hf-checkpoint /root/models/{MODEL_NAME}/ "
        f"--ref-load /root/{MODEL_NAME}_torch_dist "
        f"--save {SAVE_DIR} --save-interval 2 "
        f"{f'--load {SAVE_DIR} ' if load else ''}"
    )
    rollout_args = (
        "--prompt-data /root/datasets/dapo-math-17k/dapo-math-17k.jsonl "
        "--input-key prompt --label-key label --apply-chat-template --rollout-shuffle "
        "--rm-type deepscaler "
        f"--num-rollout {num_rollout} "
        "--rollout-batch-size 4 --n-samples-per-prompt 4 "
        "--rollout-max-response-len 2048 --rollout-temperature 0.8 "
        "--global-batch-size 16 --balance-data "
    )
    perf_args = (
        "--tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 1 "
        "--context-parallel-size 2 "
        "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
        "--use-dynamic-batch-size --max-tokens-per-gpu 8192 "
    )
    # A short horizon so that each step of 16 samples moves the coefficient by up to 0.2 * 16 / 32 = 10%: far
    # more than the CI check's tolerance, so --kl-coef handed in instead of the controller's value fails it.
    ppo_args = (
        "--advantage-estimator ppo "
        "--kl-coef 0.01 --kl-ctrl adaptive --kl-target 0.001 --kl-horizon 32 --kl-loss-type k1 "
        "--entropy-coef 0.00 --eps-clip 4e-4 --normalize-advantages "
    )
    optimizer_args = (
        "--optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98 "
    )
    sglang_args = "--rollout-num-gpus-per-engine 2 --rollout-num-gpus 8 --sglang-mem-fraction-static 0.8 "
    misc_args = (
        "--attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32 "
        "--attention-softmax-in-fp32 --attention-backend flash "
        "--actor-num-nodes 1 --actor-num-gpus-per-node 8 --colocate "
    )
    train_args = (
        f"--megatron-config-path {megatron_config.name} {ckpt_args} {rollout_args} {optimizer_args} {ppo_args} "
        f"{U.get_default_wandb_args(__file__)} {perf_args} {sglang_args} --ci-test {misc_args}"
    )
    U.execute_train(train_args=train_args, num_gpus_per_node=NUM_GPUS, megatron_model_type=MODEL_TYPE)


if __name__ == "__main__":
    prepare()
    for proxy_var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        os.environ.pop(proxy_var, None)
    execute(num_rollout=2, load=False)  # saves rollout 1: actor and controller state, and the critic apart
    execute(num_rollout=4, load=True)  # resumes from rollout 1: --ci-test asserts the saved coefficient came back
