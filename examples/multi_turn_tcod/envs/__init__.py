"""Text environments for the multi-turn TCOD example, chosen per sample by ``sample.metadata["env"]``.

``rollout_interaction_env_path: examples.multi_turn_tcod.envs`` names this module: it exposes
upstream's ``build_env(sample, args)``, and the env it returns has ``reset()``, ``step(text) ->
(observation, done, info)`` (the step reward in ``info["reward"]``, ``info["success"]``),
``format_observation``, ``close()`` and ``expert_actions()`` (the gold path, for B2F). Each environment
module holds ``make_env(args, sample)`` (``step`` returns ``(observation, reward, done, info)``) and
``task_metadata(seed, params)``; modules are imported only when a sample asks for them.
"""

import importlib

from .common import sample_metadata

# env name -> module holding make_env(args, sample) and task_metadata(seed, params)
ENV_MODULES = {
    "gridnav": "examples.multi_turn_tcod.envs.gridnav",
}


def env_module(name: str, modules: dict = ENV_MODULES):
    if name not in modules:
        raise ValueError(f"unknown environment {name!r} in sample metadata 'env'; known: {sorted(modules)}")
    return importlib.import_module(modules[name])


def make_env(args, sample, modules: dict = ENV_MODULES):
    """Build the environment named by ``sample.metadata["env"]`` for this sample's task."""
    metadata = sample_metadata(sample)
    if "env" not in metadata:
        raise ValueError(f"sample metadata has no 'env' field naming the environment; known: {sorted(modules)}")
    return env_module(metadata["env"], modules).make_env(args, sample)


class SlimeInteractionEnv:
    """One of these environments behind upstream's ``BaseInteractionEnv`` methods."""

    def __init__(self, env):
        self.env = env

    def reset(self):
        return self.env.reset(), {}

    def step(self, response_text: str):
        observation, reward, done, info = self.env.step(response_text)
        return observation, done, {**(info or {}), "reward": reward}

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
