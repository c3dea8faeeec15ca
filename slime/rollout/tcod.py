"""TCOD's temporal curriculum (arXiv:2604.24005): how deep into a trajectory the student trains at step n.

Pure functions of the rollout id n, so a resumed run continues the schedule exactly. With
``k_start = 1``, ``eta`` = the official ``checkpoint_steps`` and ``k_max`` = ``max_env_steps`` they
reproduce the official code:

* F2B plays turns 1..k(n) from reset, ``k(n) = min(k_start + n // eta, k_max)``;
* B2F replays ``max(0, L_exp - k(n))`` expert turns, then the student plays to the end.
"""

from __future__ import annotations


def _check(step: int, k_start: int, eta: int, k_max: int) -> None:
    if step < 0:
        raise ValueError(f"TCOD step must be >= 0, got {step}")
    if k_start < 1:
        raise ValueError(f"TCOD k_start must be >= 1, got {k_start}")
    if eta <= 0:
        raise ValueError(f"TCOD eta must be > 0, got {eta}")
    if k_max < k_start:
        raise ValueError(f"TCOD k_max ({k_max}) must be >= k_start ({k_start})")


def curriculum_depth(step: int, k_start: int, eta: int, k_max: int) -> int:
    """Student turns exposed at rollout ``step``: grows by one every ``eta`` steps up to ``k_max``."""
    _check(step, k_start, eta, k_max)
    return min(k_start + step // eta, k_max)


def b2f_prefix_length(step: int, expert_len: int | None, k_start: int, eta: int, k_max: int) -> int:
    """Expert turns to replay before the student plays at ``step`` (0 without expert actions)."""
    depth = curriculum_depth(step, k_start, eta, k_max)
    if not expert_len or expert_len <= 0:
        return 0
    return max(0, expert_len - depth)
