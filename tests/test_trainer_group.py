"""The Ray trainer group: 2 actors form one gloo group and match a single in-process trainer."""

from __future__ import annotations

import pytest
import ray
import torch
import transformers
from fsdp_helpers import make_args, make_checkpoint, make_samples, scalar_metrics, single_thread

from slime.backends.fsdp_utils.actor import FSDPActor
from slime.backends.fsdp_utils.launch import ensure_single_process_group


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield tmp_path_factory.mktemp("trainer_group")
    if started:
        ray.shutdown()


def test_two_ray_actors_train_save_load_export(cluster):
    from slime.ray.actor_group import TrainerGroup

    student, teacher = make_checkpoint(cluster / "student", seed=0), make_checkpoint(cluster / "teacher", seed=1)
    flags = ["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", teacher, "--global-batch-size", "4"]
    group = TrainerGroup(make_args(student, "--actor-num-gpus-per-node", "2", *flags))
    try:
        metrics = group.train(0, make_samples(with_teacher=True), kl_coef=0.0)
        group.save(str(cluster / "ckpt"))
        group.export_hf(str(cluster / "sync"))
        second = scalar_metrics(group.train(1, make_samples(seed=1, with_teacher=True)))
        group.load(str(cluster / "ckpt"))
        again = scalar_metrics(group.train(1, make_samples(seed=1, with_teacher=True)))
    finally:
        group.shutdown()
    assert len(metrics["per_sample_opd_kl"]) == 8 and metrics["train/num_steps"] == 2.0
    for key in second:
        assert again[key] == pytest.approx(second[key], rel=1e-5, abs=1e-8), key

    with single_thread():
        ensure_single_process_group()
        local = FSDPActor(make_args(student, *flags), 0, 1)
        reference = local.train(0, make_samples(with_teacher=True), kl_coef=0.0)
    for key in ("loss", "pg_loss", "grad_norm", "opd/reverse_kl", "entropy"):
        assert metrics[key] == pytest.approx(reference[key], rel=1e-4, abs=1e-6), key
    exported = transformers.AutoModelForCausalLM.from_pretrained(cluster / "sync").state_dict()
    saved = transformers.AutoModelForCausalLM.from_pretrained(cluster / "ckpt" / "hf").state_dict()
    assert all(torch.equal(exported[k], saved[k]) for k in saved)
