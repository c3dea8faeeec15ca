"""Why multi-step OPD with small optimizer batches does not close the KL (issue 13): measured on fixed states.

Input: the student's own episodes of one rollout (``train.py --save-debug-rollout-data``), the
student and the teacher (HF folders). Everything is computed with the trainer's own pieces
(``forward.response_log_softmax``, ``ppo_utils`` losses, ``opd_kl``), on CPU, in float32.

1. **Gradient quality.** The gradient of the exact reverse KL over all states (the per-sample mean
   over trained tokens, then the mean over samples, as the trainer normalises) is the target. For
   optimizer batches of B episodes drawn from the same states, the cosine between it and (a) slime's
   sampled OPD gradient (advantage ``-(log s(a) - log t(a))`` on the sampled token, PPO loss at ratio
   1) and (b) the ``--opd-loss full`` gradient (exact KL of those B episodes).
2. **What the updates do.** From the same start, Adam steps at the trainer's settings over the
   first half of the episodes, split into optimizer batches, PPO-clipped against the start's
   log-probs as in the trainer; then the exact KL on those states and on the held-out second half.

    python benchmarks/opd_gradient_noise.py --student S --teacher T --samples rollout_0.pt [--md out.md]
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics

import torch
import transformers

from slime.backends.fsdp_utils import forward, opd_kl
from slime.rollout.debug_rollout_data import load
from slime.utils import ppo_utils


def _masks(samples):
    return [torch.tensor(s.loss_mask, dtype=torch.float32) for s in samples]


def _rows(model, samples, temperature):
    return forward.response_log_softmax(model, samples, temperature=temperature, pad_token_id=0, device="cpu")


def exact_kl_loss(model, teacher_rows, samples, temperature):
    rows = _rows(model, samples, temperature)
    kl = [opd_kl.full_reverse_kl(r, t) for r, t in zip(rows, teacher_rows)]
    return ppo_utils.sum_of_sample_mean(kl, _masks(samples))


def sampled_opd_loss(model, teacher_rows, samples, temperature, old_log_probs, eps_clip=0.2):
    """slime's term: advantages from the rollout-time (old) log-probs, PPO-clipped surrogate."""
    rows = _rows(model, samples, temperature)
    targets = forward.response_targets(samples, "cpu")
    log_probs = forward.gather_log_probs(rows, targets)
    teacher_lp = forward.gather_log_probs(teacher_rows, targets)
    adv = [-(old - t) for old, t in zip(old_log_probs, teacher_lp)]
    pg = [ppo_utils.compute_policy_loss(lp, old, a, eps_clip)[0] for lp, old, a in zip(log_probs, old_log_probs, adv)]
    return ppo_utils.sum_of_sample_mean(pg, _masks(samples))


def _grad(model, loss) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _cos(a, b) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def gradient_quality(student, teacher_rows, old_lp, samples, temperature, batch_sizes, draws, rng):
    everything = list(range(len(samples)))
    target = _grad(student, exact_kl_loss(student, teacher_rows, samples, temperature))
    out = []
    for b in batch_sizes + [len(samples)]:
        cos_sampled, cos_full = [], []
        for _ in range(draws if b < len(samples) else 1):
            idx = rng.sample(everything, b)
            pick = [samples[i] for i in idx]
            t_rows = [teacher_rows[i] for i in idx]
            old = [old_lp[i] for i in idx]
            cos_sampled.append(_cos(_grad(student, sampled_opd_loss(student, t_rows, pick, temperature, old)), target))
            cos_full.append(_cos(_grad(student, exact_kl_loss(student, t_rows, pick, temperature)), target))
        out.append((b, cos_sampled, cos_full))
    return out


def run_updates(student, teacher_rows, old_lp, samples, temperature, *, loss, n_steps, lr, clip_grad=1.0):
    """Adam over the first half of the episodes in ``n_steps`` equal optimizer batches; exact KL after."""
    model = copy.deepcopy(student)
    half = len(samples) // 2
    train, held = list(range(half)), list(range(half, len(samples)))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    per = half // n_steps
    for k in range(n_steps):
        idx = train[k * per:(k + 1) * per]
        pick, t_rows = [samples[i] for i in idx], [teacher_rows[i] for i in idx]
        if loss == "full":
            value = exact_kl_loss(model, t_rows, pick, temperature)
        else:
            value = sampled_opd_loss(model, t_rows, pick, temperature, [old_lp[i] for i in idx])
        opt.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
        opt.step()
    with torch.no_grad():
        def kl_on(idx):
            return float(exact_kl_loss(model, [teacher_rows[i] for i in idx], [samples[i] for i in idx], temperature))
        return kl_on(train), kl_on(held)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--student", required=True)
    parser.add_argument("--teacher", required=True)
    parser.add_argument("--samples", required=True, help="a --save-debug-rollout-data file")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--draws", type=int, default=12)
    parser.add_argument("--lrs", type=float, nargs="+", default=[2e-4, 1e-3])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--md", default=None)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    transformers.utils.logging.disable_progress_bar()
    samples = [s for s in load(args.samples) if sum(s.loss_mask or []) > 0]
    student = transformers.AutoModelForCausalLM.from_pretrained(args.student, dtype=torch.float32)
    teacher = transformers.AutoModelForCausalLM.from_pretrained(args.teacher, dtype=torch.float32)
    with torch.no_grad():
        teacher_rows = _rows(teacher, samples, args.temperature)
        start_rows = _rows(student, samples, args.temperature)
        old_lp = forward.gather_log_probs(start_rows, forward.response_targets(samples, "cpu"))
        start_kl = float(exact_kl_loss(student, teacher_rows, samples, args.temperature))
    lines = [f"{len(samples)} episodes, {sum(sum(s.loss_mask) for s in samples)} trained tokens; exact reverse KL "
             f"(mean over episodes of the per-token mean) at the start: {start_kl:.4f}", "",
             "| optimizer batch (episodes) | cos(sampled grad, exact grad) | cos(full grad, exact grad) |",
             "|---|---|---|"]
    for b, cs, cf in gradient_quality(student, teacher_rows, old_lp, samples, args.temperature, args.batch_sizes,
                                      args.draws, rng):
        fmt = (lambda v: f"{statistics.fmean(v):.3f} +- {statistics.pstdev(v):.3f}") if len(cs) > 1 else \
            (lambda v: f"{v[0]:.3f}")
        lines.append(f"| {b} | {fmt(cs)} | {fmt(cf)} |")
    half = len(samples) // 2
    with torch.no_grad():
        base_train = float(exact_kl_loss(student, teacher_rows[:half], samples[:half], args.temperature))
        base_held = float(exact_kl_loss(student, teacher_rows[half:], samples[half:], args.temperature))
    lines += ["", f"Adam from the same start over the first {half} episodes; exact KL before: {base_train:.4f} on "
              f"those states, {base_held:.4f} on the {len(samples) - half} held-out ones.", "",
              "| loss | lr | optimizer steps x batch | exact KL, trained states | exact KL, held-out states |",
              "|---|---|---|---|---|"]
    for lr in args.lrs:
        for loss in ("sampled", "full"):
            for n_steps in (1, 4, half // 2):
                kl_train, kl_held = run_updates(student, teacher_rows, old_lp, samples, args.temperature, loss=loss,
                                                n_steps=n_steps, lr=lr)
                lines.append(f"| {loss} | {lr:g} | {n_steps} x {half // n_steps} | {kl_train:.4f} | {kl_held:.4f} |")
    text = "\n".join(lines)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
