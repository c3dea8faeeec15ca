"""Process-group setup for the trainer, with or without Ray.

``init_distributed`` is what each trainer process calls (a Ray actor or a spawned process): gloo on
CPU, nccl on CUDA. ``ensure_single_process_group`` gives a world of one for in-process use (tests,
notebooks). ``run_local_group`` spawns N local processes without Ray and collects their results.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_distributed(rank: int, world_size: int, master_addr: str = "127.0.0.1", master_port: int | None = None,
                     timeout_s: float = 1800.0) -> None:
    if dist.is_initialized():
        return
    if not torch.cuda.is_available() and world_size > 1:
        # Several trainer processes on one CPU: one intra-op thread pool each per share of the cores, or
        # they oversubscribe the machine and every collective waits on a descheduled peer.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    if torch.cuda.is_available():
        # Under Ray each actor sees exactly its own GPU as device 0; elsewhere LOCAL_RANK says which.
        local = int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))
        torch.cuda.set_device(local if local < torch.cuda.device_count() else 0)
    port = master_port if master_port is not None else int(os.environ.get("MASTER_PORT", "29500"))
    dist.init_process_group(backend(), init_method=f"tcp://{master_addr}:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout_s))


def ensure_single_process_group() -> None:
    """A one-process group on a free port (idempotent), so FSDPActor(args, 0, 1) runs in this process."""
    if not dist.is_initialized():
        init_distributed(0, 1, master_port=free_port())


def _spawned(rank: int, world_size: int, port: int, fn, fn_args, results, collected) -> None:
    init_distributed(rank, world_size, master_port=port)
    try:
        results.put((rank, fn(rank, world_size, *fn_args)))
        # Tensors travel through shared memory owned by this process: stay alive until they are read.
        collected.wait()
    finally:
        dist.destroy_process_group()


def run_local_group(fn, world_size: int, *fn_args) -> list:
    """Run ``fn(rank, world_size, *fn_args)`` in ``world_size`` spawned processes joined in one group.

    ``fn`` must be importable by name (a module-level function) and return something picklable; the
    per-rank results come back as a list. A failing rank raises here with its traceback.
    """
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results, collected = ctx.SimpleQueue(), ctx.Event()
    context = mp.spawn(_spawned, args=(world_size, free_port(), fn, fn_args, results, collected),
                       nprocs=world_size, join=False)
    values = {}
    while len(values) < world_size:
        if not results.empty():
            rank, value = results.get()
            values[rank] = value
        elif context.join(timeout=0.05):
            break  # all processes ended early: join raised if one failed
    collected.set()
    context.join()
    if len(values) < world_size:
        raise RuntimeError(f"only ranks {sorted(values)} of {world_size} returned a result")
    return [values[r] for r in range(world_size)]
