"""Write a jsonl file of environment tasks with their expert actions, for every environment here (__init__.py).

    python -m examples.agent_envs.make_data --env gridnav --n 200 --seed 0 --out train.jsonl \\
        [--min-len 4 --max-len 12] [--size 8 --walls 0.2]
    python -m examples.agent_envs.make_data --env hanoi --n 50 --seed 1000 --out eval.jsonl --disks 4

Seeds are tried from ``--seed`` upwards; a task whose expert length falls outside ``[--min-len, --max-len]``
or that an ``--exclude`` file holds (same label or first observation: two seeds can deal one puzzle; make the
eval file with ``--exclude`` the training file) is skipped, so the file holds exactly ``--n`` rows; the last
line printed names the seed range used. Each row::

    {"input": first observation, "label": JSON task id, "metadata": {"env": ..., "seed": ..., params,
     "expert_actions": [...]}}

The metadata alone rebuilds the task (``build_env(sample, args)``); ``expert_actions`` is what TCOD's
B2F prefix replays. The slime PR's example has a gridnav-only writer of the same rows
(``examples.multi_turn_tcod.envs.make_data``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import types
from pathlib import Path

from examples.agent_envs import ENV_MODULES
from examples.agent_envs.task_lengths import length_flags_problem
from slime.utils.misc import heartbeat

# Command-line options forwarded to task_metadata(seed, params) of the chosen environment, with their help.
PARAM_OPTIONS = {
    "size": (int, "grid side length (gridnav, default 5)"),
    "walls": (float, "fraction of wall cells in [0, 0.5) (gridnav, default 0.2)"),
    "min_dist": (int, "shortest optimal path of a layout (gridnav, hanoi)"),
    "max_dist": (int, "longest optimal path of a layout (gridnav, hanoi)"),
    "max_steps": (int, "step limit of an episode (default 2 * optimal + 4)"),
    "shaping": (float, "reward per step closer to the goal (default 0: sparse)"),
    "disks": (int, "number of disks, 1..9 (hanoi, default 3)"),
    "start": (str, "'random' (every disk on a random peg, the default) or 'tower' (hanoi)"),
    "task": (str, "ScienceWorld task name (scienceworld, default find-non-living-thing)"),
    "simplification": (str, "ScienceWorld simplifications, a comma list such as 'easy' (scienceworld)"),
    "rooms": (int, "number of rooms (textworld, default 2)"),
    "objects": (int, "number of objects (textworld, default 3)"),
    "quest_length": (int, "length of the quest (textworld, default 3)"),
}

PROGRESS_EVERY = 5.0  # seconds between progress lines while tasks are made


def task_rows(env: str, n: int, seed: int, params: dict, min_len: int = 1, max_len=None, max_tries=None,
              stats: dict | None = None, exclude=frozenset()):
    """Yield ``n`` data rows of ``env`` tasks whose expert length lies in ``[min_len, max_len]``.

    ``stats["last_seed"]`` is the last seed tried once the rows are out.
    """
    module = importlib.import_module(ENV_MODULES[env])
    max_tries = max_tries or 50 * n + 100
    made, tried = 0, 0
    while made < n:
        if tried >= max_tries:
            raise ValueError(
                f"{env}: only {made} of {n} tasks with expert length in [{min_len}, {max_len}] "
                f"after {tried} seeds; widen --min-len/--max-len or change the task size"
            )
        metadata = module.task_metadata(seed + tried, params)
        tried += 1
        environment = module.build_env(sample=types.SimpleNamespace(metadata=metadata, label=None), args=None)
        try:
            first_observation, _ = environment.reset()
            actions = environment.expert_actions()
        finally:
            environment.close()
        if stats is not None:
            stats["last_seed"] = seed + tried - 1
        if actions is None or not (min_len <= len(actions) <= (max_len or len(actions))):
            continue
        label = json.dumps(metadata, sort_keys=True)
        if {label, json.dumps(first_observation)} & exclude:  # a task of another split
            continue
        # The actions live in metadata: slime's Dataset keeps only the metadata column.
        yield {"input": first_observation, "label": label, "metadata": {**metadata, "expert_actions": actions}}
        made += 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write environment tasks with expert actions as jsonl.")
    parser.add_argument("--env", required=True, choices=sorted(ENV_MODULES), help="the environment of the tasks")
    parser.add_argument("--n", type=int, required=True, help="number of tasks to write")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first task tried")
    parser.add_argument("--out", required=True, help="the jsonl file to write")
    parser.add_argument(
        "--exclude", action="append", default=[], metavar="FILE", help="a jsonl file of tasks to leave out"
    )
    parser.add_argument("--min-len", type=int, default=1, help="shortest expert path kept")
    parser.add_argument("--max-len", type=int, default=None, help="longest expert path kept")
    for name, (kind, text) in PARAM_OPTIONS.items():
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None, help=text)
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be >= 1")
    params = {name: getattr(args, name) for name in PARAM_OPTIONS}
    problem = length_flags_problem(args.env, params, args.min_len, args.max_len)
    if problem:  # refused now, not after thousands of seeds
        parser.error(problem)
    try:
        excluded = [json.loads(line) for path in args.exclude for line in open(path) if line.strip()]
        exclude = {row["label"] for row in excluded} | {json.dumps(row["input"]) for row in excluded}
    except (OSError, ValueError, KeyError) as err:
        parser.error(f"--exclude: not a make_data file ({type(err).__name__}: {err})")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    lengths, stats = [], {}

    def progress() -> str:  # some environments take seconds per task (ScienceWorld: minutes per file)
        if "last_seed" not in stats:
            return f"make_data: {args.env}: loading the environment for the first task"
        return f"make_data: {len(lengths)} of {args.n} {args.env} tasks, seeds {args.seed}..{stats['last_seed']} tried"

    try:
        with open(tmp, "w") as handle, heartbeat(progress, every=PROGRESS_EVERY):
            for row in task_rows(args.env, args.n, args.seed, params, args.min_len, args.max_len, stats=stats,
                                 exclude=exclude):
                handle.write(json.dumps(row) + "\n")
                lengths.append(len(row["metadata"]["expert_actions"]))
    except ValueError as err:  # too few tasks in the lengths asked for: one line, no traceback
        tmp.unlink(missing_ok=True)
        parser.error(str(err))
    tmp.replace(out)  # write then rename: an interrupted run leaves no half file
    print(
        f"wrote {len(lengths)} {args.env} tasks to {out}: expert length min {min(lengths)} "
        f"mean {sum(lengths) / len(lengths):.1f} max {max(lengths)}; seeds {args.seed}..{stats['last_seed']} used",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
