"""The few spots where megatron-core 0.16.1 assumes CUDA, made to work on a CPU (gloo) machine.

Applied by :func:`apply` only when CUDA is absent; on GPUs Megatron runs unpatched. Everything else the
trainer needs from Megatron (parallel state, ``GPTModel`` with the local layer spec, tensor-parallel
layers and their gloo collectives) runs on CPU as shipped. Avoided rather than patched:

* the CUDA RNG tracker: seeded with ``inference_rng_tracker=True`` (``model.init_parallel``), and dropout
  is refused by the flags, so no forked CUDA generator is ever used;
* the default causal mask (built on the GPU when ``attention_mask`` is None): the trainer always passes
  an explicit mask;
* Megatron's DDP buffers and ``get_megatron_optimizer``: the trainer reduces gradients itself and uses
  ``torch.optim.AdamW`` over the local shards.

``PATCHED`` names every symbol replaced, with the parameters its replacement expects;
``check_symbols`` (run by :func:`apply` and by the tests) fails loudly when a Megatron release moves or
re-signs one of them, instead of the patch silently not taking effect.
"""

from __future__ import annotations

import importlib
import inspect
import math

import torch

# module, class, method -> the parameter names (after self) the replacement is written against.
PATCHED = {
    ("megatron.core.models.common.embeddings.rotary_pos_embedding", "RotaryEmbedding", "get_emb"):
        ("max_seq_len", "offset"),
    ("megatron.core.utils", "GlobalMemoryBuffer", "get_tensor"): ("tensor_shape", "dtype", "name", "mem_alloc_context"),
}
_applied = False


def _resolve(module: str, cls: str, method: str):
    owner = getattr(importlib.import_module(module), cls, None)
    if owner is None or not hasattr(owner, method):
        raise RuntimeError(f"megatron-core changed: {module}.{cls}.{method} is gone; the CPU patches in "
                           f"{__name__} target megatron-core 0.16.1")
    return owner


def check_symbols() -> None:
    """Raise when a patched symbol is missing or its parameters changed."""
    for (module, cls, method), expected in PATCHED.items():
        original = getattr(_resolve(module, cls, method), method)
        original = getattr(original, "slime_cpu_original", original)
        params = tuple(inspect.signature(original).parameters)[1:]
        if params != expected:
            raise RuntimeError(f"megatron-core changed: {module}.{cls}.{method}{params} no longer takes "
                               f"{expected}; review {__name__} before using this release on CPU")


def _rope_emb_on_cpu(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
    # Megatron moves inv_freq to the current CUDA device here; on CPU it stays where it is.
    freqs = self.get_freqs_non_repeated(max_seq_len, offset)
    if self.rotary_interleaved:
        emb = torch.stack((freqs, freqs), dim=-1).reshape(freqs.shape[0], -1)
    else:
        emb = torch.cat((freqs, freqs), dim=-1)
    return emb[:, None, None, :]  # [seq, 1, 1, dim], the layout Megatron's attention expects


def _buffer_on_cpu(self, tensor_shape, dtype, name, mem_alloc_context=None) -> torch.Tensor:
    # Same reuse-by-name contract as Megatron's buffer, allocated in host memory.
    needed = math.prod(tensor_shape)
    key = (name, dtype)
    buffer = self.buffer.get(key)
    if buffer is None or buffer.numel() < needed:
        buffer = self.buffer[key] = torch.empty(needed, dtype=dtype, requires_grad=False)
    return buffer[:needed].view(*tensor_shape)


_REPLACEMENTS = {"get_emb": _rope_emb_on_cpu, "get_tensor": _buffer_on_cpu}


def apply() -> bool:
    """Patch Megatron for CPU execution (idempotent); returns whether patches are active."""
    global _applied
    if torch.cuda.is_available():
        return False
    if _applied:
        return True
    check_symbols()
    for module, cls, method in PATCHED:
        owner = _resolve(module, cls, method)
        replacement = _REPLACEMENTS[method]
        replacement.slime_cpu_original = getattr(owner, method)
        setattr(owner, method, replacement)
    _applied = True
    return True
