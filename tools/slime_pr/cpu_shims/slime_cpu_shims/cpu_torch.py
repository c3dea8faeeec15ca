"""A stand-in for the ``torch`` name inside chosen modules (see CpuTorch)."""

from __future__ import annotations


def _is_cuda(dev) -> bool:
    return isinstance(dev, str) and (dev == "cuda" or dev.startswith("cuda:"))


class CpuTorch:
    """``torch`` as a few modules see it: factory calls with ``device='cuda'`` (a literal in them) and
    ``torch.device('cuda')`` give the CPU, ``pin_memory=True`` (page-locking needs a CUDA driver) is dropped;
    everything else is torch itself."""

    FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange", "zeros_like", "ones_like", "empty_like")

    def __init__(self, torch):
        self._torch = torch

    def __getattr__(self, name):
        attr = getattr(self._torch, name)
        if name in self.FACTORIES:
            def factory(*args, **kwargs):
                if _is_cuda(kwargs.get("device")):
                    kwargs["device"] = "cpu"
                kwargs.pop("pin_memory", None)
                return attr(*args, **kwargs)
            return factory
        if name == "device":
            return lambda dev=None, *a: attr("cpu") if _is_cuda(dev) else attr(dev, *a)
        return attr


def swap_torch_in(module, shim: str) -> None:
    """Give ``module`` a CpuTorch as its ``torch`` (the shims for CUDA literals and pinned buffers)."""
    import torch

    if getattr(module, "torch", None) is not torch:
        raise RuntimeError(f"train_cpu shim {shim!r}: {module.__name__} no longer imports torch as `torch`")
    module.torch = CpuTorch(torch)
