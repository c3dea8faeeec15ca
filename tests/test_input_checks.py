"""Early input checks (slime.launch.preflight): every path, data file and teacher vocabulary is checked
before Ray or any engine starts, and each failure names its flag."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiohttp import web

from slime.launch.preflight import preflight
from slime.utils.arguments import ArgumentError, get_parser, validate_args
from slime.utils.tiny_models import save_tiny_checkpoint

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    model = save_tiny_checkpoint(root / "model", hidden_size=16, num_layers=1, num_heads=2)
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"task {i}"}) + "\n" for i in range(3)))
    return {"root": root, "model": str(model), "data": str(data)}


def args_of(files, *extra, data=True):
    argv = ["--hf-checkpoint", files["model"], "--num-rollout", "2"]
    if data:
        argv += ["--prompt-data", files["data"]]
    argv += extra  # later flags win: a test's own --prompt-data replaces the good one
    return validate_args(get_parser().parse_args(argv))


def fails(args, *needles) -> str:
    with pytest.raises(ArgumentError) as err:
        preflight(args)
    for needle in needles:
        assert needle in str(err.value), f"{needle!r} not in: {err.value}"
    return str(err.value)


def variant(files, name, edit) -> str:
    """A copy of the model folder with one file edited (``edit(folder)``)."""
    folder = files["root"] / name
    if not folder.exists():
        shutil.copytree(files["model"], folder)
        edit(folder)
    return str(folder)


def permute_tokenizer(folder):
    """Swap the ids of two ordinary tokens: same size, different mapping."""
    path = folder / "tokenizer.json"
    tok = json.loads(path.read_text())
    vocab = tok["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    path.write_text(json.dumps(tok))


def widen_model_vocab(folder):
    config = json.loads((folder / "config.json").read_text())
    config["vocab_size"] += 28
    (folder / "config.json").write_text(json.dumps(config))


def test_valid_inputs_pass_and_give_the_tokenizer(files):
    inputs = preflight(args_of(files))
    assert inputs.tokenizer is not None and inputs.load_folder is None


def test_misspelled_model_folders_fail_at_once_naming_the_flag(files):
    missing = str(files["root"] / "no-such-model")
    start = time.monotonic()
    fails(args_of(files, "--hf-checkpoint", missing), "--hf-checkpoint", "no-such-model", "never downloaded")
    assert time.monotonic() - start < 5  # no hub retries
    fails(args_of(files, "--ref-load", missing), "--ref-load")
    fails(args_of(files, "--critic-load", missing, "--advantage-estimator", "ppo"), "--critic-load")
    empty = files["root"] / "empty"
    empty.mkdir(exist_ok=True)  # exists, so validation passes; preflight wants a HF folder
    fails(args_of(files, "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", str(empty)),
          "--opd-teacher-load", "config.json")


def test_num_rollout_is_required(files):
    fails(validate_args(get_parser().parse_args(["--hf-checkpoint", files["model"]])), "--num-rollout")


def test_prompt_data_must_be_given_exist_and_parse(files):
    fails(args_of(files, data=False), "--prompt-data is required")
    fails(args_of(files, "--prompt-data", str(files["root"] / "nope.jsonl")), "--prompt-data", "does not exist")
    bad = files["root"] / "bad.jsonl"
    bad.write_text('{"input": "a"}\n{"input": "b"}\n{"input": \n')
    fails(args_of(files, "--prompt-data", str(bad)), "--prompt-data", f"{bad}:3", "not valid JSON")
    fails(args_of(files, "--eval-prompt-data", "heldout", str(bad), "--eval-interval", "1"),
          "--eval-prompt-data heldout", f"{bad}:3")


def test_custom_rollout_function_may_do_without_prompt_data(files):
    preflight(args_of(files, "--rollout-function-path", "my_pkg.rollout.generate", data=False))


def test_load_of_a_folder_without_checkpoint_starts_fresh_but_a_missing_iteration_fails(files):
    # upstream's --load $SAVE --save $SAVE from the first run (tests/test_resume_checks.py has its line)
    assert preflight(args_of(files, "--load", str(files["root"] / "no-ckpt"))).load_folder is None
    fails(args_of(files, "--load", str(files["root"] / "no-ckpt" / "iter_0000004")), "--load", "iter_0000004")


def test_in_trainer_teacher_with_a_permuted_tokenizer_is_rejected(files):
    permuted = variant(files, "permuted", permute_tokenizer)
    fails(args_of(files, "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", permuted),
          "--opd-teacher-load", "maps tokens differently")
    fails(args_of(files, "--ref-load", permuted), "--ref-load", "maps tokens differently")
    preflight(args_of(files, "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", files["model"]))


def test_in_trainer_teacher_with_another_model_vocabulary_is_rejected(files):
    wide = variant(files, "wide", widen_model_vocab)
    fails(args_of(files, "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", wide),
          "--opd-teacher-load", "model vocabulary")


def test_the_trainer_itself_rejects_a_permuted_teacher(files):
    from slime.backends.fsdp_utils.actor import FSDPActor
    from slime.backends.fsdp_utils.launch import ensure_single_process_group

    ensure_single_process_group()
    permuted = variant(files, "permuted", permute_tokenizer)
    args = args_of(files, "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", permuted)
    with pytest.raises(ValueError, match="--opd-teacher-load .*maps tokens differently"):
        FSDPActor(args, 0, 1)


@pytest.fixture
def teacher_info_server():
    """A stub teacher answering /get_model_info with whatever the test puts in ``reply``."""
    sys.path.insert(0, str(REPO / "tests"))
    from _engine_helpers import ThreadedApp

    reply = {}

    async def model_info(request):
        return web.json_response(reply)

    app = web.Application()
    app.router.add_get("/get_model_info", model_info)
    server = ThreadedApp(app)
    yield server.url, reply
    server.stop()


def test_server_teacher_whose_model_vocabulary_differs_is_rejected(files, teacher_info_server):
    url, reply = teacher_info_server
    from transformers import AutoTokenizer

    size = len(AutoTokenizer.from_pretrained(files["model"]))
    server = ["--use-opd", "--opd-type", "sglang", "--rm-url", f"{url}/generate", "--rollout-temperature", "1"]
    reply.update(vocab_size=size, tokenizer_path=files["model"], model_path=files["model"])
    preflight(args_of(files, *server))  # same tokenizer, same model: accepted
    reply.update(model_vocab_size=size + 28)  # the reply's own field (hf_engine)
    fails(args_of(files, *server), "model vocabulary", str(size + 28))
    del reply["model_vocab_size"]
    reply.update(model_path=variant(files, "wide", widen_model_vocab))  # real SGLang: read the model folder
    fails(args_of(files, *server), "model vocabulary", str(size + 28))
    reply.update(model_path=files["model"], tokenizer_path=variant(files, "permuted", permute_tokenizer))
    fails(args_of(files, *server), "maps tokens differently")


def test_train_py_fails_fast_without_starting_ray(files):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "train.py", "--hf-checkpoint", str(files["root"] / "typo-model"),
                           "--prompt-data", files["data"], "--num-rollout", "1", "--allow-no-reward"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "train.py: error: --hf-checkpoint" in output and "typo-model" in output
    assert "ray" not in output.lower(), output  # no "Started a local Ray instance"
    assert time.monotonic() - start < 60


def test_megatron_loads_shape_flags_and_tensor_parallelism_are_checked(files):
    root = files["root"] / "megatron-ref"
    (root / "iter_0000004").mkdir(parents=True, exist_ok=True)
    (root / "latest_checkpointed_iteration.txt").write_text("4\n")
    fails(args_of(files, "--ref-load", str(root)), "--ref-load", "iter_0000004", "needs --train-backend megatron")
    megatron = ["--train-backend", "megatron"]
    preflight(args_of(files, *megatron, "--ref-load", str(root)))  # its vocabulary is the trainer's to check
    fails(args_of(files, *megatron, "--ref-load", str(root), "--ref-ckpt-step", "9"), "--ref-load", "iter_0000009")
    fails(args_of(files, "--ref-ckpt-step", "2"), "--ref-load", "checkpoint step 2")  # the HF policy folder
    fails(args_of(files, "--hidden-size", "99"), f"--hidden-size 99 but --hf-checkpoint {files['model']}",
          "has hidden_size 16")
    fails(args_of(files, *megatron, "--actor-num-gpus-per-node", "4", "--tensor-model-parallel-size", "4"),
          "--tensor-model-parallel-size 4 must divide", "config.json")
