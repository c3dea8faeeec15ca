"""Warn when an evaluation set holds tasks of the training set: its scores would not be held-out results.

A task's identity is its row's label (``make_data`` writes the task's JSON id there), or without a label
its metadata minus ``expert_actions`` as JSON (the same task with or without a replayable solution, and
the same text make_data writes as the label), or without either its prompt.
"""

from __future__ import annotations

import json

from slime.utils.task_rows import metadata_of, rows


def task_id(row: dict, args) -> str:
    """make_data's label is ``json.dumps(metadata, sort_keys=True)``, so labelled and bare rows compare."""
    label = row.get(args.label_key or "label")
    if label is not None:
        return label if isinstance(label, str) else json.dumps(label, sort_keys=True, default=str)
    metadata = {k: v for k, v in metadata_of(row, args.metadata_key).items() if k != "expert_actions"}
    if metadata:
        return json.dumps(metadata, sort_keys=True, default=str)
    return json.dumps({"prompt": row.get(args.input_key)}, sort_keys=True, default=str)


def overlap_warnings(args) -> list[str]:
    if not args.prompt_data or not args.eval_prompt_data:
        return []
    train = {task_id(row, args) for _, row in rows(args.prompt_data)}
    notes = []
    for name, path in zip(args.eval_prompt_data[0::2], args.eval_prompt_data[1::2]):
        ids = [task_id(row, args) for _, row in rows(path)]
        shared = sum(i in train for i in ids)
        if shared:
            notes.append(f"warning: --eval-prompt-data {name} shares {shared} of {len(ids)} tasks with "
                         "--prompt-data: its scores are not on held-out tasks")
    return notes
