"""The chunked head (fsdp_utils/chunked_head.py) against plain autograd over whole log-softmax rows."""

from __future__ import annotations

import pytest
import torch

from slime.backends.fsdp_utils import opd_kl
from slime.backends.fsdp_utils.chunked_head import FullTeacher, HeadSpec, TopkTeacher, head_stats

N, H, V, K, T = 11, 6, 29, 4, 0.7


def _inputs(seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g, dtype=torch.float64).float().requires_grad_(True)
    weight = torch.randn(V, H, generator=g).requires_grad_(True)
    b = torch.randn(V, generator=g).requires_grad_(True) if bias else None
    targets = torch.randint(0, V, (N,), generator=g)
    teacher = FullTeacher(torch.randn(N, H + 2, generator=g), torch.randn(V, H + 2, generator=g), torch.randn(V, generator=g))
    t_rows = torch.log_softmax(torch.nn.functional.linear(teacher.hidden, teacher.weight, teacher.bias) / T, -1)
    top_lp, top_ids = t_rows.topk(K, dim=-1)
    valid = torch.ones(N, dtype=torch.bool)
    valid[3] = valid[7] = False
    weights = torch.randn(N, 3, generator=g)
    return hidden, weight, b, targets, teacher, TopkTeacher(top_ids, top_lp, valid), t_rows, weights


def _reference(hidden, weight, b, targets, teacher_kind, topk, t_rows, entropy):
    logp = torch.log_softmax(torch.nn.functional.linear(hidden, weight, b).float() / T, -1)
    cols = [logp.gather(-1, targets[:, None]).squeeze(-1)]
    if entropy:
        cols.append(-(logp.exp() * logp).sum(-1))
    if teacher_kind == "full":
        cols.append(opd_kl.full_reverse_kl(logp, t_rows))
    elif teacher_kind == "topk":
        kl = opd_kl.topk_reverse_kl(logp, topk.ids, topk.log_probs)
        cols.append(torch.where(topk.valid, kl, torch.zeros_like(kl)))
    return torch.stack(cols, -1)


@pytest.mark.parametrize("chunk", [1, 3, 64])
@pytest.mark.parametrize("teacher_kind,entropy,bias", [(None, False, False), (None, True, True), ("full", True, True),
                                                      ("full", False, False), ("topk", True, False)])
def test_values_and_gradients_match_whole_rows(chunk, teacher_kind, entropy, bias):
    hidden, weight, b, targets, full, topk, t_rows, w = _inputs(bias=bias)
    teacher = {"full": full, "topk": topk, None: None}[teacher_kind]
    spec = HeadSpec(targets=targets, temperature=T, chunk_size=chunk, entropy=entropy, teacher=teacher)
    params = [p for p in (hidden, weight, b) if p is not None]
    got = head_stats(hidden, weight, b, spec)
    want = _reference(hidden, weight, b, targets, teacher_kind, topk, t_rows, entropy)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    loss_got = (got * w[:, :got.shape[1]]).sum()
    loss_want = (want * w[:, :want.shape[1]]).sum()
    for g_got, g_want in zip(torch.autograd.grad(loss_got, params), torch.autograd.grad(loss_want, params)):
        torch.testing.assert_close(g_got, g_want, atol=1e-5, rtol=1e-4)


def test_no_grad_path_and_bad_chunk_size():
    hidden, weight, b, targets, full, *_ = _inputs()
    spec = HeadSpec(targets=targets, temperature=T, chunk_size=4, teacher=full)
    with torch.no_grad():
        out = head_stats(hidden, weight, b, spec)
    assert out.shape == (N, 2) and not out.requires_grad
    with pytest.raises(ValueError, match="chunk_size"):
        head_stats(hidden, weight, b, HeadSpec(targets=targets, temperature=T, chunk_size=0))


def test_bfloat16_head_sums_weight_gradients_in_float32():
    hidden, weight, _, targets, *_ = _inputs()
    h16 = hidden.detach().bfloat16().requires_grad_(True)
    w16 = weight.detach().bfloat16().requires_grad_(True)
    out = head_stats(h16, w16, None, HeadSpec(targets=targets, temperature=T, chunk_size=2, entropy=True))
    assert out.dtype == torch.float32
    out.sum().backward()
    assert w16.grad.dtype == torch.bfloat16 and h16.grad.dtype == torch.bfloat16
    ref = _reference(h16.detach().float().requires_grad_(True), w16.detach().float().requires_grad_(True), None,
                     targets, None, None, None, True)
    torch.testing.assert_close(out, ref.detach(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("teacher_kind", [None, "full", "topk"])
def test_vocabulary_split_over_two_ranks_gives_the_same_values_and_gradients(teacher_kind):
    """Each rank holds half the vocabulary's rows (the second one fewer: V is odd, as a TP-padded output
    layer's last shard): outputs, the hidden states' gradient and each rank's weight-row gradient equal
    the whole-vocabulary head's."""
    from fsdp_helpers import sharded_head_worker

    from slime.backends.fsdp_utils.launch import run_local_group

    hidden, weight, _, targets, teacher, topk, _, loss_weights = _inputs(seed=5, bias=False)
    hidden, weight = hidden.detach(), weight.detach()
    teacher = FullTeacher(teacher.hidden, teacher.weight, None)
    inputs = (hidden, weight, targets, teacher, topk, loss_weights, T)
    ranks = run_local_group(sharded_head_worker, 2, inputs, teacher_kind, 4)

    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    spec = HeadSpec(targets, T, 4, True, teacher if teacher_kind == "full" else topk if teacher_kind == "topk" else None)
    out = head_stats(h, w, None, spec)
    (out * loss_weights[:, :out.shape[1]]).sum().backward()
    rows = -(-V // 2)
    for rank, (r_out, r_grad_h, r_grad_w) in enumerate(ranks):
        torch.testing.assert_close(r_out, out.detach(), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(r_grad_h, h.grad, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(r_grad_w, w.grad[rank * rows:(rank + 1) * rows], rtol=1e-4, atol=1e-5)
