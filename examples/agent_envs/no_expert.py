"""The built-in environments with their expert paths hidden: ``make_env`` without ``expert_actions()``.

For trying B2F where no gold path exists (``--tcod-prefix-source teacher``): with this factory and task
files made without the ``expert_actions`` field the rollout cannot see an expert path at all, so
``--tcod-prefix-source expert`` falls back to vanilla OPD on every task (``tcod/prefix_fallback``).
"""

from __future__ import annotations

from examples.agent_envs import make_env as make_builtin_env


class _WithoutExpert:
    """Forwards the contract's methods only; ``expert_actions`` is deliberately not one of them."""

    def __init__(self, env):
        self._env = env

    def reset(self):
        return self._env.reset()

    def step(self, action):
        return self._env.step(action)

    def close(self):
        return self._env.close()


def make_env(args, sample):
    return _WithoutExpert(make_builtin_env(args, sample))
