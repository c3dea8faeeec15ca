"""What verify_objective.py runs and how it judges it: the samples (multi-turn-like trajectories, observations
masked, environment returns that vary within a group), a fake teacher answering like SGLang's ``/generate``
score-only requests, and the comparisons of upstream's and this runtime's rewards, teacher log-probs and
advantages, case by case, against each other and against the closed form ``-opd_kl_coef * (s - t)``."""

from __future__ import annotations

import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CASES = (
    # name, n_samples_per_prompt, rollout_batch_size, student log-probs from the rollout, opd_kl_coef
    ("grpo_n1_rollout_logprobs", 1, 4, True, 1.0),
    ("grpo_n2_rollout_logprobs", 2, 3, True, 1.0),  # the GPU e2e test's --n-samples-per-prompt
    ("grpo_n4_rollout_logprobs", 4, 2, True, 1.0),
    ("grpo_n1_recomputed", 1, 4, False, 0.5),
    ("grpo_n2_recomputed", 2, 3, False, 0.5),
    ("grpo_n4_recomputed", 4, 2, False, 0.5),
)
TASK_REWARDS = (1.0, 0.0, 0.5, -0.5, 2.0, 0.25, 1.0, -1.0)


# ---------------------------------------------------------------------------- samples and the teacher
def teacher_log_prob(token: int, position: int) -> float:
    """The fake teacher's log-prob of ``token`` at ``position`` (deterministic, in [-4.01, -0.01])."""
    return -0.01 - ((token * 2654435761 + position * 40503) % 1000) / 250.0


def teacher_response_log_probs(sample: dict) -> list[float]:
    """The fake teacher's log-probs of ``sample``'s response tokens: what the SGLang teacher returns for them
    (upstream's OPD hook keeps the last ``response_length`` input log-probs) and what a Megatron teacher's
    forward stores as ``teacher_log_probs``."""
    tokens, n = sample["tokens"], sample["response_length"]
    return [teacher_log_prob(tokens[p], p) for p in range(len(tokens) - n, len(tokens))]


def build_samples(n_samples_per_prompt: int, rollout_batch_size: int, seed: int) -> list[dict]:
    """Multi-turn-like samples: student turns (mask 1) with observations between them (mask 0)."""
    rng = random.Random(seed)
    samples = []
    for group in range(rollout_batch_size):
        prompt = [rng.randrange(10, 1000) for _ in range(rng.randint(3, 6))]
        for _ in range(n_samples_per_prompt):
            index = len(samples)
            response, mask, rollout_lp, recomputed_lp = [], [], [], []
            turns = 1 + index % 3
            for turn in range(turns):
                if turn:  # an observation: not sampled by the student, log-prob 0.0 as agent loops record it
                    n_obs = rng.randint(1, 4)
                    response += [rng.randrange(10, 1000) for _ in range(n_obs)]
                    mask += [0] * n_obs
                    rollout_lp += [0.0] * n_obs
                    recomputed_lp += [-rng.uniform(0.01, 6.0) for _ in range(n_obs)]
                n_act = rng.randint(2, 7)
                response += [rng.randrange(10, 1000) for _ in range(n_act)]
                mask += [1] * n_act
                lps = [-rng.uniform(0.01, 3.0) for _ in range(n_act)]
                rollout_lp += lps
                recomputed_lp += [lp + rng.uniform(-0.05, 0.05) for lp in lps]
            samples.append({
                "index": index, "group_index": group, "prompt": f"prompt {group}", "response": f"response {index}",
                "tokens": prompt + response, "response_length": len(response), "loss_mask": mask,
                "rollout_log_probs": rollout_lp, "recomputed_log_probs": recomputed_lp,
                "task_reward": TASK_REWARDS[index % len(TASK_REWARDS)], "truncated": index % 5 == 4,
            })
    return samples


def build_spec(seed: int = 0) -> list[dict]:
    return [{"name": name, "n_samples_per_prompt": n, "rollout_batch_size": batch, "use_rollout_logprobs": rollout_lp,
             "opd_kl_coef": coef, "samples": build_samples(n, batch, seed + i)}
            for i, (name, n, batch, rollout_lp, coef) in enumerate(CASES)]


class TeacherServer:
    """A local stand-in for the teacher's SGLang ``/generate``: score-only replies, requests recorded."""

    def __init__(self):
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(payload)
                ids = payload["input_ids"]
                entries = [[None if i == 0 else teacher_log_prob(t, i), t, None] for i, t in enumerate(ids)]
                meta = {"id": str(len(server.requests)), "prompt_tokens": len(ids), "completion_tokens": 0,
                        "finish_reason": {"type": "length", "length": 0}, "input_token_logprobs": entries,
                        "output_token_logprobs": []}
                body = json.dumps({"text": "", "meta_info": meta}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/generate"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._httpd.shutdown()
        self._httpd.server_close()


# ---------------------------------------------------------------------------- comparison
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
    """One PASS / FAIL line per check, counting the failures; INFO lines are not checked."""

    failed = 0

    def check(self, ok: bool, what: str) -> None:
        self.failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {what}", flush=True)

    def info(self, what: str) -> None:
        print(f"INFO  {what}", flush=True)


def compare(spec: dict, upstream: dict, runtime: dict, report: Report) -> None:
    for case in spec["cases"]:
        name = case["name"]
        up, rt = upstream["cases"][name]["pure"], runtime["cases"][name]["pure"]
        masks = {str(s["index"]): s["loss_mask"] for s in case["samples"]}
        n_tokens = sum(len(m) for m in masks.values())
        n_trained = sum(sum(m) for m in masks.values())
        zero = all(r == 0.0 for r in list(up["rewards"].values()) + list(rt["rewards"].values()))
        report.check(zero and up["rewards"].keys() == rt["rewards"].keys(),
                     f"[{name}] rewards handed to the estimator are 0.0 for all {len(up['rewards'])} samples on "
                     f"both sides (environment returns {sorted({s['task_reward'] for s in case['samples']})})")
        diff = max_abs_diff(up["teacher"], rt["teacher"])
        report.check(diff <= TOL, f"[{name}] teacher log-probs: max abs diff {diff:.3g}")
        diff = max_abs_diff(up["adv"], rt["adv"])
        largest = max(abs(v) for adv in up["adv"].values() for v in adv)
        report.check(diff <= TOL and largest > 0.1,
                     f"[{name}] advantages, all {n_tokens} response tokens ({n_trained} trained) of {len(masks)} "
                     f"samples: max abs diff {diff:.3g} (max |A| {largest:.3f})")
        diff = max_abs_diff(up["opd_kl"], rt["opd_kl"])
        report.check(diff <= TOL, f"[{name}] OPD reverse KL kept for logging: max abs diff {diff:.3g}")
        control = max_abs_diff(upstream["cases"][name]["task"]["adv"], rt["adv"], masks)
        report.check(control > 1e-3,
                     f"[{name}] negative control: upstream with a hook returning the environment's return differs "
                     f"from this runtime by max abs {control:.3g} on trained tokens (must differ)")
        diff = max_abs_diff(upstream["cases"][name]["task"]["adv"], runtime["cases"][name]["task"]["adv"], masks)
        report.info(f"[{name}] both sides with the environment-return hook: max abs diff {diff:.3g} on trained tokens "
                    "(upstream trains the raw returns: a custom post-process hook skips its group normalisation; this "
                    "runtime's grpo centres (n=1: zeroes) and std-normalises them per group in the trainer)")
        closed = closed_form_advantages(case)
        diff = max_abs_diff(up["adv"], closed)
        report.check(diff <= TOL, f"[{name}] --opd-type sglang: advantages are -opd_kl_coef * (student - teacher), "
                     f"max abs diff {diff:.3g}")
        compare_megatron(case, upstream["cases"][name], closed, masks, report)
        up_w, rt_w = upstream["cases"][name]["pure_whitened"]["adv"], runtime["cases"][name]["pure_whitened"]["adv"]
        report.info(f"[{name}] with --normalize-advantages: max abs diff {max_abs_diff(up_w, rt_w, masks):.3g} on "
                    f"trained tokens, {max_abs_diff(up_w, rt_w):.3g} on all tokens (upstream: unbiased variance, "
                    "masked tokens whitened too; this runtime: population variance, masked tokens 0)")


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
    report.check(all(r == 0.0 for r in mp["rewards"].values()),
                 f"[{name}] --opd-type megatron: upstream's GRPO group normalisation hands 0.0 to the estimator for "
                 f"all {len(mp['rewards'])} samples (the agent loop's reward 0.0; environment returns {returns})")
    diff = max(max_abs_diff(mp["adv"], runs["pure"]["adv"]), max_abs_diff(mp["adv"], closed))
    report.check(diff <= TOL,
                 f"[{name}] --opd-type megatron: the same advantages as --opd-type sglang and the closed form on every "
                 f"response token, max abs diff {diff:.3g}")
    diff = max_abs_diff(mp["opd_kl"], runs["pure"]["opd_kl"])
    report.check(diff <= TOL, f"[{name}] --opd-type megatron: OPD reverse KL as with sglang, max abs diff {diff:.3g}")
    control = max_abs_diff(mt["adv"], mp["adv"], masks)
    report.check(control > 1e-3,
                 f"[{name}] negative control: --opd-type megatron with the environment's return as "
                 f"sample.reward trains its group-normalised value, differing by max abs {control:.3g} on trained "
                 "tokens (must differ)")
