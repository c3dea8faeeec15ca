"""torch.cuda calls Megatron-LM makes directly (not through slime's accelerator API), answered for the CPU.

Replaces: torch.cuda.current_device ("cpu") / set_device / synchronize / empty_cache, the CUDA RNG state calls (the
CPU generator stands for the device's), streams and events (no-ops: the CPU runs in order), Tensor.cuda /
Module.cuda (kept on the CPU) and Tensor.type()'s name of a CPU tensor (its CUDA twin's, for Megatron's optimizer)."""

from __future__ import annotations

import contextlib


class _NoStream:
    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return event or _NoEvent()

    def synchronize(self):
        pass

    def query(self):
        return True


class _NoEvent:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        pass

    def wait(self, stream=None):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0


def patch(torch) -> None:
    cuda = torch.cuda
    # Megatron writes `device=torch.cuda.current_device()` everywhere: "cpu" puts those tensors on the CPU.
    cuda.current_device = lambda: "cpu"
    cuda.set_device = lambda *a, **k: None
    cuda.synchronize = lambda *a, **k: None
    cuda.empty_cache = lambda: None
    cuda.get_rng_state = lambda device=None: torch.get_rng_state()
    cuda.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    # The CPU generator stands for the "device" generator: Megatron's RNG tracker seeds, saves and restores it.
    # (torch.manual_seed itself calls cuda.manual_seed_all: that one must not seed the CPU again.)
    cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
    cuda.manual_seed_all = lambda seed: None
    cuda.random.get_rng_state = cuda.get_rng_state
    cuda.random.set_rng_state = cuda.set_rng_state
    # Streams and events: everything runs in order on the CPU, so a stream is a no-op object and its context nothing.
    cuda.Stream = _NoStream
    cuda.Event = _NoEvent
    cuda.current_stream = lambda device=None: _NoStream()
    cuda.default_stream = lambda device=None: _NoStream()
    cuda.stream = lambda stream=None: contextlib.nullcontext()
    torch.Tensor.record_stream = lambda self, stream: None
    torch.Tensor.pin_memory = lambda self, *a, **k: self  # page-locking needs a CUDA driver
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self

    # Megatron's optimizer accepts parameters only by their CUDA type names ('torch.cuda.FloatTensor', in
    # DistributedOptimizer._build_model_and_main_param_groups and clip_grad_by_total_norm_fp32): a CPU tensor
    # answers Tensor.type() (no argument) with its CUDA twin's name. Conversions (type(dtype)) are untouched.
    real_type = torch.Tensor.type

    def type_(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None and not kwargs and self.device.type == "cpu":
            return real_type(self).replace("torch.", "torch.cuda.", 1)
        return real_type(self, dtype, non_blocking, **kwargs)

    torch.Tensor.type = type_
