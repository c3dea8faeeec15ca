"""Megatron-LM (1dcf0da + slime's megatron.patch) spots that assume CUDA or TransformerEngine, patched right after
their module is imported. Each patch checks its target's source first (guard.expect_source) and refuses if it moved.

- megatron.core.tensor_parallel.random._set_cuda_rng_state: sets a CUDA generator's state (queued forever when CUDA
  is never initialised); here it sets the CPU generator's, which stands for the device generator on this path.
- megatron.core.transformer.dot_product_attention.DotProductAttention.forward: the local (non-TE) attention refuses
  packed sequences (``packed_seq_params``), and slime always trains packed (thd) batches; here causal attention runs
  per packed sequence on ``cu_seqlens`` (padded ones when given, as TE's attention reads them), via torch's SDPA.
"""

from __future__ import annotations

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
