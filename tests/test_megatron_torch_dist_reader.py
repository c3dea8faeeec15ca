"""torch_dist_reader against checkpoints written by megatron-core's own ``dist_checkpointing.save``.

A tiny GPTModel (2 layers, GQA, qk-layernorm, SwiGLU) is saved at TP 1 in this process and at TP 2 by two
spawned gloo ranks; both must read back as the TP-1 model's ``state_dict()`` exactly. Megatron's CPU init
(``use_cpu_initialization``) draws each weight's full master tensor from the CPU generator and hands every
rank its rows (stride 2 for the GLU fc1, so each rank holds [gate_r; up_r]), so a TP-1 model built from the
same seed is the reference the TP-2 shards were cut from; the test checks that premise on the local shards.

Megatron's save on a CPU-only machine needs four patches, applied by ``_cpu_save_patches`` (inside this
test only): ``torch.cuda.synchronize`` (called after the D2H preload) becomes a no-op;
``torch.cuda.current_device`` returns "cpu" (the failure flag of the finalize step is a tensor put there);
the writer's results queue is a plain ``queue.Queue`` instead of a spawn-context ``Manager().Queue()``
(which starts a server process that re-imports ``__main__``); and ``_process_memory`` returns 0: it needs
psutil, and without it the forked writer raises before reporting, so the parent waits forever on its
``count_queue.join()`` -- the hang seen with a plain save. ``thread_count=1`` keeps one forked writer.
"""

from __future__ import annotations

import os
import pickle
import shutil

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron_helpers import save_torch_dist, torch_dist_save_patches  # noqa: E402

from slime.backends.fsdp_utils.launch import ensure_single_process_group, run_local_group  # noqa: E402
from slime.backends.megatron_utils.torch_dist_reader import (  # noqa: E402
    TorchDistReadError,
    UnsafeMetadataError,
    is_torch_dist,
    read_model_state,
)

SEED = 1234
NUM_LAYERS = 2


def _build_model(tp: int):
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    if ps.model_parallel_is_initialized():  # left by another test in this process (other layouts)
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(tp, 1)
    torch.manual_seed(SEED)  # the CPU generator draws every master weight
    model_parallel_cuda_manual_seed(SEED, inference_rng_tracker=True)
    config = TransformerConfig(
        num_layers=NUM_LAYERS, hidden_size=64, num_attention_heads=4, num_query_groups=2, kv_channels=16,
        ffn_hidden_size=128, normalization="RMSNorm", gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, qk_layernorm=True,
        use_cpu_initialization=True, hidden_dropout=0.0, attention_dropout=0.0, layernorm_epsilon=1e-6,
        params_dtype=torch.float32, tensor_model_parallel_size=tp)
    return GPTModel(config, get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm"), vocab_size=128,
                    max_sequence_length=256, position_embedding_type="rope", rotary_base=10000,
                    share_embeddings_and_output_weights=False)


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()
            if "_extra_state" not in k and isinstance(v, torch.Tensor)}


def save_tp2_rank(rank: int, world_size: int, folder: str) -> dict[str, torch.Tensor]:
    """One TP-2 rank (spawned): build, save, return the local shards the premise check needs."""
    from megatron.core import parallel_state as ps

    for owner, name, value in torch_dist_save_patches():
        setattr(owner, name, value)
    model = _build_model(world_size)
    save_torch_dist(model.sharded_state_dict(), folder)
    local = _weights(model)
    ps.destroy_model_parallel()
    return {k: local[k] for k in ("decoder.layers.0.self_attention.linear_qkv.weight",
                                  "decoder.layers.0.mlp.linear_fc1.weight", "embedding.word_embeddings.weight")}


def _assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        assert torch.equal(got[key], want[key]), key


@pytest.fixture(scope="module")
def tp1(tmp_path_factory):
    """The TP-1 reference weights, a plain save, and a Megatron-LM-style save with extra entries."""
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor

    root = tmp_path_factory.mktemp("torch_dist")
    ensure_single_process_group()
    with pytest.MonkeyPatch.context() as patch:
        for owner, name, value in torch_dist_save_patches():
            patch.setattr(owner, name, value)
        try:
            model = _build_model(1)
            save_torch_dist(model.sharded_state_dict(), root / "plain")
            # Megatron-LM's layout: the model under "model" (here also with a "model." key prefix), the
            # optimizer state as more sharded tensors, RNG state as a sharded object.
            exp_avg = ShardedTensor.from_rank_offsets("optimizer.state.exp_avg.output_layer.weight",
                                                      torch.ones(128, 64))
            save_torch_dist({"model": model.sharded_state_dict(prefix="model."), "optimizer": {"exp_avg": exp_avg},
                   "rng_state": ShardedObject("rng_state", {"seed": SEED}, (1,), (0,))}, root / "training")
            # Per-layer keys and GLU halves saved apart ("..._w", "..._v"), as non-homogeneous blocks do.
            save_torch_dist(model.sharded_state_dict(metadata={"singleton_local_shards": True}), root / "singleton")
            save_torch_dist({"optimizer": {"exp_avg": ShardedTensor.from_rank_offsets("optimizer.state.x", torch.ones(3))}},
                  root / "no_model")
            yield {"root": root, "weights": _weights(model)}
        finally:
            ps.destroy_model_parallel()


def test_tp1_save_reads_back_as_state_dict(tp1):
    folder = tp1["root"] / "plain"
    assert is_torch_dist(folder)
    assert {p.name for p in folder.iterdir()} >= {"metadata.json", ".metadata", "__0_0.distcp"}
    _assert_same(read_model_state(folder, num_layers=NUM_LAYERS), tp1["weights"])


def test_training_layout_prefix_and_non_model_entries(tp1, tmp_path):
    _assert_same(read_model_state(tp1["root"] / "training"), tp1["weights"])
    # A Megatron-LM save root: the tracker names the iteration folder (convert_hf_to_torch_dist: "release").
    shutil.copytree(tp1["root"] / "training", tmp_path / "release")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("release\n")
    assert is_torch_dist(tmp_path)
    _assert_same(read_model_state(tmp_path), tp1["weights"])


def test_per_layer_keys_and_separate_glu_halves(tp1):
    folder = tp1["root"] / "singleton"
    assert (folder / ".metadata").read_bytes().count(b"linear_fc1.weight_w") > 0
    _assert_same(read_model_state(folder, num_layers=NUM_LAYERS), tp1["weights"])


def test_tp2_save_equals_tp1_weights(tp1, tmp_path):
    folder = tmp_path / "tp2"
    folder.mkdir()
    local = run_local_group(save_tp2_rank, 2, str(folder))
    want = tp1["weights"]
    # Premise: the ranks' shards are cut from the same full weights (qkv by query group, fc1 as [gate_r; up_r]).
    qkv, fc1 = "decoder.layers.0.self_attention.linear_qkv.weight", "decoder.layers.0.mlp.linear_fc1.weight"
    emb = "embedding.word_embeddings.weight"
    assert torch.equal(torch.cat([local[0][qkv], local[1][qkv]]), want[qkv])
    gate, up = want[fc1].chunk(2)
    for rank in (0, 1):
        assert torch.equal(local[rank][fc1], torch.cat([gate.chunk(2)[rank], up.chunk(2)[rank]]))
    assert torch.equal(torch.cat([local[0][emb], local[1][emb]]), want[emb])
    assert {p.name for p in folder.glob("*.distcp")} == {"__0_0.distcp", "__1_0.distcp"}
    _assert_same(read_model_state(folder, num_layers=NUM_LAYERS), want)


def test_not_a_checkpoint(tmp_path):
    assert not is_torch_dist(tmp_path)
    with pytest.raises(TorchDistReadError, match=str(tmp_path)):
        read_model_state(tmp_path)
    (tmp_path / "metadata.json").write_text('{"sharded_backend": "zarr"}')
    assert not is_torch_dist(tmp_path)
    with pytest.raises(TorchDistReadError, match="zarr"):
        read_model_state(tmp_path)


def test_wrong_layer_count_and_no_model_weights(tp1):
    for name in ("plain", "singleton"):
        with pytest.raises(TorchDistReadError, match="expected 3 decoder layers"):
            read_model_state(tp1["root"] / name, num_layers=3)
    with pytest.raises(TorchDistReadError, match="no model weights"):
        read_model_state(tp1["root"] / "no_model")


def test_missing_and_truncated_distcp(tp1, tmp_path):
    folder = shutil.copytree(tp1["root"] / "plain", tmp_path / "ckpt")
    data = folder / "__0_0.distcp"
    with open(data, "r+b") as handle:
        handle.truncate(data.stat().st_size // 2)
    with pytest.raises(TorchDistReadError, match=r"__0_0\.distcp.*truncated"):
        read_model_state(folder)
    data.unlink()
    with pytest.raises(TorchDistReadError, match=r"__0_0\.distcp: missing"):
        read_model_state(folder)


class _RunsCommand:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_metadata_unpickler_refuses_other_classes(tp1, tmp_path):
    folder = shutil.copytree(tp1["root"] / "plain", tmp_path / "ckpt")
    marker = tmp_path / "pwned"
    (folder / ".metadata").write_bytes(pickle.dumps(_RunsCommand(f"touch {marker}")))
    with pytest.raises(UnsafeMetadataError, match=r"\.metadata: refusing to unpickle (os|posix)\.system"):
        read_model_state(folder)
    assert not marker.exists()
