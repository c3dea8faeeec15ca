"""slime modules that page-lock CPU buffers (``pin_memory=True``: weight backups, routing replay, disk-delta
weight sync); page-locking needs a CUDA driver. Those modules see cpu_torch.CpuTorch as ``torch``, which drops the
flag; nothing else in them changes."""

from __future__ import annotations

PINNING_MODULES = ("slime.utils.tensor_backper", "slime.utils.routing_replay",
                   "slime.backends.megatron_utils.update_weight.update_weight_from_disk_delta")


def arm(when_imported) -> None:
    from slime_cpu_shims.cpu_torch import swap_torch_in

    for name in PINNING_MODULES:
        when_imported(name, lambda module: swap_torch_in(module, "pin_memory"))
