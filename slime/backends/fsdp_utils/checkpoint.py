"""Trainer checkpoints without pickle: HF safetensors for weights, safetensors + json for optimizer state.

Layout of the folder the driver hands over (``{save}/iter_XXXXXXX/model/`` in train.py)::

    hf/                         policy: config.json, model.safetensors, tokenizer files
    optimizer/state.safetensors every tensor of the optimizer state, key "<param fqn>/<name>"
    optimizer/meta.json         param_groups (hyper-parameters, param fqns) and non-tensor state
    critic/                     ppo only: backbone HF folder + value_head.safetensors
    critic_optimizer/           ppo only: as optimizer/
    rng/rank_<r>.safetensors    torch CPU (and CUDA) RNG state of each rank
    trainer_meta.json           format version, world size, optimizer step count

State dicts are keyed by parameter names, not by rank, so a checkpoint written by N processes loads
into M. Gathering is a collective (all ranks call save); only rank 0 writes shared files. Every file is
read through ``slime.checkpoint.files`` so a truncated or corrupt one fails with its path named (the driver's
checksums, verified by ``slime/checkpoint/layout.py``, normally catch it before loading starts).
"""

from __future__ import annotations

import json
import os
import shutil

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from slime.backends.fsdp_utils import model_io
from slime.checkpoint.files import read_json, read_safetensors

FORMAT_VERSION = 1


# ---------------------------------------------------------------------------- optimizer state <-> files
def save_optimizer_state(state: dict, folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    tensors, scalars = {}, {}
    for fqn, entries in state["state"].items():
        for name, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{fqn}/{name}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{fqn}/{name}"] = value
    save_file(tensors, os.path.join(folder, "state.safetensors"))
    meta = {"param_groups": state["param_groups"], "scalars": scalars}
    with open(os.path.join(folder, "meta.json"), "w", encoding="utf-8") as handle:
        json.dump(meta, handle, indent=1)


def load_optimizer_state(folder: str) -> dict:
    tensors = read_safetensors(os.path.join(folder, "state.safetensors"))
    meta = read_json(os.path.join(folder, "meta.json"))
    state: dict[str, dict] = {}
    for key, value in list(tensors.items()) + list(meta["scalars"].items()):
        fqn, name = key.rsplit("/", 1)
        state.setdefault(fqn, {})[name] = value
    return {"state": state, "param_groups": meta["param_groups"]}


# ---------------------------------------------------------------------------- whole trainer
def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def save_rng(path: str) -> None:
    """This rank's torch CPU (and CUDA) generator states, ``rng/rank_<r>.safetensors``."""
    rng = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["torch_cuda"] = torch.cuda.get_rng_state()
    os.makedirs(os.path.join(path, "rng"), exist_ok=True)
    save_file(rng, os.path.join(path, "rng", f"rank_{_rank()}.safetensors"))


def load_rng(path: str) -> None:
    rng_file = os.path.join(path, "rng", f"rank_{_rank()}.safetensors")
    if os.path.isfile(rng_file):  # absent when resuming on more ranks than were saved
        rng = read_safetensors(rng_file)
        torch.set_rng_state(rng["torch_cpu"])
        if "torch_cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["torch_cuda"])


def write_hf(actor, folder: str) -> None:
    """Policy weights (+ tokenizer) in HF format; a collective."""
    state = model_io.full_model_state(actor.model)
    if _rank() == 0:
        os.makedirs(folder, exist_ok=True)
        actor.model.save_pretrained(folder, state_dict=state, safe_serialization=True)
        if actor.tokenizer is not None:
            actor.tokenizer.save_pretrained(folder)
    _barrier()


def export_hf(actor, folder: str, write=write_hf) -> None:
    """HF weights for the engines (``write(actor, folder)``, a collective). Written next to ``folder`` and
    swapped in, so an engine never reads a half-written file and files an engine may still map are
    unlinked, not overwritten."""
    folder = os.path.abspath(folder)
    staging, retired = folder + ".writing", folder + ".old"
    if _rank() == 0:
        for leftover in (staging, retired):
            shutil.rmtree(leftover, ignore_errors=True)
    _barrier()
    write(actor, staging)
    if _rank() == 0:
        if os.path.exists(folder):
            os.replace(folder, retired)
        os.replace(staging, folder)
        shutil.rmtree(retired, ignore_errors=True)
    _barrier()


def save(actor, path: str) -> None:
    write_hf(actor, os.path.join(path, "hf"))
    optim_state = model_io.full_optimizer_state(actor.model, actor.optimizer)
    if actor.critic is not None:
        from slime.backends.fsdp_utils.critic import save_value_model

        critic_state = model_io.full_model_state(actor.critic)
        critic_optim_state = model_io.full_optimizer_state(actor.critic, actor.critic_optimizer)
    if _rank() == 0:
        save_optimizer_state(optim_state, os.path.join(path, "optimizer"))
        if actor.critic is not None:
            save_value_model(actor.critic, critic_state, os.path.join(path, "critic"))
            save_optimizer_state(critic_optim_state, os.path.join(path, "critic_optimizer"))
        meta = {"format_version": FORMAT_VERSION, "world_size": actor.world_size,
                "optimizer_steps": actor.optimizer_steps, "has_critic": actor.critic is not None}
        with open(os.path.join(path, "trainer_meta.json"), "w", encoding="utf-8") as handle:
            json.dump(meta, handle, indent=1)
    save_rng(path)
    _barrier()


def _read_weights(folder: str, skip: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    model_io.validate_hf_folder(folder, "checkpoint")
    state = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors") and name not in skip:
            state.update(read_safetensors(os.path.join(folder, name)))
    return state


def override_optimizer_settings(optimizer, args, lr: float) -> None:
    """``--override-opt_param-scheduler``: this run's settings replace those the restored state carried
    (``torch`` restores each param group's lr, betas, eps and weight decay with the state)."""
    if not getattr(args, "override_opt_param_scheduler", False):
        return
    for group in optimizer.param_groups:
        group.update(lr=lr, weight_decay=args.weight_decay, betas=(args.adam_beta1, args.adam_beta2),
                     eps=args.adam_eps)


def load(actor, path: str) -> None:
    """Restore weights, optimizer state, step count and RNG written by :func:`save` (a collective).

    Every rank reads the files (they must be visible to all ranks, e.g. a shared filesystem).
    """
    meta_file = os.path.join(path, "trainer_meta.json")
    if not os.path.isfile(meta_file):
        raise FileNotFoundError(f"{path!r} is not a trainer checkpoint: trainer_meta.json is missing")
    meta = read_json(meta_file)
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{meta_file}: format_version {meta.get('format_version')}, expected {FORMAT_VERSION}")
    if meta["has_critic"] != (actor.critic is not None):
        raise ValueError(f"{path!r} was saved {'with' if meta['has_critic'] else 'without'} a critic, but this "
                         f"run {'uses' if actor.critic is not None else 'does not use'} one (--advantage-estimator)")
    model_io.load_full_model_state(actor.model, _read_weights(os.path.join(path, "hf")))
    model_io.load_full_optimizer_state(actor.model, actor.optimizer,
                                       load_optimizer_state(os.path.join(path, "optimizer")))
    override_optimizer_settings(actor.optimizer, actor.args, actor.args.lr)
    if actor.critic is not None:
        from slime.backends.fsdp_utils.critic import VALUE_HEAD_FILE

        folder = os.path.join(path, "critic")
        state = {f"backbone.{k}": v for k, v in _read_weights(folder, skip=(VALUE_HEAD_FILE,)).items()}
        state.update({f"value_head.{k}": v for k, v in read_safetensors(os.path.join(folder, VALUE_HEAD_FILE)).items()})
        model_io.load_full_model_state(actor.critic, state)
        model_io.load_full_optimizer_state(actor.critic, actor.critic_optimizer,
                                           load_optimizer_state(os.path.join(path, "critic_optimizer")))
        override_optimizer_settings(actor.critic_optimizer, actor.args, actor.args.critic_lr or actor.args.lr)
    actor.optimizer_steps = int(meta["optimizer_steps"])
    load_rng(path)
    _barrier()
