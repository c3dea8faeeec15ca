"""``run_config.json``: the flags a checkpoint's run was started with, written into every checkpoint.

A resume compares them with its own (``slime.checkpoint.resume``), so a ``--load`` that would change what
the run means is refused before Ray starts.
"""

from __future__ import annotations

import json

from slime.utils.hf_config import read_config

RUN_CONFIG = "run_config.json"
FORMAT = 1


def run_config(args) -> dict:
    """What ``run_config.json`` records: every flag that JSON can hold, and the starting model's config."""
    flags = {}
    for name, value in vars(args).items():
        if name.startswith("_"):  # the runtime's memos (the verified resume folder ...), not flags
            continue
        try:
            flags[name] = json.loads(json.dumps(value))
        except (TypeError, ValueError):
            continue  # objects the runtime attached (engine limits ...): not flags
    return {"format": FORMAT, "args": flags, "model_config": read_config(args.hf_checkpoint)}
