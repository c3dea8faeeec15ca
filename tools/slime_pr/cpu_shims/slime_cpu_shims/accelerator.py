"""slime's accelerator API given a CPU backend ("cpu", gloo), registered through slime's own register_accelerator.

Replaces nothing in slime: slime selects it because SLIME_ACCELERATOR=cpu. Each Ray worker registers it again (this
runs in every process through sitecustomize), as slime's registry is per process.
"""

from __future__ import annotations

import contextlib
import os


def make_cpu_accelerator_class(base):
    import torch

    class CPUAccelerator(base):
        name = "cpu"
        device_type = "cpu"
        communication_backend_name = "gloo"

        def is_available(self) -> bool:
            return True

        def device(self, index=None) -> torch.device:
            return torch.device("cpu")

        def device_name(self, index=None) -> str:
            return "cpu"

        def set_device(self, index) -> None:
            return None

        def current_device(self):
            return "cpu"  # what slime's Accelerator contract says a CPU backend answers; device= takes it as is

        def device_count(self) -> int:
            return 1

        def synchronize(self, device=None) -> None:
            return None

        def current_stream(self, device=None):
            return None

        def stream(self, stream):
            return contextlib.nullcontext()

        def empty_cache(self) -> None:
            return None

        def mem_get_info(self, device=None) -> tuple[int, int]:
            pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
            return pages * size, os.sysconf("SC_PHYS_PAGES") * size

        def memory_allocated(self, device=None) -> int:
            return 0

        def memory_reserved(self, device=None) -> int:
            return 0

        def distributed_device_id(self, index=None):
            return None  # gloo takes no device id

        def resolve_visible_device_id(self, physical_device_id) -> int:
            return 0

        def supports(self, capability: str) -> bool:
            return capability == "requires_cpu_initialization"

    return CPUAccelerator


def register(module) -> None:
    from slime.utils.accelerator.base import Accelerator

    cls = make_cpu_accelerator_class(Accelerator)
    module.register_accelerator("cpu", cls, lambda: True, priority=0, communication_backends=("gloo",))
