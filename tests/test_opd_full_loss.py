"""The exact-KL diagnostic and ``--opd-loss full`` in the FSDP trainer, with both teacher modes."""

from __future__ import annotations

import pytest
import torch
import transformers
from fsdp_helpers import make_args, make_samples, single_thread, student_and_teacher, weights

from slime.backends.fsdp_utils import opd_kl
from slime.backends.fsdp_utils.actor import FSDPActor

transformers.utils.logging.disable_progress_bar()
TEMPERATURE = 0.8  # make_args' --rollout-temperature


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    with single_thread():
        yield student_and_teacher(tmp_path_factory, "opd_full")


def _rows(path, sample):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([sample.tokens])).logits[0].float() / TEMPERATURE
    return torch.log_softmax(logits, -1)[sample.prompt_length - 1:len(sample.tokens) - 1]


def _token_mean(per_sample, samples):
    num = sum(float((kl * torch.tensor(s.loss_mask, dtype=torch.float32)).sum()) for kl, s in zip(per_sample, samples))
    return num / sum(sum(s.loss_mask) for s in samples)


def _pure(samples):
    for s in samples:
        s.reward = 0.0  # pure distillation: make_samples' random task rewards would add a GRPO term
    return samples


def _in_trainer(ckpts, *extra):
    return FSDPActor(make_args(ckpts["student"], "--use-opd", "--opd-type", "megatron", "--opd-teacher-load",
                               ckpts["teacher"], *extra), 0, 1)


def test_exact_kl_metric_is_the_whole_vocabulary_reverse_kl(ckpts):
    samples = make_samples()
    metrics = _in_trainer(ckpts).train(0, samples, kl_coef=0.0)
    expected = [opd_kl.full_reverse_kl(_rows(ckpts["student"], s), _rows(ckpts["teacher"], s)) for s in samples]
    assert metrics["opd/exact_kl"] == pytest.approx(_token_mean(expected, samples), rel=1e-4)
    for got, want in zip(metrics["per_sample_opd_exact_kl"], expected):
        torch.testing.assert_close(torch.tensor(got), want, atol=1e-5, rtol=1e-4)
    # The sampled estimate of the same quantity sits next to it, and differs (one draw per position).
    assert metrics["opd/reverse_kl"] != pytest.approx(metrics["opd/exact_kl"], rel=1e-3)


def _with_teacher_topk(ckpts, samples, k):
    for s in samples:
        t = _rows(ckpts["teacher"], s)
        lp, ids = t.topk(k, dim=-1)
        s.teacher_log_probs = t.gather(-1, torch.tensor(s.tokens[s.prompt_length:]).unsqueeze(-1)).squeeze(-1).tolist()
        s.metadata["teacher_topk"] = {"ids": ids.tolist(), "logprobs": lp.tolist()}
    return samples


def test_server_teacher_topk_kl_matches_the_exact_kl_when_k_is_the_vocabulary(ckpts):
    exact = _in_trainer(ckpts).train(0, make_samples(), kl_coef=0.0)["opd/exact_kl"]
    vocab = _rows(ckpts["teacher"], make_samples()[0]).shape[-1]
    server = FSDPActor(make_args(ckpts["student"], "--use-opd", "--opd-type", "sglang", "--opd-teacher-top-k",
                                 str(vocab)), 0, 1)
    full_k = server.train(0, _with_teacher_topk(ckpts, make_samples(), vocab), kl_coef=0.0)
    assert full_k["opd/topk_kl"] == pytest.approx(exact, rel=1e-4)
    server5 = FSDPActor(make_args(ckpts["student"], "--use-opd", "--opd-type", "sglang", "--opd-teacher-top-k",
                                  "5"), 0, 1)
    five = server5.train(0, _with_teacher_topk(ckpts, make_samples(), 5), kl_coef=0.0)
    assert 0 < five["opd/topk_kl"] <= exact + 1e-6
    with pytest.raises(ValueError, match="top-k"):
        server5.train(1, make_samples(with_teacher=True), kl_coef=0.0)  # the replies carried no top-k


def test_full_loss_gradient_is_the_exact_kl_gradient(ckpts):
    """One optimizer step of --opd-loss full moves the weights along -grad of the mean exact KL."""
    samples = _pure(make_samples())
    actor = _in_trainer(ckpts, "--opd-loss", "full", "--lr", "1e-3", "--clip-grad", "0")
    before = weights(actor)
    metrics = actor.train(0, samples, kl_coef=0.0)
    assert metrics["opd/full_kl_loss"] == pytest.approx(
        sum(float((kl * torch.tensor(s.loss_mask)).sum() / sum(s.loss_mask))
            for kl, s in zip(map(torch.tensor, metrics["per_sample_opd_exact_kl"]), samples)) / len(samples), rel=1e-4)
    # Adam's first step is lr * sign(grad) (up to eps): compare signs with the directly computed gradient.
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpts["student"], dtype=torch.float32)
    loss = 0.0
    for s in samples:
        input_ids = torch.tensor([s.tokens])
        rows = torch.log_softmax(model(input_ids=input_ids).logits[0].float() / TEMPERATURE, -1)
        kl = opd_kl.full_reverse_kl(rows[s.prompt_length - 1:len(s.tokens) - 1], _rows(ckpts["teacher"], s))
        mask = torch.tensor(s.loss_mask, dtype=torch.float32)
        loss = loss + (kl * mask).sum() / mask.sum()
    (loss / len(samples)).backward()
    grads = dict(model.named_parameters())
    after = weights(actor)
    agree = total = 0
    for name, old in before.items():
        if name not in grads:
            continue  # tied weights appear once
        step = (after[name] - old).flatten()
        grad = grads[name].grad.flatten()
        big = grad.abs() > 1e-6
        agree += int((torch.sign(step[big]) == -torch.sign(grad[big])).sum())
        total += int(big.sum())
    assert total > 100 and agree / total > 0.99


def test_full_loss_lowers_the_exact_kl_on_fixed_states(ckpts):
    actor = _in_trainer(ckpts, "--opd-loss", "full", "--lr", "3e-3")
    history = [actor.train(r, _pure(make_samples()), kl_coef=0.0)["opd/exact_kl"] for r in range(4)]
    assert history[-1] < 0.8 * history[0], history


def test_opd_loss_flags_are_validated(ckpts):
    from slime.utils.arguments import ArgumentError

    with pytest.raises(ArgumentError, match="need --use-opd"):
        make_args(ckpts["student"], "--opd-loss", "full")
    with pytest.raises(ArgumentError, match="server teacher"):
        make_args(ckpts["student"], "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", ckpts["teacher"],
                  "--opd-teacher-top-k", "5")
    with pytest.raises(ArgumentError, match="top-k log-probs"):
        make_args(ckpts["student"], "--use-opd", "--opd-type", "sglang", "--opd-loss", "full",
                  "--opd-teacher-top-k", "0")
    assert make_args(ckpts["student"], "--use-opd", "--opd-type", "sglang", "--opd-loss", "full").opd_teacher_top_k == 20
    assert make_args(ckpts["student"], "--use-opd", "--opd-type", "sglang").opd_teacher_top_k == 0


def test_multi_step_sampled_opd_warns_and_one_step_or_full_does_not(ckpts):
    teacher = ("--use-opd", "--opd-type", "megatron", "--opd-teacher-load", ckpts["teacher"])
    with pytest.warns(UserWarning, match="4 optimizer steps per rollout"):
        make_args(ckpts["student"], *teacher, "--global-batch-size", "2")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_args(ckpts["student"], *teacher)  # one step per rollout (the default global batch)
        make_args(ckpts["student"], *teacher, "--global-batch-size", "2", "--opd-loss", "full")
