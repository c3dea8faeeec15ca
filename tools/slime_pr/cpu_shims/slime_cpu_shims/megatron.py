"""Megatron-LM (1dcf0da + slime's megatron.patch) spots that assume CUDA or TransformerEngine, patched right after
their module is imported. Each patch checks its target's source first (guard.expect_source) and refuses if it moved.

- megatron.core.tensor_parallel.random._set_cuda_rng_state: sets a CUDA generator's state (queued forever when CUDA
  is never initialised); here it sets the CPU generator's, which stands for the device generator on this path.
- ``device='cuda'`` literals in the modules of CUDA_LITERAL_MODULES: those modules see a ``torch`` whose factory
  functions and ``torch.device`` give the CPU for 'cuda' (cpu_torch.CpuTorch); nothing else in them changes.
- megatron.core.transformer.dot_product_attention.DotProductAttention.forward: the local (non-TE) attention refuses
  packed sequences (``packed_seq_params``), and slime always trains packed (thd) batches; here causal attention runs
  per packed sequence on ``cu_seqlens`` (padded ones when given, as TE's attention reads them), via torch's SDPA.
"""

from __future__ import annotations

from slime_cpu_shims.cpu_torch import CpuTorch
from slime_cpu_shims.guard import expect_source

# sha256 prefixes of the targets' source at Megatron-LM 1dcf0da with slime's megatron.patch.
RNG_SET_DIGEST = "b179c9d95438b61c"
DPA_FORWARD_DIGEST = "4cfa7795c981bd4c"


def _patch_random(module) -> None:
    import torch

    expect_source(module._set_cuda_rng_state, RNG_SET_DIGEST, "cpu rng state")

    def _set_cpu_rng_state(new_state, device=-1, graph_safe=False):
        torch.set_rng_state(new_state)

    module._set_cuda_rng_state = _set_cpu_rng_state


def packed_causal_attention(query, key, value, cu_seqlens, scale):
    """Causal attention inside each packed sequence: query [t, np, hn], key/value [t, ng, hn] -> [t, np * hn]."""
    import torch
    import torch.nn.functional as F

    heads, groups = query.size(1), key.size(1)
    if heads != groups:
        key = key.repeat_interleave(heads // groups, dim=1)
        value = value.repeat_interleave(heads // groups, dim=1)
    bounds = [int(x) for x in cu_seqlens.tolist()]
    out = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end <= start:
            continue
        q, k, v = (x[start:end].transpose(0, 1) for x in (query, key, value))  # [np, s, hn]
        out.append(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale).transpose(0, 1))
    if bounds[-1] < query.size(0):  # tokens after the last sequence (alignment padding): no attention to share
        out.append(torch.zeros_like(query[bounds[-1]:]))
    return torch.cat(out, dim=0).reshape(query.size(0), -1)


def _patch_dot_product_attention(module) -> None:
    cls = module.DotProductAttention
    expect_source(cls.forward, DPA_FORWARD_DIGEST, "packed-sequence attention")
    original = cls.forward

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if packed_seq_params is None:
            return original(self, query, key, value, attention_mask, attn_mask_type, attention_bias)
        if query.dim() == 4:  # [t, 1, np, hn]: the batch dimension is a dummy in the packed case
            query, key, value = query.squeeze(1), key.squeeze(1), value.squeeze(1)
        assert self.config.context_parallel_size == 1, "train_cpu's packed attention shim does not do CP"
        assert attention_bias is None
        cu = packed_seq_params.cu_seqlens_q_padded
        if cu is None:
            cu = packed_seq_params.cu_seqlens_q
        return packed_causal_attention(query, key, value, cu, self.softmax_scale)

    cls.forward = forward


def arm(when_imported) -> None:
    when_imported("megatron.core.tensor_parallel.random", _patch_random)
    when_imported("megatron.core.transformer.dot_product_attention", _patch_dot_product_attention)
    arm_cuda_literals(when_imported)


# Modules whose literal device='cuda' tensors (found flags, norms, overflow buffers, token counts, warm-up
# tensors, checkpoint metadata) go to the CPU.
CUDA_LITERAL_MODULES = (
    "megatron.core.optimizer.clip_grads", "megatron.core.optimizer.optimizer", "megatron.core.optimizer.grad_scaler",
    "megatron.core.optimizer.distrib_optimizer", "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.pipeline_parallel.schedules", "megatron.core.pipeline_parallel.utils",
    "megatron.core.tensor_parallel.data", "megatron.core.transformer.utils", "megatron.core.utils",
    "megatron.core.rerun_state_machine", "megatron.training.checkpointing",
    "megatron.core.dist_checkpointing.strategies.state_dict_saver", "megatron.core.dist_checkpointing.exchange_utils",
    "megatron.core.dist_checkpointing.strategies.async_utils",
)


def _cpu_torch_namespace(module) -> None:
    import torch

    if getattr(module, "torch", None) is not torch:
        raise RuntimeError(f"train_cpu shim 'cuda literals': {module.__name__} no longer imports torch as `torch`")
    module.torch = CpuTorch(torch)


def arm_cuda_literals(when_imported) -> None:
    for name in CUDA_LITERAL_MODULES:
        when_imported(name, _cpu_torch_namespace)
