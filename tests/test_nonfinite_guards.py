"""Non-finite guards of the FSDP trainer: a NaN or inf stops the step, names its source, changes no weight."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from fsdp_helpers import make_args, make_samples, single_thread, student_and_teacher, weights

from slime.backends.fsdp_utils.actor import FSDPActor
from slime.backends.fsdp_utils.guards import NonFiniteError

transformers.utils.logging.disable_progress_bar()
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    with single_thread():
        yield student_and_teacher(tmp_path_factory, "guards")


@pytest.fixture(scope="module")
def server_actor(ckpts):
    return FSDPActor(make_args(ckpts["student"], "--use-opd", "--opd-type", "sglang"), 0, 1)


def stops_untouched(actor, samples, rollout_id=3) -> str:
    """Train must raise NonFiniteError and leave weights and the optimizer as they were."""
    before, steps = weights(actor), actor.optimizer_steps
    with pytest.raises(NonFiniteError) as err:
        actor.train(rollout_id, samples, kl_coef=0.0)
    after = weights(actor)
    assert all(torch.equal(before[k], after[k]) for k in before), "weights changed"
    assert actor.optimizer_steps == steps and not actor.optimizer.state
    assert f"rollout {rollout_id}" in str(err.value)
    return str(err.value)


def test_nan_teacher_reply_is_named_with_its_sample(server_actor):
    samples = make_samples(with_teacher=True)
    samples[5].teacher_log_probs[2] = NAN
    message = stops_untouched(server_actor, samples)
    assert "teacher reply" in message and "sample 5" in message and "token 2" in message


def test_nan_environment_reward_is_named(server_actor):
    samples = make_samples(with_teacher=True)
    samples[3].metadata["task_reward"] = NAN
    samples[3].reward = NAN
    message = stops_untouched(server_actor, samples)
    assert "task reward" in message and "sample 3" in message


def test_infinite_reward_model_reward_is_named(server_actor):
    samples = make_samples(with_teacher=True)
    samples[6].reward = INF
    message = stops_untouched(server_actor, samples)
    assert "reward model" in message and "sample 6" in message


def test_overflowing_advantage_is_caught(server_actor):
    samples = make_samples(with_teacher=True)
    samples[0].reward = samples[1].reward = 1e308  # finite, but the group mean overflows to inf
    message = stops_untouched(server_actor, samples)
    assert "advantage" in message and "sample 0" in message


def test_nan_in_trainer_teacher_is_named(ckpts):
    actor = FSDPActor(make_args(ckpts["student"], "--use-opd", "--opd-type", "megatron", "--opd-teacher-load",
                                ckpts["teacher"]), 0, 1)
    with torch.no_grad():
        head = actor.teacher.lm_head.weight
        (head.to_local() if hasattr(head, "to_local") else head).fill_(NAN)
    message = stops_untouched(actor, make_samples())
    assert "in-trainer teacher" in message and "sample 0" in message


def test_non_finite_loss_stops_before_the_optimizer_and_leaves_no_gradient(server_actor):
    server_actor.args.entropy_coef = INF  # past validation: a loss term that goes non-finite
    try:
        message = stops_untouched(server_actor, make_samples(with_teacher=True))
    finally:
        server_actor.args.entropy_coef = 0.0
    assert "optimizer step 0" in message and "loss" in message
    assert all(p.grad is None for p in server_actor.model.parameters())
    metrics = server_actor.train(4, make_samples(with_teacher=True), kl_coef=0.0)  # the next step is clean
    assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])


def test_non_finite_gradient_norm_stops_before_the_optimizer(ckpts, monkeypatch):
    actor = FSDPActor(make_args(ckpts["student"], "--use-opd", "--opd-type", "sglang"), 0, 1)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, max_norm: torch.tensor(NAN))
    message = stops_untouched(actor, make_samples(with_teacher=True))
    assert "gradient norm" in message and "grad_norm" in message
