"""The FSDP2 trainer: log-probs, OPD term, every estimator, SFT, and 1 vs 2 processes."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from fsdp_helpers import (assert_same_run, student_and_teacher, make_args, make_checkpoint, make_samples, run_config, single_thread, weights,
                          worker_run_configs)

from slime.backends.fsdp_utils.actor import FSDPActor
from slime.backends.fsdp_utils.launch import ensure_single_process_group, run_local_group

transformers.utils.logging.disable_progress_bar()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    with single_thread():
        yield student_and_teacher(tmp_path_factory, "fsdp_trainer")


def _plain_log_probs(path, sample, temperature):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([sample.tokens])).logits[0].float() / temperature
    logp = torch.log_softmax(logits, -1)
    start = sample.prompt_length
    return torch.stack([logp[i - 1, sample.tokens[i]] for i in range(start, len(sample.tokens))])


def test_log_probs_match_plain_transformers_forward(ckpts):
    args = make_args(ckpts["student"], "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", ckpts["teacher"],
                     "--micro-batch-size", "3")
    actor = FSDPActor(args, 0, 1)
    samples = make_samples(n=5)  # unequal lengths: right padding inside each micro-batch
    for which, path in (("policy", ckpts["student"]), ("teacher", ckpts["teacher"])):
        ours = actor.log_probs(samples, which)
        for sample, got in zip(samples, ours):
            assert got.shape == (sample.response_length,)
            torch.testing.assert_close(got, _plain_log_probs(path, sample, 0.8), atol=1e-5, rtol=1e-5)
    # Temperature matters: the same tokens at T=1 score differently.
    assert not torch.allclose(ours[0], _plain_log_probs(ckpts["teacher"], samples[0], 1.0), atol=1e-3)


def test_teacher_equal_to_student_gives_zero_reverse_kl(ckpts):
    same = FSDPActor(make_args(ckpts["student"], "--use-opd", "--opd-type", "megatron",
                               "--opd-teacher-load", ckpts["student"]), 0, 1)
    metrics = same.train(0, make_samples(), kl_coef=0.0)
    assert abs(metrics["opd/reverse_kl"]) < 1e-6
    assert max(abs(v) for kl in metrics["per_sample_opd_kl"] for v in kl) < 1e-5
    other = FSDPActor(make_args(ckpts["student"], "--use-opd", "--opd-type", "megatron",
                                "--opd-teacher-load", ckpts["teacher"]), 0, 1)
    metrics = other.train(0, make_samples(), kl_coef=0.0)
    assert abs(metrics["opd/reverse_kl"]) > 1e-3
    assert [len(kl) for kl in metrics["per_sample_opd_kl"]] == [s.response_length for s in make_samples()]


def test_server_teacher_and_rollout_log_probs_feed_the_opd_term(ckpts):
    args = make_args(ckpts["student"], "--use-opd", "--opd-type", "sglang", "--use-rollout-logprobs")
    actor = FSDPActor(args, 0, 1)
    samples = make_samples(with_teacher=True, with_rollout_lp=True)
    metrics = actor.train(0, samples, kl_coef=0.0)
    diffs = [(s.rollout_log_probs[t] - s.teacher_log_probs[t]) for s in samples
             for t in range(s.response_length) if s.loss_mask[t]]
    assert metrics["opd/reverse_kl"] == pytest.approx(sum(diffs) / len(diffs), rel=1e-5)
    missing = make_samples(with_rollout_lp=True)
    with pytest.raises(ValueError, match="teacher_log_probs"):
        actor.train(1, missing, kl_coef=0.0)


@pytest.mark.parametrize("estimator", ["grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"])
def test_every_estimator_runs_a_step(ckpts, estimator):
    extra = ["--advantage-estimator", estimator, "--use-opd", "--opd-type", "megatron",
             "--opd-teacher-load", ckpts["teacher"], "--normalize-advantages", "--entropy-coef", "0.01"]
    if estimator in ("ppo", "reinforce_plus_plus"):
        extra += ["--kl-coef", "0.05"]
    else:
        extra += ["--use-kl-loss", "--kl-loss-coef", "0.1", "--kl-loss-type", "low_var_kl"]
    args = make_args(ckpts["student"], *extra)
    actor = FSDPActor(args, 0, 1)
    before = weights(actor)
    metrics = actor.train(0, make_samples(with_teacher=True), kl_coef=args.kl_coef)
    after = weights(actor)
    for key in ("loss", "pg_loss", "pg_clipfrac", "entropy", "grad_norm", "ppo_kl", "opd/reverse_kl"):
        assert math.isfinite(metrics[key]), key
    assert metrics["grad_norm"] > 0
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # The reference starts equal to the policy, so the observed KL of the first rollout is zero.
    assert metrics["kl/observed_token_mean"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["kl/observed_seq_sum"] == pytest.approx(0.0, abs=1e-5)
    if estimator == "ppo":
        assert metrics["critic/value_loss"] > 0 and metrics["critic/grad_norm"] > 0
    assert ("kl_loss" in metrics) == ("--use-kl-loss" in extra)


def test_bad_teacher_folder_fails_clearly(ckpts, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    args = make_args(ckpts["student"], "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", str(empty))
    with pytest.raises(FileNotFoundError, match=r"--opd-teacher-load .*config\.json.*safetensors"):
        FSDPActor(args, 0, 1)
    only_config = tmp_path / "only_config"
    only_config.mkdir()
    (only_config / "config.json").write_text("{}")
    args.opd_teacher_load = str(only_config)
    with pytest.raises(FileNotFoundError, match=r"missing \*\.safetensors weights"):
        FSDPActor(args, 0, 1)


def test_sft_loss_decreases(ckpts):
    actor = FSDPActor(make_args(ckpts["student"], "--loss-type", "sft_loss", "--lr", "3e-3"), 0, 1)
    data = make_samples(seed=3)
    losses = [actor.train(r, data, kl_coef=0.0)["loss"] for r in range(6)]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < losses[0] - 0.2


# ---------------------------------------------------------------------------- 1 vs 2 processes
def _configs(ckpts):
    opd = {"ckpt": ckpts["student"], "n_samples": 6, "n_rollouts": 2,
           # 6 samples in 2 steps of 3 over 2 ranks with micro-batch 1: ranks get 2 and 1 samples per step,
           # so the second rank runs padding micro-batches.
           "argv": ["--num-steps-per-rollout", "2", "--micro-batch-size", "1", "--use-opd", "--opd-type",
                    "megatron", "--opd-teacher-load", ckpts["teacher"], "--use-kl-loss", "--kl-loss-coef", "0.1",
                    "--normalize-advantages"]}
    sft = {"ckpt": ckpts["student"], "n_samples": 6, "n_rollouts": 2, "save_after": 0,
           "argv": ["--loss-type", "sft_loss", "--num-steps-per-rollout", "2", "--micro-batch-size", "2"]}
    return opd, sft


def _memory_config(opd):
    """The OPD run with the trainer-memory features: whole-row head vs chunks of 3 positions, layers
    recomputed in backward, micro-batches packed by a 40-token budget instead of 1 sample each."""
    return dict(opd, argv=opd["argv"] + ["--log-probs-chunk-size", "3", "--recompute-granularity", "full",
                                         "--use-dynamic-batch-size", "--max-tokens-per-gpu", "40"])


@pytest.fixture(scope="module")
def one_and_two(ckpts):
    opd, sft = _configs(ckpts)
    plain = dict(opd, argv=opd["argv"] + ["--log-probs-chunk-size", "-1"])
    one = [run_config(0, 1, plain), run_config(0, 1, dict(sft, save_to=str(ckpts["root"] / "sft_w1")))]
    two = run_local_group(worker_run_configs, 2, [opd, dict(sft, save_to=str(ckpts["root"] / "sft_w2")),
                                                  _memory_config(opd)])[0]
    return one, two


def test_one_and_two_processes_agree_with_opd(one_and_two):
    one, two = one_and_two
    assert one[0]["metrics"][0]["train/num_steps"] == 2
    assert_same_run(one[0], two[0])
    for kl_one, kl_two in zip(one[0]["opd"][0], two[0]["opd"][0]):
        assert kl_one == pytest.approx(kl_two, abs=1e-5)


def test_two_processes_with_chunks_recompute_and_token_budgets_agree_with_one_plain(one_and_two):
    one, two = one_and_two
    assert_same_run(one[0], two[2])


def test_one_and_two_processes_agree_with_sft(one_and_two):
    one, two = one_and_two
    assert_same_run(one[1], two[1])


def test_checkpoint_from_two_processes_resumes_in_one(ckpts, one_and_two):
    _, two = one_and_two
    _, sft = _configs(ckpts)
    actor = FSDPActor(make_args(ckpts["student"], *sft["argv"]), 0, 1)
    actor.load(str(ckpts["root"] / "sft_w2"))
    metrics = actor.train(1, make_samples(seed=1, n=6), kl_coef=0.0)
    assert metrics["loss"] == pytest.approx(two[1]["metrics"][1]["loss"], rel=1e-4)
    final = weights(actor)
    for key in final:
        torch.testing.assert_close(final[key], two[1]["weights"][key], atol=5e-5, rtol=1e-4)
