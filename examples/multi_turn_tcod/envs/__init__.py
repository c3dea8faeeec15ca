"""Environments for multi-turn rollouts, chosen per sample by ``sample.metadata["env"]``.

``--rollout-interaction-env-path examples.multi_turn_tcod.envs.make_env`` dispatches on the sample;
each environment's own factory (e.g. ``examples.multi_turn_tcod.envs.gridnav.make_env``) works too.
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
