"""Checkpoints of the Megatron backend, in the layout the FSDP backend uses (``fsdp_utils/checkpoint.py``).

The driver hands over ``{save}/iter_XXXXXXX/model/`` of a Megatron-style root
(``latest_checkpointed_iteration.txt``), so ``--ref-load`` / ``--opd-teacher-load`` accept a run's own save
root. Inside, weights are a HF folder (``hf/``, gathered over tensor-parallel ranks, which is also what the
engines load) and AdamW's moments are stored whole under the Megatron parameter names
(``optimizer/state.safetensors``, ``"<name>/exp_avg"``), so a run saved with one tensor-parallel size
resumes with another. No pickle anywhere: safetensors and JSON.
"""

from __future__ import annotations

import json
import os
import shutil

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from slime.backends.fsdp_utils import checkpoint as fsdp_checkpoint
from slime.backends.megatron_utils import hf_weights
from slime.checkpoint.files import read_json

FORMAT_VERSION = 1
BACKEND = "megatron"
_COPIED_FILES = ("config.json", "generation_config.json")


def write_hf(actor, folder: str) -> None:
    """The policy as a HF folder (a collective: every rank gathers its tensor-parallel group's shards)."""
    full = hf_weights.gather_full(actor.model, actor.shape, actor.tp_group)
    if fsdp_checkpoint._rank() == 0:
        os.makedirs(folder, exist_ok=True)
        state = hf_weights.megatron_to_hf(full, actor.shape)
        save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        for name in _COPIED_FILES:
            source = os.path.join(actor.args.hf_checkpoint, name)
            if os.path.isfile(source):
                shutil.copyfile(source, os.path.join(folder, name))
        if actor.tokenizer is not None:
            actor.tokenizer.save_pretrained(folder)
    fsdp_checkpoint._barrier()


def export_hf(actor, folder: str) -> None:
    fsdp_checkpoint.export_hf(actor, folder, write=write_hf)


def _named_params(actor) -> dict[str, torch.nn.Parameter]:
    return hf_weights.from_te_names(dict(actor.model.named_parameters()))


def save(actor, path: str) -> None:
    write_hf(actor, os.path.join(path, "hf"))
    params = _named_params(actor)
    states = {name: actor.optimizer.state.get(param, {}) for name, param in params.items()}
    moments = sorted({key for entries in states.values() for key in entries if key != "step"})
    # Every tensor-parallel rank gathers (a collective); rank 0 writes whole tensors.
    full = {moment: hf_weights.gather_tensors({name: entries[moment] for name, entries in states.items()
                                               if moment in entries}, actor.shape, actor.tp_group)
            for moment in moments}
    if fsdp_checkpoint._rank() == 0:
        state = {name: {moment: full[moment][name] for moment in moments if name in full[moment]} for name in params}
        for name, entries in states.items():
            if "step" in entries:
                state[name]["step"] = float(entries["step"])
        groups = [{k: v for k, v in group.items() if k != "params"} for group in actor.optimizer.param_groups]
        fsdp_checkpoint.save_optimizer_state({"state": state, "param_groups": groups}, os.path.join(path, "optimizer"))
        meta = {"format_version": FORMAT_VERSION, "backend": BACKEND, "world_size": dist.get_world_size(),
                "tensor_model_parallel_size": actor.layout.tp_size, "optimizer_steps": actor.optimizer_steps,
                "has_critic": False}
        with open(os.path.join(path, "trainer_meta.json"), "w", encoding="utf-8") as handle:
            json.dump(meta, handle, indent=1)
    fsdp_checkpoint.save_rng(path)
    fsdp_checkpoint._barrier()


def load(actor, path: str) -> None:
    """Restore what :func:`save` wrote (any tensor-parallel size); every rank reads the files."""
    meta_file = os.path.join(path, "trainer_meta.json")
    if not os.path.isfile(meta_file):
        raise FileNotFoundError(f"{path!r} is not a trainer checkpoint: trainer_meta.json is missing")
    meta = read_json(meta_file)
    if meta.get("backend", "fsdp") != BACKEND or meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{meta_file}: written by the {meta.get('backend', 'fsdp')} backend (format "
                         f"{meta.get('format_version')}); --train-backend megatron resumes only its own checkpoints")
    shape, layout = actor.shape, actor.layout
    full = hf_weights.hf_to_megatron(fsdp_checkpoint._read_weights(os.path.join(path, "hf")), shape)
    hf_weights.load_local(actor.model, hf_weights.shard(full, shape, layout.tp_rank, layout.tp_size))
    optim = fsdp_checkpoint.load_optimizer_state(os.path.join(path, "optimizer"))
    params = _named_params(actor)
    for name, param in params.items():
        entries = optim["state"].get(name)
        if entries is None:
            continue
        whole = {k: v for k, v in entries.items() if isinstance(v, torch.Tensor)}
        local = {}
        for moment, tensor in whole.items():
            local[moment] = hf_weights.shard({name: tensor}, shape, layout.tp_rank, layout.tp_size)[name].to(param.device)
        # AdamW keeps the step count on the parameter's device when fused (GPUs), on the CPU otherwise.
        on_device = any(g["fused"] or g["capturable"] for g in actor.optimizer.param_groups)
        local["step"] = torch.tensor(float(entries["step"]), dtype=torch.float32,
                                     device=param.device if on_device else "cpu")
        actor.optimizer.state[param] = local
    for group, saved in zip(actor.optimizer.param_groups, optim["param_groups"]):
        group.update({k: v for k, v in saved.items() if k != "params"})
    fsdp_checkpoint.override_optimizer_settings(actor.optimizer, actor.args, actor.args.lr)
    actor.optimizer_steps = int(meta["optimizer_steps"])
    fsdp_checkpoint.load_rng(path)
    fsdp_checkpoint._barrier()
