"""The Megatron-core trainer (``--train-backend megatron``) on CPU: parity with transformers and with the
FSDP backend, tensor and data parallelism over gloo, checkpoints that resume exactly, the HF export.

Multi-process cases run as spawned gloo groups of 2 (``launch.run_local_group``); in-process cases use a
one-process group with tensor-parallel size 1.
"""

from __future__ import annotations

import inspect
import json

import pytest
import torch

pytest.importorskip("megatron.core")

from fsdp_helpers import make_args, make_checkpoint, make_samples, weights  # noqa: E402
from megatron_helpers import full_hf_weights, log_probs_worker, megatron_args, train_worker  # noqa: E402

from slime.backends.fsdp_utils.launch import ensure_single_process_group, run_local_group  # noqa: E402

OPD_SERVER = ["--use-opd", "--opd-type", "sglang", "--advantage-estimator", "grpo"]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron")
    return {"student": make_checkpoint(root / "student", seed=0), "teacher": make_checkpoint(root / "teacher", seed=1),
            "root": root}


def _transformers_log_probs(ckpt, samples, temperature=0.8):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="sdpa").eval()
    out = []
    with torch.no_grad():
        for s in samples:
            tokens = torch.tensor(s.tokens)
            logits = model(tokens[None]).logits[0].float() / temperature
            rows = torch.log_softmax(logits, -1)[s.prompt_length - 1:-1]
            out.append(rows.gather(-1, tokens[s.prompt_length:, None])[:, 0])
    return out


# ---------------------------------------------------------------------------- CPU patches
def test_cpu_patches_target_the_symbols_megatron_ships():
    from slime.backends.megatron_utils import cpu_patches

    cpu_patches.check_symbols()  # the installed megatron-core still has every patched symbol, same parameters
    assert cpu_patches.apply() is not torch.cuda.is_available()


def test_cpu_patch_check_fails_when_a_symbol_changes(monkeypatch):
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from slime.backends.megatron_utils import cpu_patches

    def moved(self, seq_len, offset=0, extra=None):  # a re-signed release
        raise AssertionError

    monkeypatch.setattr(RotaryEmbedding, "get_emb", moved)
    with pytest.raises(RuntimeError, match="get_emb"):
        cpu_patches.check_symbols()
    monkeypatch.delattr(RotaryEmbedding, "get_emb")
    with pytest.raises(RuntimeError, match="is gone"):
        cpu_patches.check_symbols()


def test_forward_uses_megatron_pieces_that_exist():
    """``forward.final_hidden`` calls GPTModel._preprocess and TransformerBlock.forward by keyword."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_block import TransformerBlock

    assert {"input_ids", "position_ids"} <= set(inspect.signature(GPTModel._preprocess).parameters)
    assert {"hidden_states", "attention_mask", "rotary_pos_emb", "rotary_pos_cos", "rotary_pos_sin",
            "sequence_len_offset"} <= set(inspect.signature(TransformerBlock.forward).parameters)


# ---------------------------------------------------------------------------- weights and log-probs
def test_hf_megatron_round_trip_is_exact_for_qwen2_qwen3_llama(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from slime.backends.megatron_utils import hf_weights
    from slime.backends.megatron_utils.model import GPTShape

    common = dict(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2)
    for config_cls, model_cls in ((Qwen2Config, Qwen2ForCausalLM), (Qwen3Config, Qwen3ForCausalLM),
                                  (LlamaConfig, LlamaForCausalLM)):
        model = model_cls(config_cls(**common, head_dim=8) if config_cls is Qwen3Config else config_cls(**common))
        hf = {k: v for k, v in model.state_dict().items()}
        shape = GPTShape.from_config(model.config.to_dict(), tp_size=2)
        full = hf_weights.hf_to_megatron(hf, shape)
        assert shape.padded_vocab_size == 102
        parts = [hf_weights.shard(full, shape, r, 2) for r in range(2)]
        rebuilt = {k: hf_weights.unshard([p[k] for p in parts], k, shape) for k in full}
        back = hf_weights.megatron_to_hf(rebuilt, shape)
        assert set(back) == set(hf), config_cls.__name__
        for key in hf:
            assert torch.equal(back[key], hf[key]), (config_cls.__name__, key)


@pytest.mark.parametrize("tp", [1, 2])
def test_log_probs_match_transformers(ckpts, tp):
    samples = make_samples(seed=3)
    expected = _transformers_log_probs(ckpts["student"], samples)
    per_rank = run_local_group(log_probs_worker, 2, ckpts["student"], tp, samples)
    assert per_rank[0] == per_rank[1]  # both ranks (TP peers or DP replicas) see the same numbers
    worst = max(float((torch.tensor(got) - want).abs().max()) for got, want in zip(per_rank[0], expected))
    assert worst <= 1e-5


# ---------------------------------------------------------------------------- one step against FSDP
@pytest.mark.parametrize("mode", ["opd_trainer_teacher", "opd_server_teacher", "opd_full_loss", "sft"])
def test_one_step_matches_the_fsdp_backend(ckpts, mode):
    from slime.backends.fsdp_utils.actor import FSDPActor
    from slime.backends.megatron_utils.actor import MegatronActor

    ensure_single_process_group()
    extra = {"opd_trainer_teacher": ["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", ckpts["teacher"],
                                     "--advantage-estimator", "grpo"],
             "opd_server_teacher": OPD_SERVER,
             "opd_full_loss": ["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", ckpts["teacher"],
                               "--opd-loss", "full"],
             "sft": ["--loss-type", "sft_loss"]}[mode]
    fsdp = FSDPActor(make_args(ckpts["student"], *extra), 0, 1)
    fsdp_metrics = fsdp.train(0, make_samples(0, with_teacher=True), 0.0)
    megatron = MegatronActor(megatron_args(ckpts["student"], *extra), 0, 1)
    megatron_metrics = megatron.train(0, make_samples(0, with_teacher=True), 0.0)
    # Tolerances: float32 with different attention kernels (SDPA vs Megatron's); after one AdamW step at
    # lr 1e-3 the weights were measured to agree within 2.3e-6.
    for key, value in fsdp_metrics.items():
        if isinstance(value, float) and not key.startswith("time/"):
            assert megatron_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    want, got = weights(fsdp), full_hf_weights(megatron)
    assert set(want) == set(got)
    assert max(float((want[k] - got[k]).abs().max()) for k in want) <= 1e-5
    moved = max(float((want[k] - fsdp_start).abs().max()) for k, fsdp_start in _initial(ckpts["student"]).items())
    assert moved > 1e-4  # the step did change the weights, so the comparison measures something


def _initial(ckpt):
    from slime.backends.fsdp_utils.checkpoint import _read_weights

    return _read_weights(ckpt)


def test_ppo_critic_is_refused_with_a_clear_error(ckpts):
    from slime.utils.arguments import ArgumentError

    with pytest.raises(ArgumentError, match="critic"):
        megatron_args(ckpts["student"], "--advantage-estimator", "ppo")


# ---------------------------------------------------------------------------- parallelism and checkpoints
def test_tensor_and_data_parallel_training_match_one_process_and_resume_exactly(ckpts):
    root = ckpts["root"]
    extra = OPD_SERVER
    single = train_worker(0, 1, ckpts["student"], 1, extra, 2) if _single_group() else None
    tp2 = run_local_group(train_worker, 2, ckpts["student"], 2, extra, 2, str(root / "tp2_ckpt"))[0]
    dp2 = run_local_group(train_worker, 2, ckpts["student"], 1, extra, 2)[0]
    for other in (tp2, dp2):
        for a, b in zip(single[0], other[0]):
            for key in ("loss", "pg_loss", "opd/reverse_kl", "grad_norm"):
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
        assert max(float((single[1][k] - other[1][k]).abs().max()) for k in single[1]) <= 1e-5
    # Resume the TP-2 checkpoint saved after rollout 0: with TP 2 (exactly) and with TP 1 (resharded).
    resumed = run_local_group(train_worker, 2, ckpts["student"], 2, extra, 2, None, str(root / "tp2_ckpt"), 1)[0]
    assert resumed[0] == [tp2[0][1]]
    assert all(torch.equal(resumed[1][k], tp2[1][k]) for k in tp2[1])
    resharded = train_worker(0, 1, ckpts["student"], 1, extra, 2, None, str(root / "tp2_ckpt"), 1)
    assert max(float((resharded[1][k] - tp2[1][k]).abs().max()) for k in tp2[1]) <= 1e-5
    meta = json.loads((root / "tp2_ckpt" / "trainer_meta.json").read_text())
    assert meta["backend"] == "megatron" and meta["tensor_model_parallel_size"] == 2


def _single_group() -> bool:
    ensure_single_process_group()
    return True


def test_export_loads_in_transformers(ckpts, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slime.backends.megatron_utils.actor import MegatronActor

    ensure_single_process_group()
    actor = MegatronActor(megatron_args(ckpts["student"], *OPD_SERVER), 0, 1)
    actor.train(0, make_samples(0, with_teacher=True), 0.0)
    actor.export_hf(str(tmp_path / "export"))
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32, use_safetensors=True)
    assert AutoTokenizer.from_pretrained(tmp_path / "export").get_vocab() == actor.tokenizer.get_vocab()
    samples = make_samples(seed=5)
    want = _transformers_log_probs(str(tmp_path / "export"), samples)
    got = actor.log_probs(samples)
    assert max(float((g - w).abs().max()) for g, w in zip(got, want)) <= 1e-5
    assert not torch.equal(exported.lm_head.weight, AutoModelForCausalLM.from_pretrained(ckpts["student"]).lm_head.weight)


def test_upstream_torch_dist_teacher_loads_as_is(ckpts, tmp_path, monkeypatch):
    """``--opd-teacher-load`` naming a Megatron-LM save root in torch_dist format (what upstream slime users
    convert their teacher to) scores exactly like the HF teacher it came from; ``--opd-teacher-ckpt-step``
    picks an iteration other than the latest."""
    from megatron_helpers import save_torch_dist, torch_dist_save_patches

    from slime.backends.megatron_utils import hf_weights, weight_sources
    from slime.backends.megatron_utils.actor import MegatronActor
    from slime.backends.megatron_utils.model import build_gpt, init_parallel

    ensure_single_process_group()
    init_parallel(1, seed=0)
    hf_teacher = weight_sources.resolve(ckpts["teacher"], "--opd-teacher-load", {})
    model = build_gpt(hf_teacher.config, megatron_args(ckpts["student"]), 1)
    shape = model.slime_shape
    hf_weights.load_local(model, hf_weights.shard(hf_teacher.full_state(shape), shape, 0, 1))
    root = tmp_path / "teacher_torch_dist"
    with monkeypatch.context() as patch:
        for owner, name, value in torch_dist_save_patches():
            patch.setattr(owner, name, value)
        save_torch_dist(model.sharded_state_dict(), root / "iter_0000007")
    (root / "latest_checkpointed_iteration.txt").write_text("9")  # a later iteration that is not there
    samples = make_samples(seed=2)
    want = _transformers_log_probs(ckpts["teacher"], samples)
    with pytest.raises(FileNotFoundError):
        MegatronActor(megatron_args(ckpts["student"], "--use-opd", "--opd-type", "megatron",
                                    "--opd-teacher-load", str(root)), 0, 1)
    actor = MegatronActor(megatron_args(ckpts["student"], "--use-opd", "--opd-type", "megatron",
                                        "--opd-teacher-load", str(root), "--opd-teacher-ckpt-step", "7"), 0, 1)
    got = actor.log_probs(samples, "teacher")
    assert max(float((g - w).abs().max()) for g, w in zip(got, want)) <= 1e-5


@pytest.mark.parametrize("family", ["llama3_rope_scaling", "qwen2_qkv_bias", "qwen3_tied"])
def test_other_families_match_transformers(family, tmp_path):
    """Llama (GQA, llama3 rope scaling), Qwen2 (q/k/v biases) and a tied-embedding Qwen3 (as Qwen3-0.6B)
    score like transformers after the HF -> Megatron conversion."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from slime.backends.megatron_utils import forward, hf_weights, weight_sources
    from slime.backends.megatron_utils.model import build_gpt, init_parallel

    common = dict(vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64)
    if family == "llama3_rope_scaling":
        model = LlamaForCausalLM(LlamaConfig(**common, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}, rope_theta=500000.0))
    elif family == "qwen2_qkv_bias":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
        with torch.no_grad():  # transformers initialises biases at 0: make them matter
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**common, head_dim=8, tie_word_embeddings=True))
    model = model.float().eval()
    model.save_pretrained(tmp_path, safe_serialization=True)
    ensure_single_process_group()
    init_parallel(1, seed=0)
    source = weight_sources.resolve(str(tmp_path), "--hf-checkpoint", {})
    megatron = build_gpt(source.config, megatron_args(str(tmp_path)), 1)
    shape = megatron.slime_shape
    hf_weights.load_local(megatron, hf_weights.shard(source.full_state(shape), shape, 0, 1))
    megatron.eval()
    samples = make_samples(seed=4)
    with torch.no_grad():
        got = forward.score(megatron, samples, temperature=0.8, device=torch.device("cpu"), chunk_size=8).log_probs
    want = _transformers_log_probs(str(tmp_path), samples)
    assert max(float((g - w).abs().max()) for g, w in zip(got, want)) <= 1e-5
    back = hf_weights.megatron_to_hf(hf_weights.gather_full(megatron, shape, None), shape)
    assert ("lm_head.weight" in back) is not (family == "qwen3_tied")


def test_a_runs_own_save_root_is_a_teacher(ckpts, tmp_path):
    """``--opd-teacher-load`` may name this project's own ``--save`` root: the iteration named by
    ``latest_checkpointed_iteration.txt`` (or ``--opd-teacher-ckpt-step``) and its ``model/hf`` folder."""
    import shutil

    from slime.backends.megatron_utils import weight_sources

    root = tmp_path / "run"
    for step, source in ((2, ckpts["student"]), (4, ckpts["teacher"])):
        shutil.copytree(source, root / f"iter_{step:07d}" / "model" / "hf")
    (root / "latest_checkpointed_iteration.txt").write_text("4")
    latest = weight_sources.resolve(str(root), "--opd-teacher-load", {})
    assert latest.hf_folder == str(root / "iter_0000004" / "model" / "hf")
    older = weight_sources.resolve(str(root), "--opd-teacher-load", {}, ckpt_step=2)
    assert older.hf_folder == str(root / "iter_0000002" / "model" / "hf")
    (root / "iter_0000006").mkdir()
    with pytest.raises(FileNotFoundError, match="neither model/hf"):
        weight_sources.resolve(str(root), "--opd-teacher-load", {}, ckpt_step=6)


def test_full_recompute_changes_memory_not_numbers(ckpts):
    """--recompute-granularity full (upstream's spelling) recomputes every decoder layer in backward; the
    step's metrics and weights equal those without it."""
    from slime.backends.megatron_utils.actor import MegatronActor

    ensure_single_process_group()
    results = []
    for extra in ([], ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]):
        actor = MegatronActor(megatron_args(ckpts["student"], *OPD_SERVER, *extra), 0, 1)
        assert all(getattr(layer, "slime_recompute", False) == bool(extra) for layer in actor.model.decoder.layers)
        metrics = actor.train(0, make_samples(0, with_teacher=True), 0.0)
        results.append((metrics["loss"], metrics["grad_norm"], full_hf_weights(actor)))
    (loss, norm, want), (loss_rc, norm_rc, got) = results
    assert loss_rc == pytest.approx(loss, rel=1e-6) and norm_rc == pytest.approx(norm, rel=1e-6)
    assert max(float((want[k] - got[k]).abs().max()) for k in want) <= 1e-6
