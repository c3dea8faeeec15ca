"""Trainer memory features give today's numbers: the chunked LM head (values AND gradients of log-probs,
entropies and both OPD KLs), activation checkpointing, and micro-batches packed by tokens."""

from __future__ import annotations

import pytest
import torch
import transformers
from fsdp_helpers import assert_same_run, make_args, make_samples, run_config, single_thread, student_and_teacher

from slime.backends.fsdp_utils import data_plan, forward
from slime.backends.fsdp_utils.actor import FSDPActor

transformers.utils.logging.disable_progress_bar()


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    with single_thread():
        yield student_and_teacher(tmp_path_factory, "trainer_memory")


def _with_topk(samples, k=3, seed=0):
    """Server-teacher style top-k log-probs (distinct ids, mass 0.9) on every response position."""
    g = torch.Generator().manual_seed(seed)
    for s in samples:
        ids = [torch.randperm(100, generator=g)[:k].tolist() for _ in range(s.response_length)]
        probs = [(0.9 * torch.softmax(torch.randn(k, generator=g), -1)).log().tolist() for _ in ids]
        s.metadata = {"teacher_topk": {"ids": ids, "logprobs": probs}}
    return samples


def _scores_and_grads(actor, samples, chunk, kind):
    """Per micro-batch of 3 (right-padded): log-probs, entropies, KL, and the parameter gradients of a
    loss that weighs all three with different per-token weights."""
    actor.chunk_size = chunk
    values, loss = [], 0.0
    for start in range(0, len(samples), 3):
        batch = samples[start:start + 3]
        teacher = actor._kl_teacher(batch)[1] if kind == "full" else forward.topk_teacher(batch, actor.device)
        s = actor._score(actor.model, batch, entropy=True, teacher=teacher)
        for lp, ent, kl in zip(s.log_probs, s.entropy, s.kl):
            w = torch.linspace(0.5, 1.5, lp.numel())
            loss = loss + (w * lp).sum() - 0.3 * (w.flip(0) * ent).sum() + 0.7 * kl.sum()
            values.append(torch.stack([lp, ent, kl]).detach())
    loss.backward()
    grads = {n: p.grad.full_tensor().clone() for n, p in actor.model.named_parameters()}
    actor.model.zero_grad(set_to_none=True)
    return values, grads


@pytest.mark.parametrize("kind", ["full", "topk"])
def test_chunked_head_matches_whole_rows_in_values_and_gradients(ckpts, kind):
    extra = ["--opd-type", "megatron", "--opd-teacher-load", ckpts["teacher"]] if kind == "full" else \
        ["--opd-type", "sglang", "--rm-url", "http://127.0.0.1:1/generate", "--opd-teacher-top-k", "3",
         "--rollout-temperature", "1"]
    with single_thread():
        actor = FSDPActor(make_args(ckpts["student"], "--use-opd", *extra), 0, 1)
        samples = _with_topk(make_samples(n=7))  # unequal lengths: padding in each micro-batch of 3
        ref_values, ref_grads = _scores_and_grads(actor, samples, -1, kind)
        for chunk in (1, 4, 4096):  # chunks inside a sample, across samples, the whole micro-batch
            values, grads = _scores_and_grads(actor, samples, chunk, kind)
            for got, want in zip(values, ref_values):
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            for name, want in ref_grads.items():
                torch.testing.assert_close(grads[name], want, atol=1e-5, rtol=1e-4, msg=name)
    assert any(float(g.abs().max()) > 1e-3 for g in ref_grads.values())


def _run(ckpts, *argv, n_rollouts=2):
    return run_config(0, 1, {"ckpt": ckpts["student"], "n_samples": 6, "n_rollouts": n_rollouts,
                             "argv": ["--num-steps-per-rollout", "2", "--use-opd", "--opd-type", "megatron",
                                      "--opd-teacher-load", ckpts["teacher"], "--entropy-coef", "0.01",
                                      *argv]})


def test_checkpointing_chunking_and_token_budgets_train_like_the_plain_path(ckpts):
    with single_thread():
        plain = _run(ckpts, "--opd-loss", "full", "--log-probs-chunk-size", "-1", "--micro-batch-size", "2")
        # Token budget 40 packs these samples (13-21 tokens) one or two at a time; chunk 5 cuts inside samples.
        memory = _run(ckpts, "--opd-loss", "full", "--log-probs-chunk-size", "5", "--recompute-granularity", "full",
                      "--use-dynamic-batch-size", "--max-tokens-per-gpu", "40")
    assert "opd/exact_kl" in plain["metrics"][0] and "opd/full_kl_loss" in plain["metrics"][0]
    assert_same_run(plain, memory)


def test_gradient_checkpointing_is_on_and_recomputes(ckpts):
    with single_thread():
        actor = FSDPActor(make_args(ckpts["student"], "--gradient-checkpointing"), 0, 1)
    layers = actor.model.model.layers
    assert all(layer.gradient_checkpointing for layer in layers)
    calls = []
    handle = layers[0].self_attn.register_forward_hook(lambda *a: calls.append(torch.is_grad_enabled()))
    try:
        with single_thread():
            actor.train(0, make_samples(n=8), kl_coef=0.0)
    finally:
        handle.remove()
    # Per training micro-batch one forward and one recompute in backward (plus the no-grad scoring pass).
    assert calls.count(True) == 2 * 4 and calls.count(False) == 4


# ---------------------------------------------------------------------------- packing by tokens
def test_token_packing_respects_the_budget_and_keeps_ranks_in_step():
    lengths = [30, 5, 12, 40, 7, 7, 25, 3, 60, 9, 11, 18]
    for world in (1, 2, 3):
        plans = [data_plan.plan_steps(len(lengths), 2, world, r, 1, lengths=lengths, max_tokens=36)
                 for r in range(world)]
        for steps in zip(*plans):
            assert len({len(s.micro_batches) for s in steps}) == 1  # same count on every rank
            seen = []
            for s in steps:
                for mb in s.micro_batches:
                    if mb.dummy:
                        continue
                    seen.extend(mb.indices)
                    longest = max(lengths[i] for i in mb.indices)
                    assert len(mb.indices) * longest <= 36 or len(mb.indices) == 1
            assert sorted(seen) == sorted(steps[0].global_indices)
    # The 60-token sample exceeds the budget and goes alone; short ones share a micro-batch.
    packed = data_plan.pack(list(range(len(lengths))), lengths, 1, 36)
    assert (8,) in [mb.indices for mb in packed]
    assert max(len(mb.indices) for mb in packed) >= 3
    assert [mb.indices for mb in data_plan.pack([0, 1, 2], lengths, 2)] == [(0, 1), (2,)]
