"""Write a jsonl file of environment tasks with their expert actions.

    python -m examples.multi_turn_tcod.envs.make_data --env gridnav --n 200 --seed 0 --out train.jsonl \\
        [--min-len 4 --max-len 12] [--size 8 --walls 0.2] [--disks 4 --start tower] [--task NAME]

Task number i uses seed ``--seed + i`` (for ScienceWorld the seed is the variation index). Tasks whose
expert path length falls outside ``[--min-len, --max-len]`` are skipped, so the file holds exactly
``--n`` rows within the horizon asked for. Each row::

    {"input": first observation, "label": JSON task id, "metadata": {"env": ..., "seed": ..., params},
     "expert_actions": [...]}

The metadata alone rebuilds the task (``make_env(args, sample)``); ``expert_actions`` is the dataset
field TCOD's B2F prefix replays (``slime.utils.data.Dataset`` moves it into ``Sample.metadata``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import ENV_MODULES, env_module

# Command-line options forwarded to task_metadata(seed, params) of the chosen environment.
PARAM_OPTIONS = {
    "size": int,
    "walls": float,
    "disks": int,
    "start": str,
    "min_dist": int,
    "max_dist": int,
    "max_steps": int,
    "shaping": float,
    "task": str,
    "simplification": str,
    "rooms": int,
    "objects": int,
    "quest_length": int,
}


def task_rows(
    env: str,
    n: int,
    seed: int,
    params: dict,
    min_len: int = 1,
    max_len=None,
    max_tries=None,
    modules: dict = ENV_MODULES,
):
    """Yield ``n`` data rows of ``env`` tasks whose expert length lies in ``[min_len, max_len]``."""
    module = env_module(env, modules)
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
        environment = module.make_env(None, {"metadata": metadata})
        try:
            first_observation = environment.reset()
            actions = environment.expert_actions()
        finally:
            environment.close()
        if actions is None or not (min_len <= len(actions) <= (max_len or len(actions))):
            continue
        label = json.dumps(metadata, sort_keys=True)
        # The actions go into metadata too: upstream slime's Dataset keeps only the metadata column.
        yield {
            "input": first_observation,
            "label": label,
            "metadata": {**metadata, "expert_actions": actions},
            "expert_actions": actions,
        }
        made += 1


def main(argv=None, modules: dict = ENV_MODULES) -> int:
    parser = argparse.ArgumentParser(description="Write environment tasks with expert actions as jsonl.")
    parser.add_argument("--env", required=True, choices=sorted(modules))
    parser.add_argument("--n", type=int, required=True, help="number of tasks to write")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first task")
    parser.add_argument("--out", required=True)
    parser.add_argument("--min-len", type=int, default=1, help="shortest expert path kept")
    parser.add_argument("--max-len", type=int, default=None, help="longest expert path kept")
    for name, kind in PARAM_OPTIONS.items():
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None)
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be >= 1")
    params = {name: getattr(args, name) for name in PARAM_OPTIONS}

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    lengths = []
    with open(tmp, "w") as handle:
        for row in task_rows(args.env, args.n, args.seed, params, args.min_len, args.max_len, modules=modules):
            handle.write(json.dumps(row) + "\n")
            lengths.append(len(row["expert_actions"]))
    tmp.replace(out)  # write then rename: an interrupted run leaves no half file
    print(
        f"wrote {len(lengths)} {args.env} tasks to {out}: expert length min {min(lengths)} "
        f"mean {sum(lengths) / len(lengths):.1f} max {max(lengths)}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
