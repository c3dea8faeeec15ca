"""``examples.multi_turn_tcod.envs.make_data`` for every environment this repository has (see __init__.py)."""

from examples.agent_envs import ENV_MODULES
from examples.multi_turn_tcod.envs.make_data import main

if __name__ == "__main__":
    raise SystemExit(main(modules=ENV_MODULES))
