import math
import statistics
import threading
from types import SimpleNamespace

import pytest
import torch

from slime.utils import ppo_utils as pu


def t(*values):
    return torch.tensor(values, dtype=torch.float64)


# ---------------------------------------------------------------------------- KL estimators
P = [0.5, 0.3, 0.2]
Q = [0.2, 0.5, 0.3]
EXACT_KL = sum(p * math.log(p / q) for p, q in zip(P, Q))


def _expectation_under_p(kl_type):
    kl = pu.compute_approx_kl(torch.log(t(*P)), torch.log(t(*Q)), kl_type)
    return float((t(*P) * kl).sum())


@pytest.mark.parametrize("kl_type", ["k1", "k3", "low_var_kl"])
def test_unbiased_estimators_average_to_exact_kl(kl_type):
    # Enumerating every token with its sampling probability gives the estimator's exact expectation.
    assert _expectation_under_p(kl_type) == pytest.approx(EXACT_KL, rel=1e-6)


def test_k2_expectation_matches_hand_value_and_differs_from_kl():
    hand = sum(p * 0.5 * math.log(p / q) ** 2 for p, q in zip(P, Q))
    assert _expectation_under_p("k2") == pytest.approx(hand, rel=1e-6)
    assert hand != pytest.approx(EXACT_KL, rel=1e-3)


def test_per_token_values_and_signs():
    lp, base = t(-1.0, -2.0), t(-1.5, -1.0)  # log r = 0.5, -1.0
    assert pu.compute_approx_kl(lp, base, "k1").tolist() == pytest.approx([0.5, -1.0])
    assert pu.compute_approx_kl(lp, base, "k2").tolist() == pytest.approx([0.125, 0.5])
    k3 = pu.compute_approx_kl(lp, base, "k3")
    assert k3.tolist() == pytest.approx([math.exp(-0.5) - 0.5, math.e - 2.0])
    assert (k3 >= 0).all()


def test_low_var_kl_is_clamped_where_k3_is_not():
    lp, base = t(0.0, 0.0), t(15.0, -30.0)  # log r = -15 (exp(15) huge), +30
    k3 = pu.compute_approx_kl(lp, base, "k3")
    assert k3[0] > 1e6
    assert pu.compute_approx_kl(lp, base, "low_var_kl").tolist() == [10.0, 10.0]


def test_unknown_kl_type_rejected():
    with pytest.raises(ValueError, match="kl_loss_type"):
        pu.compute_approx_kl(t(0.0), t(0.0), "k4")


# ---------------------------------------------------------------------------- GRPO
def test_grpo_returns_match_statistics_module():
    rewards = [1.0, 0.0, 0.5, 0.0, 2.0, 2.0, 3.0, 1.0]
    out = pu.get_grpo_returns(rewards, group_size=4)
    for g in range(2):
        group = rewards[4 * g: 4 * g + 4]
        mean, std = statistics.mean(group), statistics.stdev(group)
        expected = [(r - mean) / (std + 1e-6) for r in group]
        assert out[4 * g: 4 * g + 4].tolist() == pytest.approx(expected, rel=1e-5)


def test_grpo_without_std_only_centres_and_group_of_one_is_zero():
    assert pu.get_grpo_returns([1.0, 3.0], 2, std_normalization=False).tolist() == [-1.0, 1.0]
    assert pu.get_grpo_returns([5.0, -2.0], 1).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="groups of 3"):
        pu.get_grpo_returns([1.0, 2.0], 3)


def test_broadcast_to_tokens():
    out = pu.broadcast_to_tokens([0.5, -1.0], [3, 1])
    assert [x.tolist() for x in out] == [[0.5, 0.5, 0.5], [-1.0]]
    with pytest.raises(ValueError):
        pu.broadcast_to_tokens([0.5], [3, 1])


# ---------------------------------------------------------------------------- REINFORCE++
def test_reinforce_plus_plus_skips_observations_in_rewards_and_discount():
    kl = [t(0.1, 0.2, 5.0, 5.0, 0.4)]
    mask = [t(1, 1, 0, 0, 1)]
    c, gamma, reward = 0.5, 0.9, 2.0
    out = pu.get_reinforce_plus_plus_returns([reward], kl, mask, c, gamma)[0]
    g4 = -c * 0.4 + reward
    g1 = -c * 0.2 + gamma * g4  # one discount step across the two observation tokens
    g0 = -c * 0.1 + gamma * g1
    assert out.tolist() == pytest.approx([g0, g1, 0.0, 0.0, g4])


def test_reinforce_plus_plus_sample_without_trainable_tokens_is_zero():
    out = pu.get_reinforce_plus_plus_returns([3.0], [t(1.0, 1.0)], [t(0, 0)], 1.0, 1.0)[0]
    assert out.tolist() == [0.0, 0.0]


def test_reinforce_plus_plus_baseline_subtracts_group_mean_then_sums():
    kl = [t(0.2, 0.4), t(0.0, 0.6)]
    mask = [t(1, 1), t(1, 1)]
    out = pu.get_reinforce_plus_plus_baseline_advantages([1.0, 3.0], kl, mask, kl_coef=1.0, group_size=2)
    # baseline 2.0 -> centred rewards -1, +1; undiscounted reward-to-go of the KL-shaped rewards
    assert out[0].tolist() == pytest.approx([-0.2 - 0.4 - 1.0, -0.4 - 1.0])
    assert out[1].tolist() == pytest.approx([0.0 - 0.6 + 1.0, -0.6 + 1.0])


# ---------------------------------------------------------------------------- PPO / GAE
def _plain_gae(values, rewards, gamma, lambd):
    n = len(values)
    adv = [0.0] * n
    last = 0.0
    for i in reversed(range(n)):
        next_v = values[i + 1] if i + 1 < n else 0.0
        delta = rewards[i] + gamma * next_v - values[i]
        last = delta + gamma * lambd * last
        adv[i] = last
    return adv, [a + v for a, v in zip(adv, values)]


def test_gae_matches_plain_loop_on_full_mask():
    g = torch.Generator().manual_seed(0)
    values, rewards = torch.randn(7, generator=g), torch.randn(7, generator=g)
    adv, ret = pu.get_advantages_and_returns(values, rewards, torch.ones(7), 0.95, 0.9)
    ref_adv, ref_ret = _plain_gae(values.tolist(), rewards.tolist(), 0.95, 0.9)
    assert adv.tolist() == pytest.approx(ref_adv, abs=1e-5)
    assert ret.tolist() == pytest.approx(ref_ret, abs=1e-5)


def test_gae_with_observations_equals_gae_on_trainable_tokens_only():
    g = torch.Generator().manual_seed(1)
    values, rewards = torch.randn(8, generator=g), torch.randn(8, generator=g)
    mask = torch.tensor([1, 1, 0, 0, 1, 0, 1, 1])
    adv, ret = pu.get_advantages_and_returns(values, rewards, mask, 0.9, 0.8)
    keep = mask.nonzero().flatten()
    ref_adv, ref_ret = _plain_gae(values[keep].tolist(), rewards[keep].tolist(), 0.9, 0.8)
    assert adv[keep].tolist() == pytest.approx(ref_adv, abs=1e-5)
    assert ret[keep].tolist() == pytest.approx(ref_ret, abs=1e-5)
    assert adv[mask == 0].abs().sum() == 0 and ret[mask == 0].abs().sum() == 0


def test_token_rewards_and_batch_gae():
    rewards = pu.compute_token_rewards([1.0, -1.0], [t(0.1, 0.3, 0.2), t(0.5, 0.5)], [t(1, 1, 0), t(0, 1)], 0.1)
    assert rewards[0].tolist() == pytest.approx([-0.01, -0.03 + 1.0, 0.0])
    assert rewards[1].tolist() == pytest.approx([0.0, -0.05 - 1.0])
    values = [torch.zeros(3), torch.zeros(2)]
    adv, ret = pu.get_advantages_and_returns_batch(values, rewards, [t(1, 1, 0), t(0, 1)], 1.0, 1.0)
    assert adv[0].tolist() == pytest.approx([0.96, 0.97, 0.0])
    assert ret[1].tolist() == pytest.approx([0.0, -1.05])


# ---------------------------------------------------------------------------- policy / value losses
def _loss(ratio, adv, **kw):
    log_probs = torch.log(torch.tensor([ratio], dtype=torch.float64))
    loss, clip = pu.compute_policy_loss(log_probs, torch.zeros(1, dtype=torch.float64),
                                        torch.tensor([adv], dtype=torch.float64), **kw)
    return float(loss), float(clip)


@pytest.mark.parametrize("ratio,adv,loss,clipped", [
    (1.5, 2.0, -2.0 * 1.2, 1.0),   # positive advantage, ratio above 1+eps: clipped
    (0.5, 2.0, -2.0 * 0.5, 0.0),   # positive advantage, ratio below 1-eps: unclipped (pessimistic)
    (1.5, -2.0, 2.0 * 1.5, 0.0),   # negative advantage, ratio above: unclipped
    (0.5, -2.0, 2.0 * 0.8, 1.0),   # negative advantage, ratio below 1-eps: clipped
    (1.1, 1.0, -1.1, 0.0),         # inside the trust region
])
def test_ppo_clip_cases(ratio, adv, loss, clipped):
    assert _loss(ratio, adv, eps_clip=0.2, eps_clip_high=0.2) == pytest.approx((loss, clipped))


def test_asymmetric_clip_high():
    assert _loss(1.3, 1.0, eps_clip=0.2, eps_clip_high=0.28) == pytest.approx((-1.28, 1.0))
    assert _loss(0.7, -1.0, eps_clip=0.2, eps_clip_high=0.28) == pytest.approx((0.8, 1.0))


def test_dual_clip_bounds_negative_advantages_only():
    assert _loss(5.0, -2.0, eps_clip=0.2, eps_clip_c=3.0) == pytest.approx((6.0, 1.0))
    assert _loss(2.0, -2.0, eps_clip=0.2, eps_clip_c=3.0) == pytest.approx((4.0, 0.0))
    assert _loss(5.0, 2.0, eps_clip=0.2, eps_clip_c=3.0) == pytest.approx((-2.4, 1.0))
    with pytest.raises(ValueError, match="eps_clip_c"):
        _loss(5.0, -2.0, eps_clip=0.2, eps_clip_c=1.0)


def test_clipped_tokens_get_no_gradient():
    log_probs = torch.log(torch.tensor([1.5, 1.1])).requires_grad_()
    loss, _ = pu.compute_policy_loss(log_probs, torch.zeros(2), torch.tensor([1.0, 1.0]), 0.2)
    loss.sum().backward()
    assert log_probs.grad[0] == 0 and log_probs.grad[1] == pytest.approx(-1.1)


def test_gspo_ratio_is_sequence_level_and_clipped():
    old = [torch.zeros(3), torch.zeros(2)]
    lp = [torch.tensor([0.1, 0.3, 9.0]), torch.tensor([0.5, 0.5])]
    masks = [torch.tensor([1.0, 1.0, 0.0]), torch.ones(2)]
    adv = [torch.ones(3), -torch.ones(2)]
    loss, clip = pu.compute_gspo_policy_loss(lp, old, adv, masks, eps_clip=0.3)
    s0 = math.exp(0.2)  # the masked 9.0 does not enter the mean
    assert loss[0].tolist() == pytest.approx([-s0] * 3)
    assert clip[0].tolist() == [0.0] * 3
    # exp(0.5) = 1.65 > 1.3 with a negative advantage: the unclipped (larger) loss is kept
    assert loss[1].tolist() == pytest.approx([math.exp(0.5)] * 2)
    loss_c, clip_c = pu.compute_gspo_policy_loss([torch.tensor([0.5, 0.5])], [torch.zeros(2)], [torch.ones(2)],
                                                 [torch.ones(2)], eps_clip=0.3)
    assert loss_c[0].tolist() == pytest.approx([-1.3, -1.3]) and clip_c[0].tolist() == [1.0, 1.0]


def test_gspo_gradient_equals_gradient_of_sequence_ratio():
    lp = torch.tensor([0.05, -0.02, 0.03, 0.04], requires_grad=True)
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0])
    loss, _ = pu.compute_gspo_policy_loss([lp], [torch.zeros(4)], [torch.full((4,), 2.0)], [mask], eps_clip=0.2)
    pu.sum_of_sample_mean(loss, [mask]).backward()
    ref_lp = lp.detach().clone().requires_grad_()
    (-2.0 * torch.exp((ref_lp * mask).sum() / mask.sum())).backward()
    assert lp.grad.tolist() == pytest.approx(ref_lp.grad.tolist(), abs=1e-6)


def test_value_loss_clip():
    values, old, returns = t(1.0, 1.0, 0.05), t(0.0, 0.0, 0.0), t(0.0, 2.0, 1.0)
    loss, clip = pu.compute_value_loss(values, old, returns, value_clip=0.2)
    # token 0: unclipped 1.0, clipped (0.2-0)^2=0.04 -> 0.5; token 1: unclipped 1, clipped 3.24 -> 1.62
    assert loss.tolist() == pytest.approx([0.5, 1.62, 0.5 * 0.95 ** 2])
    assert clip.tolist() == [0.0, 1.0, 0.0]
    assert pu.compute_value_loss(values, old, returns, None)[0].tolist() == pytest.approx([0.5, 0.5, 0.45125])


# ---------------------------------------------------------------------------- masked aggregation
X = [t(1.0, 2.0, 100.0), t(4.0), t(7.0, 9.0), t(3.0, 3.0)]
M = [t(1, 1, 0), t(1), t(1, 1), t(0, 0)]


def test_sum_of_sample_mean_and_per_token_mean():
    assert float(pu.sum_of_sample_mean(X, M)) == pytest.approx((1.5 + 4.0 + 8.0 + 0.0) / 4)
    assert float(pu.per_token_mean(X, M)) == pytest.approx((1 + 2 + 4 + 7 + 9) / 5)


def test_global_denominator_across_ranks_matches_whole_batch():
    rank_sums = [pu.masked_sample_mean_sum(X[:1], M[:1]), pu.masked_sample_mean_sum(X[1:], M[1:])]
    assert float(sum(rank_sums) / len(X)) == pytest.approx(float(pu.sum_of_sample_mean(X, M)))
    per_rank = [pu.sum_of_sample_mean(X[:1], M[:1], num_samples=4), pu.sum_of_sample_mean(X[1:], M[1:], num_samples=4)]
    assert float(sum(per_rank)) == pytest.approx(float(pu.sum_of_sample_mean(X, M)))
    tokens = [pu.per_token_mean(X[:2], M[:2], num_tokens=5), pu.per_token_mean(X[2:], M[2:], num_tokens=5)]
    assert float(sum(tokens)) == pytest.approx(float(pu.per_token_mean(X, M)))
    with pytest.raises(ValueError):
        pu.sum_of_sample_mean(X, M, num_samples=0)


def test_whiten_over_masked_tokens():
    out = pu.whiten_advantages(X, M)
    kept = torch.cat([o[m > 0] for o, m in zip(out, M)])
    assert float(kept.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(kept.pow(2).mean()) == pytest.approx(1.0, abs=1e-6)
    assert out[0][2] == 0 and out[3].abs().sum() == 0  # masked tokens do not leak
    values = torch.tensor([1.0, 2.0, 4.0, 7.0, 9.0])
    expected = (values - values.mean()) / values.std(unbiased=False)
    assert kept.tolist() == pytest.approx(expected.tolist(), abs=1e-5)


def test_whiten_with_cross_rank_reduction_matches_single_process():
    barrier, slots = threading.Barrier(2), [None, None]
    results = [None, None]

    def make_reduce(rank):
        def reduce(tensor):  # in place and returning None, like torch.distributed.all_reduce
            slots[rank] = tensor.clone()
            barrier.wait()
            tensor.copy_(slots[0] + slots[1])
            barrier.wait()
        return reduce

    def worker(rank, xs, ms):
        results[rank] = pu.whiten_advantages(xs, ms, all_reduce_fn=make_reduce(rank))

    threads = [threading.Thread(target=worker, args=(0, X[:1], M[:1])),
               threading.Thread(target=worker, args=(1, X[1:], M[1:]))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=10)
    whole = pu.whiten_advantages(X, M)
    for got, ref in zip(results[0] + results[1], whole):
        assert got.tolist() == pytest.approx(ref.tolist(), abs=1e-6)


# ---------------------------------------------------------------------------- OPD
def _opd_args(coef=0.5, use_opd=True):
    return SimpleNamespace(use_opd=use_opd, opd_kl_coef=coef)


def test_opd_term_sign_coefficient_and_logging():
    student = [torch.tensor([-1.0, -2.0], requires_grad=True), torch.tensor([-0.5])]
    teacher = [torch.tensor([-1.5, -1.0]), [-0.25]]  # lists are accepted too
    advantages = [torch.tensor([1.0, 1.0]), torch.tensor([0.0])]
    data = {"teacher_log_probs": teacher}
    original = advantages
    out = pu.apply_opd_kl_to_advantages(_opd_args(0.5), data, advantages, student)
    assert out is original  # the list is updated in place
    # d = student - teacher = [0.5, -1.0], [-0.25]; A' = A - 0.5 * d
    assert out[0].tolist() == pytest.approx([0.75, 1.5])
    assert out[1].tolist() == pytest.approx([0.125])
    assert [d.tolist() for d in data["opd_reverse_kl"]] == [pytest.approx([0.5, -1.0]), pytest.approx([-0.25])]
    assert not out[0].requires_grad and not data["opd_reverse_kl"][0].requires_grad


def test_opd_pure_distillation_pushes_toward_teacher():
    # Zero task reward: a token the student over-weights relative to the teacher gets a negative advantage.
    out = pu.apply_opd_kl_to_advantages(_opd_args(1.0), {"teacher_log_probs": [t(-3.0, -0.1)]},
                                        [t(0.0, 0.0)], [t(-1.0, -2.0)])
    assert out[0][0] < 0 < out[0][1]


def test_opd_disabled_is_a_no_op_even_without_teacher():
    advantages = [t(1.0, 2.0)]
    data = {}
    out = pu.apply_opd_kl_to_advantages(_opd_args(use_opd=False), data, advantages, [t(0.0, 0.0)])
    assert out[0].tolist() == [1.0, 2.0] and "opd_reverse_kl" not in data


def test_opd_missing_teacher_raises():
    with pytest.raises(ValueError, match="teacher_log_probs"):
        pu.apply_opd_kl_to_advantages(_opd_args(), {}, [t(1.0)], [t(0.0)])
    with pytest.raises(ValueError, match="sample 1"):
        pu.apply_opd_kl_to_advantages(_opd_args(), {"teacher_log_probs": [[0.0], None]}, [t(1.0), t(1.0)],
                                      [t(0.0), t(0.0)])


def test_opd_length_mismatch_raises():
    with pytest.raises(ValueError, match="sample 0"):
        pu.apply_opd_kl_to_advantages(_opd_args(), {"teacher_log_probs": [[0.0, 0.0, 0.0]]}, [t(1.0, 1.0)],
                                      [t(0.0, 0.0)])
    with pytest.raises(ValueError, match="one per sample"):
        pu.apply_opd_kl_to_advantages(_opd_args(), {"teacher_log_probs": [[0.0]]}, [t(1.0), t(1.0)],
                                      [t(0.0), t(0.0)])
