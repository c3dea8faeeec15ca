"""TCOD (examples/multi_turn_tcod) end to end: a few multi-turn rollouts of Qwen3-0.6B on gridnav.

    python tests/test_qwen3_0.6B_tcod.py [--tcod-mode {f2b,b2f}] [--opd-type {sglang,megatron}]

One configuration per run, each its own CI entry (sglang: 3 GPUs, megatron: 2). Qwen3 thinks first:
512-token turns, as the official TCOD code. The teacher is the student's own checkpoint (as in
test_qwen2.5_0.5B_opd_sglang.py); ``--ci-test`` makes the rollout-log hook assert the curriculum depth
and, with the teacher server, that it scored every trajectory.
"""

import os
import subprocess
import time
import urllib.request
from argparse import ArgumentParser

import slime.utils.external_utils.command_utils as U

ENABLE_EVAL = bool(int(os.environ.get("SLIME_TEST_ENABLE_EVAL", "1")))

MODEL_NAME = "Qwen3-0.6B"
MODEL_TYPE = "qwen3-0.6B"
NUM_GPUS = 3  # the default configuration's: 2 for the colocated actor and engines, 1 for the teacher server
NUM_TRAIN_GPUS = 2

TEACHER_HOST = "127.0.0.1"
TEACHER_PORT = 13141

DATA_DIR = "/root/datasets/tcod_gridnav"
NUM_ROLLOUT = 3
MAX_TURNS = 4
MAX_TURN_RESPONSE_LEN = 512
TCOD_ETA = 1  # the depth grows every step: 1, 2, 3

parser = ArgumentParser()
parser.add_argument("--tcod-mode", choices=["f2b", "b2f"], default="b2f")
parser.add_argument("--opd-type", choices=["sglang", "megatron"], default="sglang")


def prepare():
    U.exec_command("mkdir -p /root/models /root/datasets")
    U.exec_command(f"hf download Qwen/{MODEL_NAME} --local-dir /root/models/{MODEL_NAME}")
    U.convert_checkpoint(
        model_name=MODEL_NAME, megatron_model_type=MODEL_TYPE, num_gpus_per_node=NUM_TRAIN_GPUS, dir_dst="/root/models"
    )
    # 4x4 grids whose expert path has 2 to 4 moves, so that b2f replays a prefix at every depth.
    for split, seed, extra in (("train", 0, ""), ("eval", 100000, f"--exclude {DATA_DIR}/train.jsonl ")):
        U.exec_command(
            f"cd {U.repo_base_dir} && python -m examples.multi_turn_tcod.envs.make_data {extra}"
            f"--n 64 --seed {seed} --size 4 --min-len 2 --max-len {MAX_TURNS} --out {DATA_DIR}/{split}.jsonl"
        )


def _get_gpu_split(opd_type: str):
    """The first NUM_TRAIN_GPUS for the colocated actor and engines, the next one for the teacher server."""
    all_gpus = os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(NUM_GPUS))).split(",")
    needed = NUM_TRAIN_GPUS + (opd_type == "sglang")  # the sglang teacher serves on a GPU of its own
    if len(all_gpus) < needed:
        raise SystemExit(f"--opd-type {opd_type} needs {needed} GPUs, CUDA_VISIBLE_DEVICES has {len(all_gpus)}")
    return all_gpus[:NUM_TRAIN_GPUS], all_gpus[NUM_TRAIN_GPUS:needed]


def _launch_teacher_server(teacher_gpu: str):
    env = os.environ.copy()
    env["CUDA_VISIBLE_DEVICES"] = teacher_gpu
    log_path = "/tmp/sglang_tcod_teacher.log"
    command = f"python3 -m sglang.launch_server --model-path /root/models/{MODEL_NAME} --host {TEACHER_HOST} "
    command += f"--port {TEACHER_PORT} --tp-size 1 --mem-fraction-static 0.6"
    process = subprocess.Popen(command.split(), env=env, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    print(f"Starting teacher sglang server on GPU {teacher_gpu} (pid={process.pid}), log: {log_path}")
    for _ in range(120):
        if process.poll() is not None:
            raise RuntimeError(f"Teacher server process exited with code {process.returncode}. Check {log_path}")
        try:
            response = urllib.request.urlopen(f"http://{TEACHER_HOST}:{TEACHER_PORT}/health_generate", timeout=2)
            if response.status == 200:
                return process
        except Exception:
            pass
        time.sleep(5)
    process.kill()
    raise RuntimeError(f"Teacher server failed to start within timeout. Check {log_path}")


def _config_path():
    # A short horizon instead of the example's 12 turns; the keys are those of multi_turn_tcod_config.yaml.
    return U.save_to_temp_file(
        f"max_turns: {MAX_TURNS}\n"
        f"max_turn_response_len: {MAX_TURN_RESPONSE_LEN}\n"
        "rollout_interaction_env_path: examples.multi_turn_tcod.envs.gridnav\n"
        "env_step_timeout: 60\n",
        "yaml",
    )


def execute(tcod_mode: str, opd_type: str, train_gpus: list[str], teacher_gpus: list[str]):
    teacher_process = None

    # Restrict CUDA_VISIBLE_DEVICES to training GPUs before Ray starts
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(train_gpus)

    def launch_teacher():
        nonlocal teacher_process
        teacher_process = _launch_teacher_server(teacher_gpus[0])

    try:
        ckpt_args = f"--hf-checkpoint /root/models/{MODEL_NAME}/ --ref-load /root/models/{MODEL_NAME}_torch_dist "

        rollout_args = (
            f"--prompt-data {DATA_DIR}/train.jsonl --input-key input --label-key label --metadata-key metadata "
            f"--rollout-shuffle --num-rollout {NUM_ROLLOUT} --rollout-batch-size 8 --n-samples-per-prompt 2 "
            f"--global-batch-size 16 --rollout-max-response-len {MAX_TURNS * (MAX_TURN_RESPONSE_LEN + 128)} "
            "--rollout-temperature 0.8 "
            "--custom-generate-function-path examples.multi_turn_tcod.rollout.generate "
            f"--custom-config-path {_config_path()} "
            "--custom-rollout-log-function-path examples.multi_turn_tcod.metrics.log_rollout_data "
        )

        eval_args = (
            f"--eval-interval 2 --eval-prompt-data gridnav {DATA_DIR}/eval.jsonl --n-samples-per-eval-prompt 1 "
            f"--eval-max-response-len {MAX_TURNS * (MAX_TURN_RESPONSE_LEN + 128)} --eval-temperature 0.4 "
            if ENABLE_EVAL
            else ""
        )

        tcod_args = f"--use-tcod --tcod-mode {tcod_mode} --tcod-eta {TCOD_ETA} "

        perf_args = (
            "--tensor-model-parallel-size 1 --sequence-parallel --pipeline-model-parallel-size 1 "
            "--context-parallel-size 1 --expert-model-parallel-size 1 --expert-tensor-parallel-size 1 "
            "--use-dynamic-batch-size --max-tokens-per-gpu 4096 "
        )

        grpo_args = (
            f"--advantage-estimator grpo --use-opd --opd-type {opd_type} --opd-kl-coef 1.0 "
            "--entropy-coef 0.00 --eps-clip 0.2 "
        )

        if opd_type == "sglang":
            teacher_args = (
                "--custom-rm-path slime.rollout.on_policy_distillation.reward_func "
                "--custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards "
                f"--rm-url http://{TEACHER_HOST}:{TEACHER_PORT}/generate "
            )
        else:
            teacher_args = f"--opd-teacher-load /root/models/{MODEL_NAME}_torch_dist "

        optimizer_args = (
            "--optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 "
            "--adam-beta1 0.9 --adam-beta2 0.98 "
        )

        sglang_args = "--rollout-num-gpus-per-engine 1 --sglang-mem-fraction-static 0.6 "

        misc_args = (
            "--ci-test --attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32 "
            "--attention-softmax-in-fp32 --attention-backend flash "
            f"--actor-num-nodes 1 --actor-num-gpus-per-node {NUM_TRAIN_GPUS} --colocate "
        )

        wandb_args = U.get_default_wandb_args(__file__, run_name_prefix=f"{tcod_mode}_{opd_type}")
        train_args = "".join(
            (ckpt_args, rollout_args, optimizer_args, grpo_args, tcod_args, wandb_args, perf_args, eval_args)
            + (sglang_args, misc_args, teacher_args)
        )

        U.execute_train(
            train_args=train_args,
            num_gpus_per_node=NUM_TRAIN_GPUS,
            megatron_model_type=MODEL_TYPE,
            before_ray_job_submit=launch_teacher if opd_type == "sglang" else None,
        )
    finally:
        if teacher_process:
            teacher_process.kill()
            teacher_process.wait()
        U.exec_command("pkill -9 sglang; true")


if __name__ == "__main__":
    args = parser.parse_args()
    gpus = _get_gpu_split(args.opd_type)  # before prepare()'s downloads: a layout it cannot use stops here
    prepare()
    for proxy_var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        os.environ.pop(proxy_var, None)
    execute(args.tcod_mode, args.opd_type, *gpus)
