"""The CPU shims train_cpu.py runs slime's unmodified train.py with. Each module names what it replaces; each patch
checks its target first (guard.py) and refuses if the target moved. install() arms them all as post-import hooks."""

from __future__ import annotations


def install() -> None:
    from slime_cpu_shims import accelerator, hooks, kl_probe, megatron, slime_names, slime_pinned, torch_cuda

    hooks.when_imported("slime.utils.accelerator", accelerator.register)
    hooks.when_imported("torch", torch_cuda.patch)
    megatron.arm(hooks.when_imported)
    hooks.when_imported("slime.backends.megatron_utils.hf_to_megatron", slime_names.patch_loaders)
    hooks.when_imported("slime.backends.megatron_utils.megatron_to_hf", slime_names.patch_converter)
    kl_probe.arm(hooks.when_imported)
    slime_pinned.arm(hooks.when_imported)
