"""Worker functions for the Megatron backend tests (a module, so spawned ranks can import them by name)."""

from __future__ import annotations

import os
import queue

import torch

from fsdp_helpers import make_args, make_samples


def megatron_args(ckpt, *extra, tp=1, world=1):
    return make_args(ckpt, "--train-backend", "megatron", "--tensor-model-parallel-size", str(tp),
                     "--actor-num-gpus-per-node", str(world), *extra)


def full_hf_weights(actor) -> dict[str, torch.Tensor]:
    from slime.backends.megatron_utils import hf_weights

    return hf_weights.megatron_to_hf(hf_weights.gather_full(actor.model, actor.shape, actor.tp_group), actor.shape)


def log_probs_worker(rank, world, ckpt, tp, samples):
    """Policy log-probs of ``samples`` on every rank of a TP ``tp`` group."""
    from slime.backends.megatron_utils.actor import MegatronActor

    actor = MegatronActor(megatron_args(ckpt, tp=tp, world=world), rank, world)
    return [t.tolist() for t in actor.log_probs(samples)]


def train_worker(rank, world, ckpt, tp, extra, n_rollouts, save_to=None, load_from=None, start=0):
    """Train rollouts ``start .. n_rollouts - 1`` (after loading ``load_from``, saving to ``save_to`` after the first);
    rank 0 returns per-rollout scalar metrics and the final HF weights."""
    from slime.backends.megatron_utils.actor import MegatronActor

    actor = MegatronActor(megatron_args(ckpt, *extra, tp=tp, world=world), rank, world)
    if load_from:
        actor.load(load_from)
    metrics = []
    for n in range(start, n_rollouts):
        out = actor.train(n, make_samples(seed=n, with_teacher=True), 0.0)
        metrics.append({k: v for k, v in out.items() if isinstance(v, float) and not k.startswith("time/")})
        if save_to and n == start:
            actor.save(save_to)
    weights = full_hf_weights(actor)
    return (metrics, weights) if rank == 0 else None


def torch_dist_save_patches():
    """(object, attribute, replacement) triples that let megatron-core 0.16.1's torch_dist save run on CPU
    (tests only: the trainer never writes torch_dist). Apply with pytest's monkeypatch."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    return [(torch.cuda, "synchronize", lambda *args, **kwargs: None),
            (torch.cuda, "current_device", lambda: "cpu"),
            (filesystem_async, "_get_write_results_queue", queue.Queue),
            (filesystem_async, "_process_memory", lambda: 0)]


def save_torch_dist(sharded_state_dict, folder) -> None:
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    os.makedirs(folder, exist_ok=True)
    strategy = TorchDistSaveShardedStrategy("torch_dist", 1, thread_count=1)
    dist_checkpointing.save(sharded_state_dict, str(folder), sharded_strategy=strategy)
