"""Upstream's Megatron model-shape flags against HF configs (slime/arguments/megatron_shape.py) and where a
model-loading flag points (slime/backends/megatron_utils/load_paths.py)."""

from __future__ import annotations

import pytest
import transformers

from slime.arguments.megatron_shape import shape_flags_given, shape_mismatches, tp_divisibility_error
from slime.backends.megatron_utils.load_paths import LoadSource, resolve_load
from slime.utils.arguments import get_parser, validate_args

SOURCE = "--hf-checkpoint /m/config.json"
# A tiny Qwen3 and the MODEL_ARGS array upstream's scripts/models/qwen3-*.sh would write for it.
QWEN3 = transformers.Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=1e6,
                                 rms_norm_eps=1e-6, tie_word_embeddings=False).to_dict()
QWEN3_ARGS = ["--swiglu", "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "96",
              "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
              "--use-rotary-position-embeddings", "--disable-bias-linear", "--normalization", "RMSNorm",
              "--norm-epsilon", "1e-6", "--rotary-base", "1000000", "--vocab-size", "128", "--kv-channels", "16",
              "--qk-layernorm", "--untie-embeddings-and-output-weights"]
# Llama 3.1's RoPE scaling (upstream's llama3.1-8B-Instruct.sh flags, scaled down).
LLAMA = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=131072,
                                 rms_norm_eps=1e-5, rope_theta=5e5, tie_word_embeddings=True,
                                 rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 8192}).to_dict()
LLAMA_ARGS = ["--swiglu", "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "96",
              "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2",
              "--max-position-embeddings", "131072", "--use-rotary-position-embeddings", "--disable-bias-linear",
              "--normalization", "RMSNorm", "--norm-epsilon", "1e-5", "--rotary-base", "500000",
              "--vocab-size", "128", "--kv-channels", "16", "--use-rope-scaling", "--rotary-scaling-factor", "8.0"]


def args_of(*argv):
    return validate_args(get_parser().parse_args(list(argv)))


def replaced(argv, flag, value):
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def test_upstreams_model_args_agree_with_the_configs():
    assert shape_mismatches(args_of(*QWEN3_ARGS), QWEN3, SOURCE) == []
    assert shape_mismatches(args_of(*LLAMA_ARGS), LLAMA, SOURCE) == []
    # transformers 4 wrote rope_theta at the top level and rope_scaling beside it.
    old = {k: v for k, v in LLAMA.items() if k != "rope_parameters"}
    old.update(rope_theta=500000.0, rope_scaling=LLAMA["rope_parameters"])
    assert shape_mismatches(args_of(*LLAMA_ARGS), old, SOURCE) == []
    assert shape_mismatches(args_of(), QWEN3, SOURCE) == [] and shape_flags_given(args_of()) == []


def test_a_value_mismatch_names_flag_value_key_and_value():
    (message,) = shape_mismatches(args_of(*replaced(QWEN3_ARGS, "--hidden-size", "4096")), QWEN3, SOURCE)
    assert message == "--hidden-size 4096 but --hf-checkpoint /m/config.json has hidden_size 64"
    (message,) = shape_mismatches(args_of(*replaced(QWEN3_ARGS, "--rotary-base", "10000")), QWEN3, SOURCE)
    assert message.startswith("--rotary-base 10000 but") and "rope_theta 1000000.0" in message
    (message,) = shape_mismatches(args_of(*replaced(LLAMA_ARGS, "--rotary-scaling-factor", "32")), LLAMA, SOURCE)
    assert "--rotary-scaling-factor 32.0" in message and "factor 8.0" in message
    (message,) = shape_mismatches(args_of(*replaced(QWEN3_ARGS, "--num-query-groups", "4")), QWEN3, SOURCE)
    assert "--num-query-groups 4" in message and "num_key_value_heads 2" in message


def test_switches_are_compared_both_ways():
    no_qk_norm = [a for a in QWEN3_ARGS if a != "--qk-layernorm"]
    (message,) = shape_mismatches(args_of(*no_qk_norm), QWEN3, SOURCE)
    assert message == "--qk-layernorm not given but --hf-checkpoint /m/config.json has model_type qwen3"
    tied = {**QWEN3, "tie_word_embeddings": True}
    assert shape_mismatches(args_of(*QWEN3_ARGS), tied, SOURCE) == [
        "--untie-embeddings-and-output-weights given but --hf-checkpoint /m/config.json has tie_word_embeddings true"]
    qwen2 = {**transformers.Qwen2Config(**{k: QWEN3[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                                  "num_hidden_layers", "num_attention_heads",
                                                                  "num_key_value_heads")}).to_dict()}
    qwen2_args = [a for a in QWEN3_ARGS if a not in ("--qk-layernorm", "--untie-embeddings-and-output-weights")]
    problems = shape_mismatches(args_of(*qwen2_args), qwen2, SOURCE)
    assert any(p.startswith("--add-qkv-bias not given") for p in problems), problems
    assert not any("--add-qkv-bias" in p for p in shape_mismatches(args_of(*qwen2_args, "--add-qkv-bias"), qwen2,
                                                                   SOURCE))
    without_gqa = [a for a in QWEN3_ARGS if a != "--group-query-attention"]
    with pytest.warns(UserWarning):
        problems = shape_mismatches(args_of(*without_gqa), QWEN3, SOURCE)
    assert problems == ["--group-query-attention not given (one query group per head: 4) but "
                        "--hf-checkpoint /m/config.json has num_key_value_heads 2"]
    (message,) = shape_mismatches(args_of(*[a for a in LLAMA_ARGS if a != "--use-rope-scaling"]), LLAMA, SOURCE)
    assert message.startswith("--use-rope-scaling not given") and "llama3" in message


def test_tensor_parallel_size_must_divide_heads_and_groups():
    assert tp_divisibility_error(2, 32, 8, "of x") is None
    message = tp_divisibility_error(16, 32, 8, "of x")
    assert "--tensor-model-parallel-size 16" in message and "(32)" in message and "(8)" in message


def _megatron_root(root, *iterations, latest=None):
    root.mkdir()
    for it in iterations:
        (root / (it if isinstance(it, str) else f"iter_{it:07d}")).mkdir()
    if latest is not None:
        (root / "latest_checkpointed_iteration.txt").write_text(f"{latest}\n")
    return root


def test_resolve_load_tells_hf_folders_from_megatron_roots(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"")
    assert resolve_load(str(hf), "--ref-load") == LoadSource("hf", str(hf), None)
    root = _megatron_root(tmp_path / "mg", 10, 20, latest=20)
    assert resolve_load(str(root), "--ref-load") == LoadSource("megatron", str(root / "iter_0000020"), 20)
    assert resolve_load(str(root), "--ref-load", ckpt_step=10) == LoadSource("megatron", str(root / "iter_0000010"), 10)
    release = _megatron_root(tmp_path / "rel", "release", latest="release")
    assert resolve_load(str(release), "--opd-teacher-load") == LoadSource("megatron", str(release / "release"), None)
    # Megatron's --ckpt-step needs no tracker file.
    bare = _megatron_root(tmp_path / "bare", 5)
    assert resolve_load(str(bare), "--ref-load", 5).iteration == 5


@pytest.mark.parametrize("case,error,needles", [
    ("missing", FileNotFoundError, ["--ref-load", "is not a folder", "config.json"]),
    ("empty", FileNotFoundError, ["--ref-load", "neither", "config.json", "latest_checkpointed_iteration.txt"]),
    ("no-iteration", FileNotFoundError, ["--ref-load", "iter_0000030", "is not there"]),
    ("no-step", FileNotFoundError, ["--ref-load", "checkpoint step 7", "iter_0000007"]),
    ("bad-tracker", ValueError, ["--ref-load", "'abc'"]),
    ("hf-with-step", ValueError, ["--ref-load", "checkpoint step 3"]),
])
def test_resolve_load_failures_name_flag_path_and_expectation(tmp_path, case, error, needles):
    path, step = tmp_path / case, None
    if case == "empty":
        path.mkdir()
    elif case == "no-iteration":
        _megatron_root(path, 20, latest=30)
    elif case == "no-step":
        _megatron_root(path, 20, latest=20)
        step = 7
    elif case == "bad-tracker":
        _megatron_root(path, 20, latest="abc")
    elif case == "hf-with-step":
        path.mkdir()
        (path / "config.json").write_text("{}")
        (path / "model.safetensors").write_bytes(b"")
        step = 3
    with pytest.raises(error) as err:
        resolve_load(str(path), "--ref-load", step)
    for needle in needles + [str(path)]:
        assert needle in str(err.value), (needle, str(err.value))
