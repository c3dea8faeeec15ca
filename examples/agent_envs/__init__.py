"""This repository's further environment adapters (not part of the slime PR): TextWorld, ALFWorld, WebShop.

``--rollout-interaction-env-path examples.agent_envs`` (or ``examples.agent_envs.make_env``) serves these and
the example's own (gridnav, hanoi, scienceworld) through the same contract as ``examples.multi_turn_tcod.envs``.
``python -m examples.agent_envs.make_data`` writes their task files. See README.md here.
"""

from examples.multi_turn_tcod import envs as _example_envs

ENV_MODULES = {
    **_example_envs.ENV_MODULES,
    "scienceworld": "examples.agent_envs.scienceworld_env",
    "hanoi": "examples.agent_envs.hanoi",
    "textworld": "examples.agent_envs.textworld_env",
    "alfworld": "examples.agent_envs.alfworld_env",
    "webshop": "examples.agent_envs.webshop_env",
}


def env_module(name: str):
    return _example_envs.env_module(name, ENV_MODULES)


def make_env(args, sample):
    return _example_envs.make_env(args, sample, ENV_MODULES)


def build_env(sample=None, args=None):
    return _example_envs.SlimeInteractionEnv(make_env(args, sample))
