"""The raw rows of a prompt file with their row numbers, read once for the row-level launch checks.

``Dataset`` keeps neither the row numbers nor a label that ``--label-key`` does not name, which the
environment and overlap checks need. The files were validated by ``Dataset`` before these checks run.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from slime.utils.data import _read_rows


@functools.lru_cache(maxsize=8)
def _rows(path: str, mtime_ns: int) -> tuple:
    return tuple(_read_rows(Path(path)))


def rows(path: str) -> tuple:
    """((row number, row dict), ...): 1-based line numbers for jsonl, row numbers for parquet."""
    return _rows(str(Path(path).absolute()), os.stat(path).st_mtime_ns)


def metadata_of(row: dict, metadata_key: str) -> dict:
    metadata = row.get(metadata_key)
    return metadata if isinstance(metadata, dict) else {}
