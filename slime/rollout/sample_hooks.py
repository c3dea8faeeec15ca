"""The current rollout id, kept where upstream slime keeps it (``slime/rollout/sample_hooks.py``).

``RolloutManager.generate`` / ``eval`` call :func:`set_current_rollout_id` before the rollout function
runs, so a generate function (TCOD's agent loop) reads the step with :func:`get_current_rollout_id`
without a rollout-function wrapper. Upstream's module also applies ``--rollout-sample-hook-path``
hooks; this runtime has none.
"""

from __future__ import annotations

_current_rollout_id: int | None = None


def set_current_rollout_id(rollout_id: int | None) -> None:
    global _current_rollout_id
    _current_rollout_id = rollout_id


def get_current_rollout_id() -> int | None:
    return _current_rollout_id
