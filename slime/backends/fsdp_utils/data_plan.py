"""Which rank trains which samples, in which optimizer step and micro-batch: pure, deterministic layout.

Every rank receives the whole rollout batch and derives the same plan from ``(n_samples, world_size,
num_steps, micro_batch_size)``, so no rank has to be told what the others hold. The layout:

* the batch is cut into ``num_steps`` contiguous chunks (sizes differ by at most one), one per
  optimizer step; with the usual flags every chunk holds ``--global-batch-size`` samples;
* each chunk is cut into ``world_size`` contiguous slices, one per rank;
* each slice is cut into micro-batches of ``micro_batch_size``.

FSDP2 runs collectives in every forward and backward, so all ranks must run the same number of
micro-batches. A rank with fewer samples in a step runs padding micro-batches (``MicroBatch.dummy``)
whose loss is multiplied by zero; they keep the collectives in step and change nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass


def split_evenly(items: list[int], parts: int) -> list[list[int]]:
    """Contiguous split of ``items`` into ``parts`` pieces whose sizes differ by at most one."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    base, extra = divmod(len(items), parts)
    out, start = [], 0
    for p in range(parts):
        size = base + (1 if p < extra else 0)
        out.append(items[start:start + size])
        start += size
    return out


@dataclass(frozen=True)
class MicroBatch:
    indices: tuple[int, ...]  # positions in the rollout batch; for a dummy: one stand-in sample
    dummy: bool = False


def _micro_batches(indices: list[int], micro_batch_size: int, count: int, stand_in: int) -> list[MicroBatch]:
    real = [MicroBatch(tuple(indices[i:i + micro_batch_size])) for i in range(0, len(indices), micro_batch_size)]
    return real + [MicroBatch((stand_in,), dummy=True)] * (count - len(real))


def _n_micro(size: int, micro_batch_size: int) -> int:
    return -(-size // micro_batch_size)


@dataclass(frozen=True)
class StepPlan:
    """One optimizer step: all sample indices of the step (every rank) and this rank's micro-batches."""

    global_indices: tuple[int, ...]
    local_indices: tuple[int, ...]
    micro_batches: tuple[MicroBatch, ...]


def plan_steps(n_samples: int, num_steps: int, world_size: int, rank: int, micro_batch_size: int) -> list[StepPlan]:
    """The optimizer steps of one rollout as seen by ``rank`` (empty chunks are dropped)."""
    if n_samples < 1:
        raise ValueError("the trainer got an empty rollout batch")
    steps = []
    for chunk in split_evenly(list(range(n_samples)), max(1, min(num_steps, n_samples))):
        slices = split_evenly(chunk, world_size)
        count = max(_n_micro(len(s), micro_batch_size) for s in slices)
        mine = slices[rank]
        steps.append(StepPlan(tuple(chunk), tuple(mine), tuple(_micro_batches(mine, micro_batch_size, count, chunk[0]))))
    return steps


def local_indices(steps: list[StepPlan]) -> list[int]:
    """All samples this rank owns over the rollout, in step order (the log-prob pass covers these)."""
    return [i for step in steps for i in step.local_indices]


def owners(n_samples: int, num_steps: int, world_size: int, micro_batch_size: int = 1) -> list[list[int]]:
    """``owners[r]``: the sample indices rank ``r`` owns, in its local order (used to gather results)."""
    return [local_indices(plan_steps(n_samples, num_steps, world_size, r, micro_batch_size))
            for r in range(world_size)]


def plan_forward(n_samples: int, num_steps: int, world_size: int, rank: int,
                 micro_batch_size: int) -> list[MicroBatch]:
    """Micro-batches of the no-grad log-prob pass over this rank's samples, padded to a common count."""
    mine_all = owners(n_samples, num_steps, world_size)
    count = max(_n_micro(len(m), micro_batch_size) for m in mine_all)
    return _micro_batches(mine_all[rank], micro_batch_size, count, 0)
