"""The reward of benchmarks/adaptive_kl_slime.py, loaded by slime's own rollout through ``--custom-rm-path``.

Standalone on purpose (no import from this repository): the benchmark copies this file into the run's folder and
puts that folder on the PYTHONPATH of slime's processes, where ``slime`` must stay the slime tree under test.

The answer's vowel share ``v = (vowel characters among the first ANSWER_CHARS characters) / ANSWER_CHARS`` (an
answer that ends early counts its missing characters as non-vowels) scores ``r = 1 - |v - 0.5| / 0.5``: 1 at
half vowels, 0 for an answer of only vowels or of none. The optimum is inside, so no KL coefficient makes a
degenerate answer (all vowels) the best one.
"""

from __future__ import annotations

VOWELS = frozenset("aeiouAEIOU")
ANSWER_CHARS = 8
END_MARKERS = ("<|im_end|>", "<|endoftext|>")


def vowel_count(text: str) -> int:
    for marker in END_MARKERS:
        text = text.split(marker, 1)[0]
    return sum(ch in VOWELS for ch in text[:ANSWER_CHARS])


def reward_of_count(k: int) -> float:
    v = k / ANSWER_CHARS
    return 1.0 - abs(v - 0.5) / 0.5


async def reward(args, sample, **kwargs) -> float:
    return reward_of_count(vowel_count(sample.response))
