"""Trainer checkpoints: exact resume (model, optimizer, critic, RNG), HF loadability, no pickle."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from fsdp_helpers import student_and_teacher, make_args, make_checkpoint, make_samples, scalar_metrics, single_thread, weights
from safetensors.torch import load_file

from slime.backends.fsdp_utils.actor import FSDPActor
from slime.backends.fsdp_utils.launch import ensure_single_process_group

transformers.utils.logging.disable_progress_bar()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    with single_thread():
        yield student_and_teacher(tmp_path_factory, "fsdp_ckpt")


def _ppo_args(ckpts):
    # ppo brings the critic and its optimizer; OPD and a reward-side KL bring teacher and reference.
    return make_args(ckpts["student"], "--advantage-estimator", "ppo", "--kl-coef", "0.05", "--use-opd",
                     "--opd-type", "megatron", "--opd-teacher-load", ckpts["teacher"], "--global-batch-size", "4")


def test_save_load_then_next_step_equals_uninterrupted_run(ckpts, tmp_path):
    args = _ppo_args(ckpts)
    first = FSDPActor(args, 0, 1)
    first.train(0, make_samples(seed=0, with_teacher=True), kl_coef=0.05)
    first.save(str(tmp_path / "ckpt"))
    after_save = torch.rand(3)
    uninterrupted = scalar_metrics(first.train(1, make_samples(seed=1, with_teacher=True), kl_coef=0.05))
    uninterrupted_weights = weights(first)

    resumed = FSDPActor(args, 0, 1)
    resumed.load(str(tmp_path / "ckpt"))
    assert torch.equal(torch.rand(3), after_save)  # RNG restored
    assert resumed.optimizer_steps == 2
    metrics = scalar_metrics(resumed.train(1, make_samples(seed=1, with_teacher=True), kl_coef=0.05))
    assert metrics.keys() == uninterrupted.keys()
    for key in metrics:
        assert metrics[key] == pytest.approx(uninterrupted[key], rel=1e-6, abs=1e-9), key
    final = weights(resumed)
    for key in final:
        torch.testing.assert_close(final[key], uninterrupted_weights[key], atol=1e-7, rtol=0)

    # Without the optimizer state the same step lands elsewhere: the check above can fail.
    no_optim = FSDPActor(args, 0, 1)
    no_optim.load(str(tmp_path / "ckpt"))
    no_optim.optimizer = torch.optim.AdamW(no_optim.model.parameters(), lr=args.lr)
    no_optim.train(1, make_samples(seed=1, with_teacher=True), kl_coef=0.05)
    moved = weights(no_optim)
    assert any(not torch.allclose(moved[k], uninterrupted_weights[k], atol=1e-6) for k in moved)


def test_checkpoint_layout_loads_with_plain_transformers_and_has_no_pickle(ckpts, tmp_path):
    actor = FSDPActor(_ppo_args(ckpts), 0, 1)
    actor.train(0, make_samples(with_teacher=True), kl_coef=0.05)
    actor.save(str(tmp_path / "ckpt"))
    ours = weights(actor)

    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / "hf")
    for key, value in model.state_dict().items():
        assert torch.equal(value, ours[key]), key
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "ckpt" / "hf")
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    critic = transformers.AutoModel.from_pretrained(tmp_path / "ckpt" / "critic")
    assert critic.config.hidden_size == model.config.hidden_size

    files = [p for p in (tmp_path / "ckpt").rglob("*") if p.is_file()]
    assert not [p for p in files if p.suffix in (".bin", ".pt", ".pkl", ".pth")]
    optim = load_file(tmp_path / "ckpt" / "optimizer" / "state.safetensors")
    meta = json.loads((tmp_path / "ckpt" / "optimizer" / "meta.json").read_text())
    assert meta["param_groups"][0]["lr"] == pytest.approx(1e-3)
    assert optim["model.embed_tokens.weight/exp_avg"].shape == ours["model.embed_tokens.weight"].shape
    assert float(optim["model.embed_tokens.weight/step"]) == 2.0  # 8 samples in 2 steps of 4


def test_export_hf_replaces_the_folder_each_time(ckpts, tmp_path):
    actor = FSDPActor(make_args(ckpts["student"], "--loss-type", "sft_loss"), 0, 1)
    target = tmp_path / "sync"
    actor.export_hf(str(target))
    first = load_file(target / "model.safetensors")
    actor.train(0, make_samples(), kl_coef=0.0)
    actor.export_hf(str(target))
    second = transformers.AutoModelForCausalLM.from_pretrained(target).state_dict()
    assert any(not torch.equal(first[k], second[k]) for k in first)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sync"]  # no staging folders left behind


def test_loading_a_checkpoint_without_a_critic_into_ppo_fails_clearly(ckpts, tmp_path):
    FSDPActor(make_args(ckpts["student"], "--loss-type", "sft_loss"), 0, 1).save(str(tmp_path / "sft"))
    with pytest.raises(ValueError, match="without a critic"):
        FSDPActor(_ppo_args(ckpts), 0, 1).load(str(tmp_path / "sft"))
    with pytest.raises(FileNotFoundError, match="trainer_meta.json"):
        FSDPActor(make_args(ckpts["student"], "--loss-type", "sft_loss"), 0, 1).load(str(tmp_path))


def test_truncated_trainer_files_are_named(ckpts, tmp_path):
    import shutil

    from slime.checkpoint.files import CheckpointError

    args = make_args(ckpts["student"], "--loss-type", "sft_loss")
    FSDPActor(args, 0, 1).save(str(tmp_path / "good"))
    actor = FSDPActor(args, 0, 1)
    for name in ("trainer_meta.json", "optimizer/state.safetensors", "optimizer/meta.json", "hf/model.safetensors"):
        folder = tmp_path / name.replace("/", "_")
        shutil.copytree(tmp_path / "good", folder)
        target = folder / name
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
        with pytest.raises(CheckpointError, match=f"{target}: .*truncated or corrupt"):
            actor.load(str(folder))
