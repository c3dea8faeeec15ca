"""Which rank trains which samples, in which optimizer step and micro-batch: pure, deterministic layout.

Every rank receives the whole rollout batch and derives the same plan from ``(n_samples, world_size,
num_steps, micro_batch_size)``, so no rank has to be told what the others hold. The layout:

* the batch is cut into ``num_steps`` contiguous chunks (sizes differ by at most one), one per
  optimizer step; with the usual flags every chunk holds ``--global-batch-size`` samples;
* each chunk is cut into ``world_size`` contiguous slices, one per rank;
* each slice is cut into micro-batches of ``micro_batch_size`` samples or, with a token budget
  (``--use-dynamic-batch-size --max-tokens-per-gpu N``), packed by tokens: samples sorted longest first,
  each micro-batch filled while ``samples x longest`` (its padded size) stays within N, so long and
  short trajectories do not share a count. A sample longer than N gets a micro-batch of its own.

Every loss is normalised by the whole step (``losses``), so how a step is cut into micro-batches
changes nothing but float rounding.

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


def pack(indices: list[int], lengths: list[int] | None, micro_batch_size: int,
         max_tokens: int | None = None) -> list[MicroBatch]:
    """``indices`` cut into micro-batches: by count, or with ``max_tokens`` by padded tokens.

    ``lengths[i]``: the token count of sample ``i`` (indexed by sample, not by position in ``indices``).
    """
    if max_tokens is None:
        return [MicroBatch(tuple(indices[i:i + micro_batch_size])) for i in range(0, len(indices), micro_batch_size)]
    if lengths is None:
        raise ValueError("packing by tokens needs the sample lengths")
    out: list[list[int]] = []
    for i in sorted(indices, key=lambda j: (-lengths[j], j)):
        # Sorted longest first, so a micro-batch's first sample sets its padded length.
        if out and (len(out[-1]) + 1) * lengths[out[-1][0]] <= max_tokens:
            out[-1].append(i)
        else:
            out.append([i])
    return [MicroBatch(tuple(mb)) for mb in out]


def _padded(real: list[MicroBatch], count: int, stand_in: int) -> list[MicroBatch]:
    return real + [MicroBatch((stand_in,), dummy=True)] * (count - len(real))


@dataclass(frozen=True)
class StepPlan:
    """One optimizer step: all sample indices of the step (every rank) and this rank's micro-batches."""

    global_indices: tuple[int, ...]
    local_indices: tuple[int, ...]
    micro_batches: tuple[MicroBatch, ...]


def plan_steps(n_samples: int, num_steps: int, world_size: int, rank: int, micro_batch_size: int,
               lengths: list[int] | None = None, max_tokens: int | None = None) -> list[StepPlan]:
    """The optimizer steps of one rollout as seen by ``rank`` (empty chunks are dropped).

    Every rank packs every rank's slice, so all agree on the step's micro-batch count without talking.
    """
    if n_samples < 1:
        raise ValueError("the trainer got an empty rollout batch")
    steps = []
    for chunk in split_evenly(list(range(n_samples)), max(1, min(num_steps, n_samples))):
        slices = split_evenly(chunk, world_size)
        packed = [pack(s, lengths, micro_batch_size, max_tokens) for s in slices]
        count = max(len(p) for p in packed)
        steps.append(StepPlan(tuple(chunk), tuple(slices[rank]), tuple(_padded(packed[rank], count, chunk[0]))))
    return steps


def local_indices(steps: list[StepPlan]) -> list[int]:
    """All samples this rank owns over the rollout, in step order (the log-prob pass covers these)."""
    return [i for step in steps for i in step.local_indices]


def owners(n_samples: int, num_steps: int, world_size: int, micro_batch_size: int = 1) -> list[list[int]]:
    """``owners[r]``: the sample indices rank ``r`` owns, in its local order (used to gather results)."""
    return [local_indices(plan_steps(n_samples, num_steps, world_size, r, micro_batch_size))
            for r in range(world_size)]


def plan_forward(n_samples: int, num_steps: int, world_size: int, rank: int, micro_batch_size: int,
                 lengths: list[int] | None = None, max_tokens: int | None = None) -> list[MicroBatch]:
    """Micro-batches of the no-grad log-prob pass over this rank's samples, padded to a common count."""
    packed = [pack(m, lengths, micro_batch_size, max_tokens) for m in owners(n_samples, num_steps, world_size)]
    return _padded(packed[rank], max(len(p) for p in packed), 0)
