"""train_cpu's log-prob checks (tools/slime_pr/train_cpu_checks.py) on a tiny student and teacher made here: they
pass what a faithful trainer dumps (bf16-sized noise included) and fail a Megatron model that is not the checkpoint
(a padded vocabulary), a teacher that is not the teacher, and OPD advantages shaped with the wrong coefficient."""

import math

import pytest
import torch

from tools.slime_pr import train_cpu_checks as checks
from tools.slime_pr.train_cpu_engines import make_checkpoints

COEF = 1.0


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    student, teacher = make_checkpoints(tmp_path_factory.mktemp("models"))
    return (AutoModelForCausalLM.from_pretrained(student).eval(), AutoModelForCausalLM.from_pretrained(teacher).eval())


def _dumps(student, teacher, noise: float = 0.0, shift: float = 0.0, teacher_in_trainer=None):
    """A rollout dump and the trainer's dump of the same two samples, as slime writes them for pure OPD."""
    gen = torch.Generator().manual_seed(0)
    rollouts, train = [], []
    for n in (12, 20):
        tokens = torch.randint(3, 100, (n + 8,), generator=gen).tolist()
        mask = [1] * (n // 2) + [0] * 3 + [1] * (n - n // 2 - 3)  # an observation in the middle carries no loss
        s_lp = checks.teacher_response_logprobs(student, tokens, n) + shift
        s_lp = s_lp + noise * torch.randn(n, generator=gen)
        t_lp = checks.teacher_response_logprobs(teacher_in_trainer or teacher, tokens, n)
        rollouts.append({"tokens": tokens, "loss_mask": mask, "reward": 0.0})
        train.append({"tokens": tokens, "response_lengths": n, "loss_masks": mask, "rewards": 0.0,
                      "log_probs": s_lp, "teacher_log_probs": t_lp, "advantages": -COEF * (s_lp - t_lp)})
    return {0: rollouts}, {0: train}


def test_trainer_logprobs_pass_bf16_noise_and_fail_a_padded_vocabulary(models):
    student, teacher = models
    _, train = _dumps(student, teacher, noise=0.01)
    assert "on 2 samples" in checks.check_trainer_logprobs(train[0], student)
    # Megatron padding a vocab of 100 to 128 adds 28 zero logits to every softmax: log(128/100) off each token.
    _, padded = _dumps(student, teacher, shift=-math.log(128 / 100))
    with pytest.raises(checks.CheckFailed, match="Megatron's model is not the checkpoint"):
        checks.check_trainer_logprobs(padded[0], student)


def test_opd_advantages_pass_the_formula_and_fail_another_coefficient(models):
    student, teacher = models
    rollouts, train = _dumps(student, teacher)
    assert "on 2 samples" in checks.check_opd_advantages(train, rollouts, teacher, opd_kl_coef=COEF)
    with pytest.raises(checks.CheckFailed, match="advantages differ"):
        checks.check_opd_advantages(train, rollouts, teacher, opd_kl_coef=0.9 * COEF)


def test_a_teacher_in_the_trainer_must_be_the_teacher(models):
    student, teacher = models
    rollouts, train = _dumps(student, teacher, noise=0.01)
    for sample in train[0]:  # bf16-sized noise on the trainer's teacher too
        sample["teacher_log_probs"] = sample["teacher_log_probs"] + 0.01 * torch.randn(len(sample["log_probs"]))
        sample["advantages"] = -COEF * (sample["log_probs"] - sample["teacher_log_probs"])
    assert "on 2 samples" in checks.check_opd_advantages(train, rollouts, teacher, opd_kl_coef=COEF,
                                                         teacher_in_trainer=True)
    # The trainer scored with the student (a self-consistent dump: its advantages match its own teacher log-probs).
    rollouts, wrong = _dumps(student, teacher, teacher_in_trainer=student)
    with pytest.raises(checks.CheckFailed, match="scored with another model"):
        checks.check_opd_advantages(wrong, rollouts, teacher, opd_kl_coef=COEF, teacher_in_trainer=True)


def test_trained_tokens_must_be_the_students_own_turns(tmp_path):
    from slime.utils.tiny_models import build_tokenizer

    tok = build_tokenizer()
    parts = [("ab<|im_start|>c<|im_end|>", 1),  # the student's turn; an untrained student writes specials too
             ("\n<|im_start|>user\nwall<|im_end|>\n<|im_start|>assistant\n", 0),  # the environment's observation
             ("d<|im_end|>", 1)]
    ids, mask = [], []
    for text, m in parts:
        piece = tok.encode(text, add_special_tokens=False)
        ids += piece
        mask += [m] * len(piece)
    sample = {"tokens": tok.encode("<|im_start|>assistant\n", add_special_tokens=False) + ids,
              "response_length": len(ids), "loss_mask": mask}
    assert checks.check_trained_tokens({0: [sample]}, tok) == "7 trained tokens, all in assistant turns"
    first_obs = len(tok.encode(parts[0][0], add_special_tokens=False))
    # the newline after the student's stop, the user header, the observation's text ("\n<|im_start|>user\nwall")
    for pos in (first_obs, first_obs + 3, first_obs + 7):
        leaky = {**sample, "loss_mask": [1 if i == pos else m for i, m in enumerate(mask)]}
        with pytest.raises(checks.CheckFailed, match=f"response token {pos} "):
            checks.check_trained_tokens({0: [leaky]}, tok)


def test_a_cut_turns_closing_token_is_not_the_students():
    from slime.utils.tiny_models import build_tokenizer

    tok = build_tokenizer()
    # the student's turn was cut by its budget: the rollout closes it with a masked <|im_end|> it never sampled
    parts = [("ab", 1), ("<|im_end|>\n<|im_start|>user\nwall<|im_end|>\n<|im_start|>assistant\n", 0), ("d", 1)]
    ids, mask = [], []
    for text, m in parts:
        piece = tok.encode(text, add_special_tokens=False)
        ids, mask = ids + piece, mask + [m] * len(piece)
    sampled = [-1.5 if m else 0.0 for m in mask]
    sample = {"tokens": ids, "response_length": len(ids), "loss_mask": mask, "rollout_log_probs": sampled}
    assert checks.check_trained_tokens({0: [sample]}, tok) == "3 trained tokens, all in assistant turns"
    # the newline after the masked close is outside every message (the close ends the assistant message)
    after_close = {**sample, "loss_mask": [1 if i == 3 else m for i, m in enumerate(mask)],
                   "rollout_log_probs": [-1.5 if i == 3 else x for i, x in enumerate(sampled)]}
    with pytest.raises(checks.CheckFailed, match="response token 3 .*between two messages"):
        checks.check_trained_tokens({0: [after_close]}, tok)
    # the close itself trained (a loss mask shifted by one): its rollout log-prob 0.0 says nobody sampled it
    close_trained = {**sample, "loss_mask": [1 if i == 2 else m for i, m in enumerate(mask)]}
    with pytest.raises(checks.CheckFailed, match="response token 2 .*not sampled"):
        checks.check_trained_tokens({0: [close_trained]}, tok)
    with pytest.raises(checks.CheckFailed, match="loss-mask entries"):
        checks.check_trained_tokens({0: [{**sample, "loss_mask": mask[:-1]}]}, tok)


def test_an_input_id_may_come_back_clipped_only_where_sglang_clips_it():
    # SGLang 0.5.15.post1 reports the vocabulary's last id as 0 in input_token_logprobs; nothing else may differ
    assert checks.same_input_id(99, 99, 100) and checks.same_input_id(0, 99, 100)
    assert not checks.same_input_id(0, 98, 100) and not checks.same_input_id(98, 99, 100)
