"""The samples and the fake teacher of ``verify_objective.py``: multi-turn-like trajectories (observations
masked, environment returns that vary within a group) and an HTTP server answering like SGLang's
``/generate`` score-only requests."""

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
            samples.append(
                {
                    "index": index,
                    "group_index": group,
                    "prompt": f"prompt {group}",
                    "response": f"response {index}",
                    "tokens": prompt + response,
                    "response_length": len(response),
                    "loss_mask": mask,
                    "rollout_log_probs": rollout_lp,
                    "recomputed_log_probs": recomputed_lp,
                    "task_reward": TASK_REWARDS[index % len(TASK_REWARDS)],
                    "truncated": index % 5 == 4,
                }
            )
    return samples


def build_spec(seed: int = 0) -> list[dict]:
    cases = []
    for i, (name, n, batch, rollout_lp, coef) in enumerate(CASES):
        samples = build_samples(n, batch, seed + i)
        cases.append(
            {
                "name": name,
                "n_samples_per_prompt": n,
                "rollout_batch_size": batch,
                "use_rollout_logprobs": rollout_lp,
                "opd_kl_coef": coef,
                "samples": samples,
            }
        )
    return cases


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
                body = json.dumps(
                    {
                        "text": "",
                        "meta_info": {
                            "id": str(len(server.requests)),
                            "prompt_tokens": len(ids),
                            "completion_tokens": 0,
                            "finish_reason": {"type": "length", "length": 0},
                            "input_token_logprobs": entries,
                            "output_token_logprobs": [],
                        },
                    }
                ).encode()
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
