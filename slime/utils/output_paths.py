"""The folders a run writes (``--save``, ``--metrics-dir``) can be created, checked without creating them.

Otherwise the first write fails after Ray, the engines and the trainer are up, with a bare
``NotADirectoryError`` traceback. ``--dry-run`` creates nothing, so the check walks up to the nearest
existing ancestor: it must be a writable folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from slime.utils.argument_error import ArgumentError

OUTPUT_FLAGS = (("save", "--save"), ("metrics_dir", "--metrics-dir"))


def creation_problem(path: Path) -> str | None:
    """Why the folder ``path`` cannot exist or be created, or None."""
    path = path.absolute()
    if path.exists():
        if not path.is_dir():
            return "it exists and is not a folder"
        return None if os.access(path, os.W_OK | os.X_OK) else "the folder is not writable"
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is a file, not a folder"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{ancestor} is not writable"
    return None


def check_output_dirs(args) -> None:
    for name, flag in OUTPUT_FLAGS:
        value = getattr(args, name, None)
        if value:
            problem = creation_problem(Path(value))
            if problem:
                raise ArgumentError(f"{flag} {value}: cannot create that folder: {problem}")
