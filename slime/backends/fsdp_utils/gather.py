"""All-gather per-sample, per-token tensors so every rank holds them for the whole rollout batch.

Every rank knows every sample's response length and which rank owns it (``data_plan.owners``), so
the exchange is one padded ``all_gather`` of a flat float tensor per field: no pickling, and the
receiving side can cut the flat tensors back into samples on its own.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_gather_per_sample(local: dict[int, list[torch.Tensor]], owners: list[list[int]], lengths: list[int],
                          n_fields: int, device, group=None) -> list[list[torch.Tensor]]:
    """``local[i]``: the ``n_fields`` tensors (each ``[lengths[i]]``) of sample ``i`` owned by this rank.
    ``owners`` has one entry per rank of ``group`` (None: the whole world).

    Returns ``fields[f][i]`` for every sample ``i`` of the batch, on CPU in float32.
    """
    world = len(owners)
    totals = [sum(lengths[i] for i in owned) for owned in owners]
    longest = max(max(totals), 1)
    rank = dist.get_rank(group) if world > 1 else 0
    flat = torch.zeros(n_fields, longest, dtype=torch.float32, device=device)
    offset = 0
    for i in owners[rank]:
        for f, tensor in enumerate(local[i]):
            flat[f, offset:offset + lengths[i]] = tensor.detach().float()
        offset += lengths[i]
    if world > 1:
        parts = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(parts, flat, group=group)
    else:
        parts = [flat]
    out: list[list[torch.Tensor | None]] = [[None] * len(lengths) for _ in range(n_fields)]
    for r, owned in enumerate(owners):
        part, offset = parts[r].cpu(), 0
        for i in owned:
            for f in range(n_fields):
                out[f][i] = part[f, offset:offset + lengths[i]].clone()
            offset += lengths[i]
    return out


def sum_across_ranks(values: dict[str, float], device, group=None) -> dict[str, float]:
    """Element-wise sum of scalar metrics over the ranks of ``group`` (None: the world); each rank passes the
    same keys, in the same order."""
    if not values:
        return {}
    keys = list(values)
    tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, group=group)
    return dict(zip(keys, tensor.cpu().tolist()))
