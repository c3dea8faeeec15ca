"""``examples.multi_turn_tcod.envs.make_data`` for every environment this repository has (see __init__.py).

    python -m examples.agent_envs.make_data --env hanoi --n 50 --seed 1000 --out eval.jsonl --disks 4
"""

import functools

from examples.agent_envs import ENV_MODULES
from examples.multi_turn_tcod.envs import make_data

# Task parameters of this repository's environments, on top of gridnav's (name -> (type, help)).
PARAM_OPTIONS = {
    **make_data.PARAM_OPTIONS,
    "disks": (int, "number of disks, 1..9 (hanoi, default 3)"),
    "start": (str, "'random' (every disk on a random peg, the default) or 'tower' (hanoi)"),
    "task": (str, "ScienceWorld task name (scienceworld, default find-non-living-thing)"),
    "simplification": (str, "ScienceWorld simplifications, a comma list such as 'easy' (scienceworld)"),
    "rooms": (int, "number of rooms (textworld, default 2)"),
    "objects": (int, "number of objects (textworld, default 3)"),
    "quest_length": (int, "length of the quest (textworld, default 3)"),
}
# The generator's rows over every environment here (benchmarks build their tasks in-process with it).
task_rows = functools.partial(make_data.task_rows, modules=ENV_MODULES)


def main(argv=None) -> int:
    return make_data.main(argv, modules=ENV_MODULES, options=PARAM_OPTIONS)


if __name__ == "__main__":
    raise SystemExit(main())
