"""Warn when an evaluation set holds tasks of the training set: its scores would not be held-out results.

A task's identity is its row's label (``make_data`` writes the task's JSON id there), or without a label
its metadata minus ``expert_actions`` as JSON (the same task with or without a replayable solution, and
the same text make_data writes as the label), or without either its prompt. Two rows are one task when
their ids or their prompts match: two seeds can deal the same puzzle (3-disk hanoi has a few dozen), and
its first observation is then the same text.
"""

from __future__ import annotations

import json

from slime.launch.task_rows import metadata_of, rows


def task_id(row: dict, args) -> str:
    """make_data's label is ``json.dumps(metadata, sort_keys=True)``, so labelled and bare rows compare."""
    label = row.get(args.label_key or "label")
    if label is not None:
        return label if isinstance(label, str) else json.dumps(label, sort_keys=True, default=str)
    metadata = {k: v for k, v in metadata_of(row, args.metadata_key).items() if k != "expert_actions"}
    if metadata:
        return json.dumps(metadata, sort_keys=True, default=str)
    return json.dumps({"prompt": row.get(args.input_key)}, sort_keys=True, default=str)


def _prompt(row: dict, args) -> str:
    return json.dumps({"prompt": row.get(args.input_key)}, sort_keys=True, default=str)


def overlap_warnings(args) -> list[str]:
    if not args.prompt_data or not args.eval_prompt_data:
        return []
    train_rows = [row for _, row in rows(args.prompt_data)]
    train = {task_id(row, args) for row in train_rows} | {_prompt(row, args) for row in train_rows}
    notes = []
    for name, path in zip(args.eval_prompt_data[0::2], args.eval_prompt_data[1::2]):
        eval_rows = [row for _, row in rows(path)]
        shared = sum(bool({task_id(row, args), _prompt(row, args)} & train) for row in eval_rows)
        if shared:
            notes.append(f"warning: --eval-prompt-data {name} shares {shared} of {len(eval_rows)} tasks with "
                         "--prompt-data: its scores are not on held-out tasks")
    return notes
