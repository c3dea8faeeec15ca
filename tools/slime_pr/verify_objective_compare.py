"""The comparisons of verify_objective.py: upstream's and this runtime's rewards, teacher log-probs and
advantages, case by case, against each other and against the closed form ``-opd_kl_coef * (s - t)``.
"""

from __future__ import annotations

from tools.slime_pr.objective_cases import teacher_response_log_probs

TOL = 1e-6


def max_abs_diff(a: dict[str, list[float]], b: dict[str, list[float]], masks: dict[str, list[int]] | None = None):
    """Largest |a - b| over every token of every sample (or the masked ones); inf if the layouts differ."""
    if a.keys() != b.keys() or any(len(a[k]) != len(b[k]) for k in a):
        return float("inf")
    diffs = [
        abs(x - y) for k in a for i, (x, y) in enumerate(zip(a[k], b[k], strict=True)) if masks is None or masks[k][i]
    ]
    return max(diffs, default=0.0)


class Report:
    def __init__(self):
        self.failed = 0

    def check(self, ok: bool, what: str) -> None:
        self.failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {what}", flush=True)

    @staticmethod
    def info(what: str) -> None:
        print(f"INFO  {what}", flush=True)


def compare(spec: dict, upstream: dict, runtime: dict, report: Report) -> None:
    for case in spec["cases"]:
        name = case["name"]
        up, rt = upstream["cases"][name]["pure"], runtime["cases"][name]["pure"]
        masks = {str(s["index"]): s["loss_mask"] for s in case["samples"]}
        n_tokens = sum(len(m) for m in masks.values())
        n_trained = sum(sum(m) for m in masks.values())
        zero = all(r == 0.0 for r in list(up["rewards"].values()) + list(rt["rewards"].values()))
        report.check(
            zero and up["rewards"].keys() == rt["rewards"].keys(),
            f"[{name}] rewards handed to the estimator are 0.0 for all {len(up['rewards'])} samples on both sides "
            f"(environment returns {sorted({s['task_reward'] for s in case['samples']})})",
        )
        diff = max_abs_diff(up["teacher"], rt["teacher"])
        report.check(diff <= TOL, f"[{name}] teacher log-probs: max abs diff {diff:.3g}")
        diff = max_abs_diff(up["adv"], rt["adv"])
        largest = max(abs(v) for adv in up["adv"].values() for v in adv)
        report.check(
            diff <= TOL and largest > 0.1,
            f"[{name}] advantages, all {n_tokens} response tokens ({n_trained} trained) of {len(masks)} samples: "
            f"max abs diff {diff:.3g} (max |A| {largest:.3f})",
        )
        diff = max_abs_diff(up["opd_kl"], rt["opd_kl"])
        report.check(diff <= TOL, f"[{name}] OPD reverse KL kept for logging: max abs diff {diff:.3g}")
        control = max_abs_diff(upstream["cases"][name]["task"]["adv"], rt["adv"], masks)
        report.check(
            control > 1e-3,
            f"[{name}] negative control: upstream with a hook returning the environment's return differs from "
            f"this runtime by max abs {control:.3g} on trained tokens (must differ)",
        )
        diff = max_abs_diff(upstream["cases"][name]["task"]["adv"], runtime["cases"][name]["task"]["adv"], masks)
        report.info(
            f"[{name}] both sides with the environment-return hook: max abs diff {diff:.3g} on trained tokens "
            "(upstream trains the raw returns: a custom post-process hook skips its group normalisation; this "
            "runtime's grpo centres (n=1: zeroes) and std-normalises them per group in the trainer)"
        )
        closed = closed_form_advantages(case)
        diff = max_abs_diff(up["adv"], closed)
        report.check(diff <= TOL, f"[{name}] --opd-type sglang: advantages are -opd_kl_coef * (student - teacher), "
                     f"max abs diff {diff:.3g}")
        compare_megatron(case, upstream["cases"][name], closed, masks, report)
        up_w, rt_w = upstream["cases"][name]["pure_whitened"]["adv"], runtime["cases"][name]["pure_whitened"]["adv"]
        report.info(
            f"[{name}] with --normalize-advantages: max abs diff {max_abs_diff(up_w, rt_w, masks):.3g} on trained "
            f"tokens, {max_abs_diff(up_w, rt_w):.3g} on all tokens (upstream: unbiased variance, masked tokens "
            "whitened too; this runtime: population variance, masked tokens 0)"
        )


def closed_form_advantages(case: dict) -> dict[str, list[float]]:
    """Pure OPD's advantage of every response token, ``0 - opd_kl_coef * (student - teacher)``, in float32 as
    upstream's ``apply_opd_kl_to_advantages`` computes it."""
    import torch

    out = {}
    for s in case["samples"]:
        student = s["rollout_log_probs"] if case["use_rollout_logprobs"] else s["recomputed_log_probs"]
        student, teacher = torch.tensor(student), torch.tensor(teacher_response_log_probs(s), dtype=torch.float32)
        out[str(s["index"])] = (torch.zeros_like(student) - case["opd_kl_coef"] * (student - teacher)).tolist()
    return out


def compare_megatron(case: dict, runs: dict, closed: dict, masks: dict, report: Report) -> None:
    """``--opd-type megatron`` trains what ``--opd-type sglang`` trains (and the closed form); its control differs."""
    name = case["name"]
    if "megatron_pure" not in runs:
        report.info(f"[{name}] --opd-type megatron not run: one sample per prompt, GRPO's group std is undefined")
        return
    mp, mt = runs["megatron_pure"], runs["megatron_task"]
    returns = sorted({s["task_reward"] for s in case["samples"]})
    report.check(
        all(r == 0.0 for r in mp["rewards"].values()),
        f"[{name}] --opd-type megatron: upstream's GRPO group normalisation hands 0.0 to the estimator for all "
        f"{len(mp['rewards'])} samples (the agent loop's reward 0.0; environment returns {returns})",
    )
    diff = max(max_abs_diff(mp["adv"], runs["pure"]["adv"]), max_abs_diff(mp["adv"], closed))
    report.check(
        diff <= TOL,
        f"[{name}] --opd-type megatron: the same advantages as --opd-type sglang and the closed form on every "
        f"response token, max abs diff {diff:.3g}",
    )
    diff = max_abs_diff(mp["opd_kl"], runs["pure"]["opd_kl"])
    report.check(diff <= TOL, f"[{name}] --opd-type megatron: OPD reverse KL as with sglang, max abs diff {diff:.3g}")
    control = max_abs_diff(mt["adv"], mp["adv"], masks)
    report.check(
        control > 1e-3,
        f"[{name}] negative control: --opd-type megatron with the environment's return as sample.reward trains "
        f"its group-normalised value, differing by max abs {control:.3g} on trained tokens (must differ)",
    )
