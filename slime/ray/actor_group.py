"""Driver-side handle on the trainer processes: one Ray actor per process, one torch.distributed group.

``TrainerGroup(args)`` starts ``actor_num_nodes * actor_num_gpus_per_node`` actors (1 CPU each on a CPU
machine, 1 GPU each when CUDA is available), packed into a placement group so ranks sit together.
Rank 0 picks its node's address and a free port; every actor then joins the group (gloo on CPU,
nccl on GPU) and builds its ``FSDPActor``.

Sharding: every call hands the SAME rollout batch to all actors (one object in Ray's store, shared),
and each actor takes its share by the deterministic plan in ``slime.backends.fsdp_utils.data_plan``.
Advantages are computed over the gathered full batch inside the trainer, so groups of
``n_samples_per_prompt`` never need to stay on one rank and the driver does no reward normalisation.
"""

from __future__ import annotations

import contextlib
import logging
import os

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

logger = logging.getLogger(__name__)


def _package_root() -> str:
    import slime

    return os.path.dirname(os.path.dirname(os.path.abspath(slime.__file__)))


def trainer_runtime_env() -> dict | None:
    """The trainer workers' runtime_env: this package on their PYTHONPATH. None when they inherit it: a local
    cluster this process started (its workers get this process's environment) with the package already on
    PYTHONPATH (train.py puts it there). A runtime_env makes Ray start a dedicated worker through its agent,
    which measured 3x the first actor's start (benchmarks/ray_start.py)."""
    import ray

    root = _package_root()
    node = ray._private.worker._global_node  # None when connected to a cluster this process did not start
    if node is not None and node.is_head() and root in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        return None
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}}


def trainer_class(backend: str):
    """The per-process trainer of ``--train-backend`` (imported lazily: Megatron is optional)."""
    if backend == "megatron":
        from slime.backends.megatron_utils.actor import MegatronActor

        return MegatronActor
    from slime.backends.fsdp_utils.actor import FSDPActor

    return FSDPActor


class TrainerWorker:
    """One trainer process (wrapped by ``ray.remote`` in :class:`TrainerGroup`)."""

    def __init__(self, args, rank: int, world_size: int):
        self.args, self.rank, self.world_size = args, rank, world_size
        self.actor = None

    def address(self) -> tuple[str, int]:
        from slime.backends.fsdp_utils.launch import free_port

        return ray.util.get_node_ip_address(), free_port()

    def setup(self, master_addr: str, master_port: int) -> bool:
        import transformers

        from slime.backends.fsdp_utils.launch import init_distributed

        transformers.utils.logging.disable_progress_bar()
        init_distributed(self.rank, self.world_size, master_addr, master_port)
        self.actor = trainer_class(self.args.train_backend)(self.args, self.rank, self.world_size)
        return True

    def train(self, rollout_id, samples, kl_coef):
        metrics = self.actor.train(rollout_id, samples, kl_coef)
        return metrics if self.rank == 0 else None

    def save(self, path):
        self.actor.save(path)

    def load(self, path):
        self.actor.load(path)

    def export_hf(self, path):
        self.actor.export_hf(path)

    def close(self):
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        return True


class TrainerGroup:
    def __init__(self, args, role: str = "actor"):
        import torch

        self.args, self.role = args, role
        self.world_size = args.actor_num_nodes * args.actor_num_gpus_per_node
        use_gpu = torch.cuda.is_available() and bool(ray.cluster_resources().get("GPU", 0))
        bundle = {"CPU": 1, "GPU": 1} if use_gpu else {"CPU": 1}
        self._workers = []
        self._pg = placement_group([dict(bundle) for _ in range(self.world_size)], strategy="PACK")
        try:
            self._start(args, use_gpu)
        except BaseException:  # Ctrl-C or a failed setup: no actor or reserved bundle outlives the attempt
            self.shutdown()
            raise

    def _start(self, args, use_gpu: bool) -> None:
        ray.get(self._pg.ready())
        runtime_env = trainer_runtime_env()
        remote_cls = ray.remote(TrainerWorker)
        self._workers = [
            remote_cls.options(num_cpus=1, num_gpus=1 if use_gpu else 0, runtime_env=runtime_env,
                               scheduling_strategy=PlacementGroupSchedulingStrategy(
                                   placement_group=self._pg, placement_group_bundle_index=rank))
            .remote(args, rank, self.world_size)
            for rank in range(self.world_size)
        ]
        addr, port = ray.get(self._workers[0].address.remote())
        if args.actor_num_nodes == 1:
            addr = "127.0.0.1"
        ray.get([w.setup.remote(addr, port) for w in self._workers])

    def _all(self, method: str, *call_args):
        return ray.get([getattr(w, method).remote(*call_args) for w in self._workers])

    def train(self, rollout_id: int, samples, kl_coef: float | None = None) -> dict:
        """Train on one rollout batch; ``kl_coef`` is the reward-side coefficient (default ``--kl-coef``)."""
        coef = self.args.kl_coef if kl_coef is None else float(kl_coef)
        ref = ray.put(list(samples))
        return self._all("train", rollout_id, ref, coef)[0]

    def save(self, path: str) -> None:
        self._all("save", str(path))

    def load(self, path: str) -> None:
        self._all("load", str(path))

    def export_hf(self, path: str) -> None:
        self._all("export_hf", str(path))

    def shutdown(self, timeout: float = 30.0) -> None:
        """Leave torch.distributed, then kill the actors and free their bundles, whatever state they are in.

        Never raises: after Ctrl-C (which reaches the actors too from a terminal) or a failed step, the actors
        may be dead or stuck; the error that stopped the run is the one to report."""
        workers, self._workers = self._workers, []
        pg, self._pg = self._pg, None
        if workers:
            try:
                ray.get([w.close.remote() for w in workers], timeout=timeout)
            except Exception as err:  # noqa: BLE001 - dead or hung actors are killed below
                logger.debug("trainer close before kill failed: %r", err)
        for worker in workers:
            with contextlib.suppress(Exception):
                ray.kill(worker)
        if pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)
