"""Environments for multi-turn rollouts, chosen per sample by ``sample.metadata["env"]``.

Two ways to name them with ``--rollout-interaction-env-path``:

* ``examples.multi_turn_tcod.envs`` -- this module, through upstream slime's contract: it exposes
  ``build_env(sample, args)`` and the env it returns has ``reset()``, ``step(text) -> (observation,
  done, info)`` (the step reward in ``info["reward"]``), ``format_observation`` and ``close()``, like
  upstream's ``examples/geo3k_vlm_multi_turn`` environments;
* ``examples.multi_turn_tcod.envs.make_env`` -- the factory ``make_env(args, sample)`` whose env returns
  ``(observation, reward, done, info)``; each environment's own factory (e.g.
  ``examples.multi_turn_tcod.envs.gridnav.make_env``) works too.

Both dispatch on the sample's task.
Modules are imported only when a sample asks for them, so the built-in puzzles need neither Java nor
TextWorld installed.
"""

from __future__ import annotations

import importlib

from .common import sample_metadata

# env name -> module (relative to this package) holding make_env(args, sample) and task_metadata(...)
ENV_MODULES = {
    "gridnav": "gridnav",
    "hanoi": "hanoi",
    "scienceworld": "scienceworld_env",
    "textworld": "textworld_env",
    "alfworld": "alfworld_env",
    "webshop": "webshop_env",
}
BUILTIN_ENVS = ("gridnav", "hanoi")


def env_module(name: str):
    if name not in ENV_MODULES:
        raise ValueError(f"unknown environment {name!r} in sample metadata 'env'; known: {sorted(ENV_MODULES)}")
    return importlib.import_module(f"{__name__}.{ENV_MODULES[name]}")


def make_env(args, sample):
    """Build the environment named by ``sample.metadata["env"]`` for this sample's task."""
    metadata = sample_metadata(sample)
    if "env" not in metadata:
        raise ValueError(f"sample metadata has no 'env' field naming the environment (got {metadata}); "
                         f"known: {sorted(ENV_MODULES)}")
    return env_module(metadata["env"]).make_env(args, sample)


class SlimeInteractionEnv:
    """One of these environments behind upstream slime's ``BaseInteractionEnv`` methods."""

    def __init__(self, env):
        self.env = env

    def reset(self):
        return self.env.reset(), {}

    def step(self, response_text: str):
        observation, reward, done, info = self.env.step(response_text)
        info = dict(info or {})
        info["reward"] = reward
        return observation, done, info

    def format_observation(self, observation) -> dict:
        return {"role": "user", "content": observation}

    def expert_actions(self):
        fn = getattr(self.env, "expert_actions", None)
        return fn() if callable(fn) else None

    def close(self) -> None:
        self.env.close()


def build_env(sample=None, args=None):
    """Upstream slime's environment hook (``build_env(sample, args)``, keywords or positional)."""
    return SlimeInteractionEnv(make_env(args, sample))
