"""Megatron's core attention computed by ``torch.nn.functional.scaled_dot_product_attention``.

Megatron's local ``DotProductAttention`` (the layer spec without Transformer Engine) materialises the
``[batch, heads, seq, seq]`` scores, masks and soft-maxes them and copies them around; on a CPU that was
most of a training step (benchmarks/trainer_step_time.py, profiled). PyTorch's SDPA runs the same
computation with its fused kernels (flash attention on CPU and on GPUs) and handles grouped-query
attention without repeating the key/value heads.

The trainer's batches are right-padded and attention is causal, so no explicit mask is needed: every
real position only sees earlier positions, which are real. ``build_gpt`` puts this class in the local
spec's ``core_attention`` slot; Transformer Engine's spec keeps TE's own attention.
"""

from __future__ import annotations

import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType


class SDPACoreAttention(DotProductAttention):
    """Same constructor and tensor layout as ``DotProductAttention``; causal self-attention only."""

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        if mask_type != AttnMaskType.causal or attention_bias is not None or packed_seq_params is not None:
            raise ValueError("SDPACoreAttention runs causal self-attention without bias or packed sequences "
                             f"(got {mask_type}, bias {attention_bias is not None}, packed {packed_seq_params is not None})")
        # Megatron: [seq, batch, heads, head_dim]; SDPA: [batch, heads, seq, head_dim].
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        grouped = self.num_attention_heads_per_partition != self.num_query_groups_per_partition
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale,
                                                 enable_gqa=grouped)
        seq, batch = query.shape[0], query.shape[1]
        return context.permute(2, 0, 1, 3).reshape(seq, batch, self.hidden_size_per_partition)
