"""slime modules that page-lock CPU buffers (``pin_memory=True``: weight backups, routing replay, disk-delta
weight sync); page-locking needs a CUDA driver. Those modules see cpu_torch.CpuTorch as ``torch``, which drops the
flag; nothing else in them changes."""

from __future__ import annotations

PINNING_MODULES = ("slime.utils.tensor_backper", "slime.utils.routing_replay",
                   "slime.backends.megatron_utils.update_weight.update_weight_from_disk_delta")


def _unpin(module) -> None:
    import torch

    from slime_cpu_shims.cpu_torch import CpuTorch

    if getattr(module, "torch", None) is not torch:
        raise RuntimeError(f"train_cpu shim 'pin_memory': {module.__name__} no longer imports torch as `torch`")
    module.torch = CpuTorch(torch)


def arm(when_imported) -> None:
    for name in PINNING_MODULES:
        when_imported(name, _unpin)
