"""Rollout data for ``--load-debug-rollout-data``, written with slime's own Sample class (SLIME_DIR on the path), in
the format its save_debug_rollout_data writes: ``{"rollout_id": i, "samples": [Sample.to_dict(), ...]}``.

    python -m slime_cpu_shims.rollout_data HF_CKPT PATH_TEMPLATE NUM_ROLLOUTS PROMPTS SAMPLES_PER_PROMPT SEED

Prompts are gridnav-like chat turns through the checkpoint's chat template; responses are tokens drawn at random with
a fixed seed; rewards differ inside every group, so GRPO's advantages are non-zero.
"""

from __future__ import annotations

import random
import sys

import torch
from transformers import AutoTokenizer

from slime.utils.types import Sample


def main() -> None:
    ckpt, template, num_rollouts, prompts, per_prompt, seed = sys.argv[1:]
    tok = AutoTokenizer.from_pretrained(ckpt)
    rng = random.Random(int(seed))
    vocab = [i for i in range(len(tok)) if i not in tok.all_special_ids]
    for rollout_id in range(int(num_rollouts)):
        samples = []
        for p in range(int(prompts)):
            messages = [{"role": "user", "content": f"grid 3x3, you at ({p % 3},{rollout_id % 3}); goal (2,2). move?"}]
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            prompt_ids = tok(text, add_special_tokens=False)["input_ids"]
            assert all(isinstance(i, int) for i in prompt_ids), prompt_ids
            for k in range(int(per_prompt)):
                n = rng.randint(6, 12)
                response = [rng.choice(vocab) for _ in range(n - 1)] + [tok.eos_token_id]
                sample = Sample(
                    group_index=p,
                    index=p * int(per_prompt) + k,
                    prompt=messages,
                    tokens=list(prompt_ids) + response,
                    response=tok.decode(response),
                    response_length=n,
                    label="right",
                    reward=float(k % 2) + 0.1 * rng.random(),
                    loss_mask=[1] * n,
                    rollout_log_probs=[-rng.uniform(3.0, 6.0) for _ in range(n)],
                    status=Sample.Status.COMPLETED,
                )
                samples.append(sample.to_dict())
        torch.save({"rollout_id": rollout_id, "samples": samples}, template.format(rollout_id=rollout_id))


if __name__ == "__main__":
    main()
