"""Rollout engines on GPUs that Ray reserves for them, disjoint from the trainer's (this project's runtime).

With ``--rollout-backend sglang`` on a Ray cluster that has GPUs, the engines are not pinned by hand
(``--base-gpu-id`` inside devices Ray also hands to the trainer): a placement group reserves
``--rollout-num-gpus-per-engine`` GPUs per engine, and one :class:`EngineHost` actor per bundle holds
them and runs the server as its child process. Ray sets the actor's ``CUDA_VISIBLE_DEVICES`` to exactly
the devices it was given and the server inherits it, so it counts from 0 within them (no
``--base-gpu-id``). The trainer's placement group, created after, gets other devices. The server dies
with its host actor (``processes.py``), and the actor with the run.

A cluster without enough GPUs for both is refused before anything waits on it (a placement group that
cannot be placed would otherwise wait forever).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)


class PlacementError(RuntimeError):
    """Ray cannot give the engines and the trainer the GPUs they need."""


def ray_gpus() -> float:
    import ray

    return float(ray.cluster_resources().get("GPU", 0)) if ray.is_initialized() else 0.0


def check_capacity(args, available: float) -> None:
    """Engines and trainer need disjoint GPUs: refuse a cluster that has too few."""
    engines = int(args.rollout_num_gpus or args.rollout_num_gpus_per_engine)
    trainer = int(args.actor_num_nodes * args.actor_num_gpus_per_node)
    if engines + trainer > available:
        raise PlacementError(f"Ray offers {available:g} GPU(s) but the rollout engines need {engines} "
                             f"(--rollout-num-gpus) and the trainer {trainer} (--actor-num-nodes x "
                             "--actor-num-gpus-per-node), on separate devices; start Ray with more GPUs or "
                             "ask for fewer")


class EngineHost:
    """One engine's GPUs (a Ray actor) and the server process that runs on them."""

    def __init__(self):
        self.engine = None

    def start(self, args, model_path: str, log_dir: str) -> tuple[str, str]:
        """Start the server on this actor's devices; returns (base URL, CUDA_VISIBLE_DEVICES)."""
        import ray

        from slime.backends.sglang_utils.launcher import EngineProcess, build_engine_command, find_free_port

        host = args.engine_host
        port = find_free_port(host)
        # Ray holds GPUs for this engine: the GPU command, whatever this actor's torch sees.
        cmd = build_engine_command(args, model_path=model_path, host=host, port=port, cpu=False)
        url_host = ray.util.get_node_ip_address() if host in ("0.0.0.0", "::") else host
        self.engine = EngineProcess(cmd, host=url_host, port=port,
                                    log_path=Path(log_dir) / f"engine_{url_host}_{port}.log")
        return self.engine.url, os.environ.get("CUDA_VISIBLE_DEVICES", "")

    def wait_healthy(self, timeout: float) -> bool:
        self.engine.wait_healthy(timeout)
        return True

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()


class RayEngine:
    """Driver-side handle with :class:`~slime.backends.sglang_utils.launcher.EngineProcess`'s interface."""

    def __init__(self, actor, url: str, devices: str):
        self.actor, self.url, self.devices = actor, url, devices

    def wait_healthy(self, timeout: float = 300.0) -> "RayEngine":
        import ray

        ray.get(self.actor.wait_healthy.remote(timeout))
        return self

    def stop(self) -> None:
        import ray

        try:
            ray.get(self.actor.stop.remote(), timeout=60)
        finally:
            ray.kill(self.actor)


def start_engines_in_ray(args, count: int, model_path: str, log_dir: str, *, ready_timeout: float = 120.0):
    """Reserve ``count`` engines' GPUs and start one server in each; returns (engines, placement group)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    check_capacity(args, ray_gpus())
    per_engine = int(args.rollout_num_gpus_per_engine)
    group = placement_group([{"CPU": 1, "GPU": per_engine} for _ in range(count)], strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=ready_timeout)
    if not ready:
        remove_placement_group(group)
        raise PlacementError(f"Ray could not reserve {count} x {per_engine} GPU(s) for the rollout engines within "
                             f"{ready_timeout:g} s (are other jobs holding GPUs?)")
    remote_cls = ray.remote(EngineHost)
    actors = [remote_cls.options(num_cpus=1, num_gpus=per_engine, scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=group, placement_group_bundle_index=i)).remote() for i in range(count)]
    try:
        started = ray.get([actor.start.remote(args, model_path, log_dir) for actor in actors])
    except BaseException:
        for actor in actors:
            ray.kill(actor)
        remove_placement_group(group)
        raise
    engines = [RayEngine(actor, url, devices) for actor, (url, devices) in zip(actors, started)]
    logger.info("rollout engines on Ray-reserved GPUs: %s", {e.url: e.devices for e in engines})
    return engines, group
