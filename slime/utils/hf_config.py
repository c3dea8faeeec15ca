"""A HF model folder's ``config.json``, read where the folder is on this machine.

The pre-flight checks, the ``--dry-run`` plan, the resume checks and the engines' discovery all compare a
model's shape or vocabulary with something else; they read the config through here, so "not on this
machine" (a plan printed on a laptop for a cluster's paths) is one answer everywhere: None.
"""

from __future__ import annotations

import json
import os


def read_config(path: str | None) -> dict | None:
    """``config.json`` of a HF folder, or a config JSON file; None when not on this machine."""
    if not path:
        return None
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        return None
    with open(file) as fh:
        return json.load(fh)


def config_field(folder: str | None, key: str) -> int | None:
    """An integer field of a HF folder's config.json (or of its ``text_config``), when the folder is readable here."""
    if not folder or not os.path.isfile(os.path.join(folder, "config.json")):
        return None
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    value = config.get(key, (config.get("text_config") or {}).get(key))
    return int(value) if value is not None else None
