"""Write a jsonl file of gridnav tasks with their expert actions.

    python -m examples.multi_turn_tcod.envs.make_data --n 200 --seed 0 --out train.jsonl \\
        [--min-len 4 --max-len 12] [--size 8 --walls 0.2]

Seeds are tried from ``--seed`` upwards; a task whose expert length falls outside ``[--min-len, --max-len]``
or that an ``--exclude`` file holds (same label or first observation: two seeds can deal one puzzle; make the
eval file with ``--exclude`` the training file) is skipped, so the file holds exactly ``--n`` rows. Each row::

    {"input": first observation, "label": JSON task id, "metadata": {"env": "gridnav", "seed": ..., params,
     "expert_actions": [...]}}

The metadata alone rebuilds the task (``build_env(sample, args)``); ``expert_actions`` is what B2F replays.
"""

import argparse
import json
import sys
from pathlib import Path

from examples.multi_turn_tcod.envs.gridnav import GridNavEnv, task_metadata

PARAMS = {"size": int, "walls": float, "min_dist": int, "max_dist": int, "max_steps": int, "shaping": float}


def task_rows(n: int, seed: int, params: dict, min_len: int = 1, max_len=None, exclude=frozenset()):
    """Yield ``n`` data rows of gridnav tasks whose expert length lies in ``[min_len, max_len]``."""
    made = 0
    for tried in range(50 * n + 100):
        metadata = task_metadata(seed + tried, params)
        env = GridNavEnv(metadata)
        first_observation, _ = env.reset()
        label = json.dumps(metadata, sort_keys=True)
        fits = min_len <= len(env.expert) <= (max_len or len(env.expert))
        if fits and not {label, json.dumps(first_observation)} & exclude:
            # The actions live in metadata: slime's Dataset keeps only the metadata column.
            yield {"input": first_observation, "label": label, "metadata": {**metadata, "expert_actions": env.expert}}
            made += 1
            if made == n:
                return
    raise ValueError(f"gridnav: only {made} of {n} tasks with expert length in [{min_len}, {max_len}]; widen them")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write gridnav tasks with expert actions as jsonl.")
    parser.add_argument("--n", type=int, required=True, help="number of tasks to write")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first task tried")
    parser.add_argument("--out", required=True, help="the jsonl file to write")
    parser.add_argument("--exclude", action="append", default=[], metavar="FILE", help="a jsonl file of tasks to skip")
    parser.add_argument("--min-len", type=int, default=1, help="shortest expert path kept")
    parser.add_argument("--max-len", type=int, default=None, help="longest expert path kept")
    for name, kind in PARAMS.items():  # the task metadata keys of envs/gridnav.py
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None)
    args = parser.parse_args(argv)
    if args.min_len < 1 or (args.max_len is not None and args.max_len < args.min_len):
        parser.error(f"--min-len {args.min_len} and --max-len {args.max_len} keep no task (1 <= min <= max)")
    excluded = [json.loads(line) for path in args.exclude for line in open(path) if line.strip()]
    exclude = {row["label"] for row in excluded} | {json.dumps(row["input"]) for row in excluded}
    try:
        rows = list(
            task_rows(args.n, args.seed, {k: getattr(args, k) for k in PARAMS}, args.min_len, args.max_len, exclude)
        )
    except ValueError as err:  # too few tasks of those lengths for this grid
        parser.error(str(err))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} gridnav tasks to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
