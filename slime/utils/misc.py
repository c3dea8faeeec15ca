"""Small helpers shared across the package."""

from __future__ import annotations

import importlib


def load_function(path: str):
    """Import ``package.module.attr`` by dotted path (slime's plugin mechanism), with a clear error."""
    if not path or "." not in path:
        raise ValueError(f"expected a dotted path 'package.module.name', got {path!r}")
    module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ImportError(f"cannot import module {module_name!r} for plugin {path!r}: {err}") from err
    try:
        return getattr(module, attr)
    except AttributeError:
        raise AttributeError(f"module {module_name!r} has no attribute {attr!r} (plugin {path!r})") from None
