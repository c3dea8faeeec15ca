"""Megatron-LM (1dcf0da + slime's megatron.patch) spots that assume CUDA or TransformerEngine, patched right after
their module is imported. Each patch checks its target's source first (guard.expect_source) and refuses if it moved.

- megatron.core.tensor_parallel.random._set_cuda_rng_state: sets a CUDA generator's state (queued forever when CUDA
  is never initialised); here it sets the CPU generator's, which stands for the device generator on this path.
- ``device='cuda'`` literals in the modules of CUDA_LITERAL_MODULES: those modules see a ``torch`` whose factory
  functions and ``torch.device`` give the CPU for 'cuda' (cpu_torch.CpuTorch); nothing else in them changes.
- megatron.core.transformer.dot_product_attention.DotProductAttention.forward: the local (non-TE) attention refuses
  packed sequences (``packed_seq_params``), and slime always trains packed (thd) batches; here causal attention runs
  per packed sequence on ``cu_seqlens`` (padded ones when given, as TE's attention reads them), via torch's SDPA.
- megatron.core.optimizer.distrib_optimizer.DistributedOptimizer.state_dict: without Apex/TE the optimizer is torch's
  Adam, whose per-parameter ``step`` it reads and asserts is one value. A resume asks a fresh optimizer (no state yet:
  slime skips the state initialisation before a load) for that template, and the assert fails on an empty state.
  Here a fresh optimizer's template carries step 0 as a placeholder; load_state_dict takes the step from the saved
  param groups, so the placeholder never reaches training. With any state the original runs unchanged.
- DistributedOptimizer._set_main_param_and_optimizer_states: loading slime's (dp_reshardable) optimizer checkpoint
  copies every key of torch Adam's per-parameter state from the file, ``step`` included, which the file does not hold
  (load_state_dict has already set it from the saved param groups): KeyError. Here ``step`` is left out of that copy.
"""

from __future__ import annotations

from slime_cpu_shims.cpu_torch import swap_torch_in
from slime_cpu_shims.guard import expect_source

# sha256 prefixes of the targets' source at Megatron-LM 1dcf0da with slime's megatron.patch.
RNG_SET_DIGEST = "b179c9d95438b61c"
DPA_FORWARD_DIGEST = "4cfa7795c981bd4c"
OPTIMIZER_STATE_DICT_DIGEST = "36718aee1cc6c4f9"
SET_OPTIMIZER_STATES_DIGEST = "93c254228283b2df"


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


def _patch_distrib_optimizer(module) -> None:
    import torch

    cls = module.DistributedOptimizer
    expect_source(cls.state_dict, OPTIMIZER_STATE_DICT_DIGEST, "optimizer step of a fresh state")
    original = cls.state_dict

    def state_dict(self):
        if module.HAVE_APEX_OR_TE or len(self.optimizer.state) > 0:
            return original(self)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        for p in params:
            self.optimizer.state[p] = {"step": torch.tensor(0.0)}
        try:
            return original(self)
        finally:
            for p in params:
                self.optimizer.state.pop(p, None)

    cls.state_dict = state_dict

    expect_source(cls._set_main_param_and_optimizer_states, SET_OPTIMIZER_STATES_DIGEST, "torch Adam's step on load")
    set_states = cls._set_main_param_and_optimizer_states

    def _set_main_param_and_optimizer_states(self, model_param, tensors):
        if self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8 or "step" in tensors:
            return set_states(self, model_param, tensors)
        group_index, group_order = self.model_param_group_index_map[model_param]
        state = self.optimizer.state[self.optimizer.param_groups[group_index]["params"][group_order]]
        step = state.pop("step", None)  # already the saved step: load_state_dict set it from the param groups
        try:
            return set_states(self, model_param, tensors)
        finally:
            if step is not None:
                state["step"] = step

    cls._set_main_param_and_optimizer_states = _set_main_param_and_optimizer_states


def arm(when_imported) -> None:
    when_imported("megatron.core.tensor_parallel.random", _patch_random)
    when_imported("megatron.core.optimizer.distrib_optimizer", _patch_distrib_optimizer)
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


def arm_cuda_literals(when_imported) -> None:
    for name in CUDA_LITERAL_MODULES:
        when_imported(name, lambda module: swap_torch_in(module, "cuda literals"))
