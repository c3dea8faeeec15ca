"""``examples.multi_turn_tcod.envs.make_data`` for every environment this repository has (see __init__.py)."""

from examples.agent_envs import ENV_MODULES
from examples.multi_turn_tcod.envs import make_data


def main(argv=None) -> int:
    return make_data.main(argv, modules=ENV_MODULES)


if __name__ == "__main__":
    raise SystemExit(main())
