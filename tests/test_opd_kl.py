"""Whole-distribution reverse KL (slime/backends/fsdp_utils/opd_kl.py) and how slime's sampled OPD term relates to it.

The sampled term puts ``-(log s(a) - log t(a))`` on the student's own token ``a`` as an advantage. On
fixed states its expected policy gradient is the gradient of the exact reverse KL (the score-function
identity, with ``E[grad log s] = 0``); these tests check that through the project's own loss code.
"""

from __future__ import annotations

import argparse

import pytest
import torch

from slime.backends.fsdp_utils import opd_kl
from slime.utils import ppo_utils

V, P = 12, 5  # vocabulary, positions


def _dists(seed=0, sharp=1.0):
    g = torch.Generator().manual_seed(seed)
    student = torch.log_softmax(torch.randn(P, V, generator=g), -1)
    teacher = torch.log_softmax(sharp * torch.randn(P, V, generator=g), -1)
    return student, teacher


def test_full_reverse_kl_is_the_textbook_sum_and_zero_on_equal_distributions():
    s, t = _dists()
    expected = torch.tensor([sum(float(s[p, v].exp()) * float(s[p, v] - t[p, v]) for v in range(V))
                             for p in range(P)])
    assert torch.allclose(opd_kl.full_reverse_kl(s, t), expected, atol=1e-6)
    assert (opd_kl.full_reverse_kl(s, t) > 0).all()
    assert torch.allclose(opd_kl.full_reverse_kl(s, s), torch.zeros(P), atol=1e-6)


def test_topk_kl_equals_the_exact_kl_at_full_k_and_bounds_it_from_below():
    s, t = _dists(1)
    exact = opd_kl.full_reverse_kl(s, t)
    for k in (1, 3, 6, V):
        top_lp, top_ids = t.topk(k, dim=-1)
        bound = opd_kl.topk_reverse_kl(s, top_ids, top_lp)
        assert (bound <= exact + 1e-5).all(), k
        assert (bound >= -1e-6).all(), k
    top_lp, top_ids = t.topk(V, dim=-1)
    assert torch.allclose(opd_kl.topk_reverse_kl(s, top_ids, top_lp), exact, atol=1e-5)


def test_topk_kl_gap_is_the_students_mass_outside_the_teachers_top_k():
    # A confident teacher and a student that already puts most of its mass where the teacher does
    # (the distillation regime): the top-k form is then close to the exact KL.
    g = torch.Generator().manual_seed(2)
    teacher_logits = 6.0 * torch.randn(P, V, generator=g)
    t = torch.log_softmax(teacher_logits, -1)
    s = torch.log_softmax(0.8 * teacher_logits + torch.randn(P, V, generator=g), -1)
    top_lp, top_ids = t.topk(4, dim=-1)
    exact = opd_kl.full_reverse_kl(s, t)
    bound = opd_kl.topk_reverse_kl(s, top_ids, top_lp)
    assert (bound <= exact + 1e-5).all()
    outside = 1.0 - s.exp().gather(-1, top_ids).sum(-1)
    # Merging the tail loses at most (student's tail mass) x (largest log-ratio inside the tail).
    assert ((exact - bound) <= outside * (s - t).abs().max() + 1e-5).all()
    assert torch.allclose(bound, exact, rtol=0.1, atol=1e-3), (bound, exact)


def test_kl_functions_reject_mismatched_shapes():
    s, t = _dists()
    with pytest.raises(ValueError, match="differ"):
        opd_kl.full_reverse_kl(s, t[:, :-1])
    with pytest.raises(ValueError, match="positions, k"):
        opd_kl.topk_reverse_kl(s, torch.zeros(P, 3, dtype=torch.long), torch.zeros(P, 2))


def _sampled_opd_gradient(logits, teacher, actions):
    """Gradient of slime's sampled OPD objective: advantages from apply_opd_kl_to_advantages, PPO loss at ratio 1."""
    logits.grad = None
    log_s = torch.log_softmax(logits, -1)
    lp = log_s.gather(-1, actions).t()  # [draws, P]: each draw is one "sample" of P tokens
    t_lp = teacher.gather(-1, actions).t()
    args = argparse.Namespace(use_opd=True, opd_kl_coef=1.0)
    adv = ppo_utils.apply_opd_kl_to_advantages(args, {"teacher_log_probs": list(t_lp)},
                                               [torch.zeros(P) for _ in range(lp.shape[0])], list(lp))
    losses = [ppo_utils.compute_policy_loss(lp_i, lp_i.detach(), a_i, 0.2)[0] for lp_i, a_i in zip(lp, adv)]
    masks = [torch.ones(P) for _ in losses]
    (ppo_utils.masked_token_sum(losses, masks) / len(losses)).backward()
    return logits.grad.clone()


def _exact_kl_gradient(logits, teacher):
    logits.grad = None
    opd_kl.full_reverse_kl(torch.log_softmax(logits, -1), teacher).sum().backward()
    return logits.grad.clone()


def test_sampled_opd_gradient_averages_to_the_exact_reverse_kl_gradient_on_fixed_states():
    s, teacher = _dists(3)
    logits = s.clone().requires_grad_(True)
    exact = _exact_kl_gradient(logits, teacher)
    # The expectation over the student's tokens, enumerated: every token, weighted by its probability.
    every = torch.arange(V).repeat(P, 1)  # [P, V]: draw v at every position
    logits.grad = None
    log_s = torch.log_softmax(logits, -1)
    weights = log_s.detach().exp().t()  # [V, P]
    lp = log_s.gather(-1, every).t()
    adv = -(lp.detach() - teacher.gather(-1, every).t())
    (-(weights * adv * lp).sum()).backward()
    assert torch.allclose(logits.grad, exact, atol=1e-5)

    # Monte Carlo through the project's own OPD term and PPO loss: the average points the same way.
    g = torch.Generator().manual_seed(0)
    actions = torch.multinomial(s.exp(), 4000, replacement=True, generator=g)  # [P, draws]
    sampled = _sampled_opd_gradient(logits, teacher, actions)
    cosine = torch.nn.functional.cosine_similarity(sampled.flatten(), exact.flatten(), dim=0)
    assert cosine > 0.95, float(cosine)
    # ... while a single draw per state is a noisy estimate (what a tiny optimizer batch trains on).
    few = _sampled_opd_gradient(logits, teacher, actions[:, :1])
    assert torch.nn.functional.cosine_similarity(few.flatten(), exact.flatten(), dim=0) < cosine
