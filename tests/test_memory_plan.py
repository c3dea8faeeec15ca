"""The --dry-run memory plan (slime/launch/memory_plan.py): validated against measured CPU peaks, and the
GPU script's plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slime.launch.memory_plan import ModelShape, describe_memory, plan_memory
from slime.launch.plan import describe_plan
from slime.utils.arguments import get_parser, validate_args

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import trainer_memory  # noqa: E402

# Qwen3-8B's config.json (the fields the plan reads), so no download is needed.
QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096,
            "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def test_estimate_is_within_25_percent_of_measured_cpu_peaks():
    rows = trainer_memory.run_validation()
    assert len(rows) == 3
    for row in rows:
        assert abs(row["error"]) < 0.25, row


def test_qwen3_8b_parameter_count():
    assert ModelShape.from_config(QWEN3_8B).params == pytest.approx(8.19e9, rel=0.005)


def _plan(tmp_path, *argv):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(QWEN3_8B))
    args = validate_args(get_parser().parse_args(["--model-config-json", str(config), *argv]))
    return "\n".join(describe_memory(args))


def test_plan_names_components_and_verdict(tmp_path):
    base = ["--actor-num-gpus-per-node", "3", "--rollout-max-response-len", "16384", "--rollout-batch-size", "16"]
    plain = _plan(tmp_path, *base)
    assert "does NOT fit in --gpu-memory-gb 80" in plain and "--recompute-granularity full" in plain
    fitted = _plan(tmp_path, *base, "--recompute-granularity", "full", "--use-dynamic-batch-size",
                   "--max-tokens-per-gpu", "16384")
    for part in ("weights", "gradients", "optimizer", "activations", "log-prob workspace"):
        assert part in fitted
    assert "fits in --gpu-memory-gb 80" in fitted and "does NOT" not in fitted
    assert "does NOT fit in --gpu-memory-gb 40" in _plan(tmp_path, *base, "--recompute-granularity", "full",
                                                          "--gpu-memory-gb", "40")


def test_plan_without_a_config_says_how_to_get_one():
    args = validate_args(get_parser().parse_args(["--hf-checkpoint", "/nonexistent/Qwen3-8B"]))
    (line,) = describe_memory(args)
    assert "skipped" in line and "--model-config-json" in line


MEMORY_FLAGS = ["--recompute-granularity", "full", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "16384"]


def _tasks(tmp_path) -> Path:
    """--dry-run checks the data files: one task row with expert actions (the script's default is B2F)."""
    data = tmp_path / "tasks.jsonl"
    data.write_text(json.dumps({"input": "go", "label": "{}", "metadata": {"env": "gridnav", "seed": 0}, "expert_actions": ["up"]}) + "\n")
    return data


@pytest.mark.parametrize("extra", [[], MEMORY_FLAGS], ids=["as-is", "memory-flags"])
def test_gpu_run_script_prints_a_memory_plan(tmp_path, extra):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_8B))
    # PYTHON is a wrapper that appends flags to the script's own (the same flags twice are harmless).
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@" {" ".join(extra)}\n')
    wrapper.chmod(0o755)
    data = _tasks(tmp_path)
    out = subprocess.run(["bash", "scripts/run-qwen3-8B-tcod-runtime.sh"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120,
                         env={**os.environ, "DRY_RUN": "1", "STUDENT": str(tmp_path), "PYTHON": str(wrapper),
                              "DATA": str(data), "EVAL_DATA": str(data)})
    assert out.returncode == 0, out.stderr
    assert "memory    : per trainer device" in out.stdout and "8.19B parameters" in out.stdout
    if extra:
        assert "fits in --gpu-memory-gb 80" in out.stdout and "does NOT" not in out.stdout


def test_megatron_plan_splits_the_model_over_tensor_parallel_ranks(tmp_path):
    def plan(tp, *extra):
        argv = ["--train-backend", "megatron", "--actor-num-gpus-per-node", tp, "--tensor-model-parallel-size", tp,
                "--rollout-max-response-len", "16384", *MEMORY_FLAGS, *extra]
        args = validate_args(get_parser().parse_args(argv))
        return args, plan_memory(args, QWEN3_8B)

    _, one = plan("1")
    args, two = plan("2", "--sequence-parallel")
    assert set(one.phases) == set(two.phases) == {"LM-head backward", "layer backward", "optimizer step"}
    for phase in one.phases:
        for part in ("weights", "gradients", "optimizer"):
            assert two.phases[phase][part] == one.phases[phase][part] // 2, (phase, part)
    for phase in ("LM-head backward", "layer backward"):
        assert 0 < two.phases[phase]["activations"] < one.phases[phase]["activations"]
    # The log-prob head runs on each rank's vocabulary rows: its buffers and weight-row gradient halve, the
    # response hidden states (and their gradient) do not.
    one_ws = one.phases["LM-head backward"]["log-prob workspace"]
    two_ws = two.phases["LM-head backward"]["log-prob workspace"]
    assert one_ws // 2 < two_ws < one_ws
    assert one_ws > 4 * QWEN3_8B["vocab_size"] * QWEN3_8B["hidden_size"]  # the float32 weight-row gradient
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_8B))
    args.model_config_json = str(tmp_path / "config.json")
    text = "\n".join(describe_plan(args))
    assert "parallel  : TP 2 x DP 1 (PP 1, CP 1), sequence parallel on" in text
    assert "Megatron TP 2 x DP 1" in text


def test_gpu_run_script_megatron_dry_run(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_8B))
    out = subprocess.run(["bash", "scripts/run-qwen3-8B-tcod-runtime.sh"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "DRY_RUN": "1", "STUDENT": str(tmp_path),
                                                      "PYTHON": sys.executable, "TRAIN_BACKEND": "megatron",
                                                      "DATA": str(_tasks(tmp_path)), "EVAL_DATA": str(_tasks(tmp_path))})
    assert out.returncode == 0, out.stderr
    assert "trainer   : megatron, 2 process(es)" in out.stdout and "engines   : 4 x sglang" in out.stdout
    assert "parallel  : TP 2 x DP 1 (PP 1, CP 1), sequence parallel on" in out.stdout
    assert "model args: 17 shape flags; all agree with the config" in out.stdout
    assert "memory    : per trainer device (estimate; Megatron TP 2 x DP 1" in out.stdout
