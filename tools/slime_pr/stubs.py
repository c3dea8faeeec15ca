"""Stand-ins for packages upstream's modules import but CPU checks never use (ray, sglang, ...).

As upstream's own CPU contract tests do: an import of a stubbed package gives a module whose every
attribute is a do-nothing class, enough for import-time references. Instantiations are recorded in
``StubModule.used``, so a check can show that nothing stubbed was actually called.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class StubModule(types.ModuleType):
    used: list[str] = []

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        qualified = f"{self.__name__}.{name}"

        def init(obj, *args, **kwargs):
            StubModule.used.append(qualified)

        stub = type(name, (), {"__init__": init})
        setattr(self, name, stub)
        return stub


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers every import under ``packages`` with a :class:`StubModule`."""

    def __init__(self, packages):
        self.packages = tuple(packages)

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.packages:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install(packages) -> StubFinder:
    finder = StubFinder(packages)
    sys.meta_path.insert(0, finder)
    return finder


# megatron.core.mpu as one process sees it alone: one data-, tensor- and context-parallel rank, the last (only)
# pipeline stage, no process group.
ONE_RANK = {"is_pipeline_last_stage": True, "get_context_parallel_world_size": 1, "get_context_parallel_rank": 0,
            "get_tensor_model_parallel_rank": 0, "get_data_parallel_rank": 0, "get_data_parallel_world_size": 1,
            "get_data_parallel_group": None}


def install_one_rank_mpu() -> None:
    """Stub megatron (if it is not already) and give it a ``megatron.core.mpu`` that answers ``ONE_RANK``."""
    if not any(isinstance(f, StubFinder) and "megatron" in f.packages for f in sys.meta_path):
        install(("megatron",))
    import megatron.core

    mpu = StubModule("megatron.core.mpu")
    for name, value in ONE_RANK.items():
        setattr(mpu, name, lambda *args, _value=value, **kwargs: _value)
    sys.modules["megatron.core.mpu"] = megatron.core.mpu = mpu
