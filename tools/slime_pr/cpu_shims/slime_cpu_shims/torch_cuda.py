"""torch.cuda calls Megatron-LM makes directly (not through slime's accelerator API), answered for the CPU.

Replaces: torch.cuda.current_device / set_device / synchronize / device_count-free paths, the CUDA RNG state calls
(Megatron's CudaRNGStatesTracker keeps states per "device"), and Tensor.cuda / Module.cuda (kept on the CPU)."""

from __future__ import annotations


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
    cuda.manual_seed = torch.manual_seed
    cuda.manual_seed_all = torch.manual_seed
    cuda.random.get_rng_state = cuda.get_rng_state
    cuda.random.set_rng_state = cuda.set_rng_state
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self
