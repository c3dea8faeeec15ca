"""slime's HF -> Megatron weight loader as the local (non-TransformerEngine) layer spec needs it.

Replaces nothing in slime's tree: wraps the entries of ``slime.backends.megatron_utils.hf_to_megatron._LOADERS`` for
Qwen/Llama checkpoints. slime's loader knows TransformerEngine's fused names, where the attention's input norm lives
in ``self_attention.linear_qkv.layer_norm_weight``; Megatron's local spec (``--transformer-impl local``, the only one
a CPU has) names that parameter ``input_layernorm.weight``. The wrapper asks slime's loader under the TE name. It also
answers the PPO critic's value-head bias (see get_local_spec_tensor): slime's HF loader cannot load a critic.
"""

from __future__ import annotations

import re

from slime_cpu_shims.guard import ShimTargetMoved

LOCAL_TO_TE = ((re.compile(r"^(.*decoder\.layers\.\d+\.)input_layernorm\.weight$"),
                r"\1self_attention.linear_qkv.layer_norm_weight"),)
MODEL_TYPES = ("qwen3", "qwen2", "llama")


def _wrap(get_hf_tensor):
    def get_local_spec_tensor(name, reader, config):
        for pattern, te_name in LOCAL_TO_TE:
            name = pattern.sub(te_name, name)
        if name.endswith("output_layer.bias") and "lm_head.bias" not in reader:
            # The critic's one-output value head has a bias no HF checkpoint holds; slime's loader skips the head's
            # weight (keeps its init) but raises on the bias. It starts at zero, as slime's own critic
            # re-initialisation (_reinitialize_critic_output_layer) sets it.
            import torch

            return torch.zeros(1)
        return get_hf_tensor(name, reader, config)

    get_local_spec_tensor.__wrapped__ = get_hf_tensor
    return get_local_spec_tensor


def patch_loaders(module) -> None:
    from slime.backends.megatron_utils.hf_to_megatron import qwen

    loaders = getattr(module, "_LOADERS", None)
    if not isinstance(loaders, dict) or any(loaders.get(t) is not qwen.qwen_hf_tensor for t in MODEL_TYPES):
        raise ShimTargetMoved("train_cpu shim 'local-spec names': hf_to_megatron._LOADERS no longer maps "
                              f"{MODEL_TYPES} to qwen.qwen_hf_tensor; re-check the shim")
    consts = qwen._attention_tensor.__code__.co_consts
    names = {c for c in consts if isinstance(c, str)} | {x for c in consts if isinstance(c, tuple) for x in c}
    if "self_attention.linear_qkv.layer_norm_weight" not in names:
        raise ShimTargetMoved("train_cpu shim 'local-spec names': qwen._attention_tensor no longer reads "
                              "self_attention.linear_qkv.layer_norm_weight; re-check the shim")
    for t in MODEL_TYPES:
        loaders[t] = _wrap(loaders[t])


# The other direction, Megatron -> HF (slime's disk weight sync and --save-hf): slime's converters know the TE names of
# both norms; the local spec has ``input_layernorm`` and ``pre_mlp_layernorm`` instead.
LOCAL_TO_TE_OUT = (*LOCAL_TO_TE, (re.compile(r"^(.*decoder\.layers\.\d+\.)pre_mlp_layernorm\.weight$"),
                                  r"\1mlp.linear_fc1.layer_norm_weight"))


def patch_converter(module) -> None:
    """Wrap ``megatron_to_hf._convert_to_hf_core`` (looked up by ``convert_to_hf`` at call time) to see TE names."""
    core = getattr(module, "_convert_to_hf_core", None)
    if core is None or "convert_to_hf" not in vars(module):
        raise ShimTargetMoved("train_cpu shim 'local-spec names': megatron_to_hf has no _convert_to_hf_core / "
                              "convert_to_hf any more; re-check the shim")

    def convert_local_spec(args, model_name, name, param):
        for pattern, te_name in LOCAL_TO_TE_OUT:
            name = pattern.sub(te_name, name)
        return core(args, model_name, name, param)

    convert_local_spec.__wrapped__ = core
    module._convert_to_hf_core = convert_local_spec
