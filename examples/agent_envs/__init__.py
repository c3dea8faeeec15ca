"""This repository's environments (not part of the slime PR): gridnav, hanoi, ScienceWorld, TextWorld, ALFWorld,
WebShop, all in upstream slime's ``build_env(sample, args)`` contract.

``--rollout-interaction-env-path examples.agent_envs`` picks each sample's environment by
``sample.metadata["env"]``; each environment's module can be named directly too (e.g.
``examples.agent_envs.hanoi``). ``python -m examples.agent_envs.make_data`` writes their task files. See
README.md here.
"""

import importlib
import types

from examples.agent_envs.puzzle import sample_metadata

ENV_MODULES = {
    "gridnav": "examples.multi_turn_tcod.envs.gridnav",
    "hanoi": "examples.agent_envs.hanoi",
    "scienceworld": "examples.agent_envs.scienceworld_env",
    "textworld": "examples.agent_envs.textworld_env",
    "alfworld": "examples.agent_envs.alfworld_env",
    "webshop": "examples.agent_envs.webshop_env",
}


def env_module(name: str):
    """The module of environment ``name`` (imported on first use: the game engines are optional installs)."""
    if name not in ENV_MODULES:
        raise ValueError(
            f"unknown environment {name!r} in the task metadata; known environments: {sorted(ENV_MODULES)}"
        )
    return importlib.import_module(ENV_MODULES[name])


def build_env(sample=None, args=None):
    """Upstream's environment hook: the environment that ``sample.metadata["env"]`` names, built by its module."""
    metadata = sample_metadata(sample)
    name = metadata.get("env")
    if not name:
        raise ValueError(
            f"the task metadata has no 'env' naming its environment (one of {sorted(ENV_MODULES)}); got {metadata}"
        )
    # The environments read the task from sample.metadata; here it may also come from a JSON label or a data row.
    view = types.SimpleNamespace(**(sample if isinstance(sample, dict) else vars(sample)))
    view.metadata = metadata
    return env_module(name).build_env(sample=view, args=args)
