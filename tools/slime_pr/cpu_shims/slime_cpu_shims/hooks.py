"""Run a function right after a module is first imported (a meta-path finder that wraps the real loader)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable

_PENDING: dict[str, list[Callable]] = {}


class _Loader(importlib.abc.Loader):
    def __init__(self, real):
        self.real = real

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module):
        self.real.exec_module(module)
        for fn in _PENDING.pop(module.__name__, []):
            fn(module)

    def __getattr__(self, name):  # get_source, is_package, ... as the real loader answers them
        return getattr(self.real, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _PENDING:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


_FINDER = _Finder()


def when_imported(name: str, fn: Callable) -> None:
    """``fn(module)`` once ``name`` is imported (at once if it is already)."""
    if name in sys.modules:
        fn(sys.modules[name])
        return
    _PENDING.setdefault(name, []).append(fn)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
