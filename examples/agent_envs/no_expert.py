"""The environments of ``examples.agent_envs`` with their expert paths hidden: no ``expert_actions()``.

For trying B2F where no gold path exists (``--tcod-prefix-source teacher``): with this module as the env
path and task files made without the ``expert_actions`` field the rollout cannot see an expert path at
all, so ``--tcod-prefix-source expert`` falls back to vanilla OPD on every task (``tcod/prefix_fallback``).
"""

from __future__ import annotations

from examples.agent_envs import build_env as build_any_env


class _WithoutExpert:
    """Forwards the contract's methods only; ``expert_actions`` is deliberately not one of them."""

    def __init__(self, env):
        self._env = env

    def reset(self):
        return self._env.reset()

    def step(self, response_text):
        return self._env.step(response_text)

    def format_observation(self, observation):
        return self._env.format_observation(observation)

    def close(self):
        return self._env.close()


def build_env(sample=None, args=None):
    """Upstream's environment hook: ``rollout_interaction_env_path: examples.agent_envs.no_expert``."""
    return _WithoutExpert(build_any_env(sample=sample, args=args))
