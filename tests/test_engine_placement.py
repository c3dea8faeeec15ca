"""SGLang engines on GPUs Ray reserves for them, never the trainer's (Ray with 4 declared GPUs on CPU; a
stand-in ``sglang.launch_server`` records the devices and flags it was given)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray

from slime.ray import engine_placement
from slime.ray.rollout import RolloutManager
from slime.utils.arguments import parse_args

FAKE_SGLANG = Path(__file__).parent / "fake_sglang"


def args_for(model, *extra):
    return parse_args(argv=["--hf-checkpoint", str(model), "--rollout-backend", "sglang", "--rollout-num-gpus", "2",
                            "--rollout-num-gpus-per-engine", "1", "--actor-num-gpus-per-node", "2", *extra])


def test_engines_and_trainer_need_disjoint_gpus():
    args = args_for("/m")
    engine_placement.check_capacity(args, 4)
    with pytest.raises(engine_placement.PlacementError, match="offers 3 GPU.*engines need 2.*trainer 2"):
        engine_placement.check_capacity(args, 3)


@ray.remote(num_cpus=0.1)
class Devices:
    def ids(self):
        return [str(i) for i in ray.get_gpu_ids()]


def test_engines_get_their_own_gpus(tmp_path, monkeypatch):
    import os

    model = "/models/not-loaded"  # the stand-in server loads nothing
    record = tmp_path / "record"
    monkeypatch.setenv("FAKE_SGLANG_RECORD", str(record))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKE_SGLANG), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("SLIME_ENGINE_LOG_DIR", str(tmp_path / "logs"))
    assert not ray.is_initialized()
    ray.init(num_cpus=4, num_gpus=4, include_dashboard=False, log_to_driver=False)
    manager = RolloutManager.__new__(RolloutManager)
    args = args_for(model, "--sglang-enable-deterministic-inference")
    manager.args, manager.engines, manager._engine_group, manager.needs_engines = args, [], None, True
    manager._router = None
    try:
        manager._start_engines()
        manager.wait_engines(timeout=240)
        assert len(manager.args.rollout_engine_urls) == 2
        # Two engines: the generate functions reach them through an sglang-router started in front of them.
        assert (manager.args.sglang_router_ip, manager.args.sglang_router_port) == ("127.0.0.1", manager._router.port)
        assert manager.engine_urls() == manager.args.rollout_engine_urls
        assert manager.args.engine_limits["rollout"]["deterministic"] is True
        runs = [json.loads(p.read_text()) for p in sorted(record.glob("*.json"))]
        engine_devices = [r["cuda_visible_devices"] for r in runs]
        assert sorted(engine_devices) == sorted(e.devices for e in manager.engines)
        assert len(set(engine_devices)) == 2 and all(len(d.split(",")) == 1 for d in engine_devices)
        assert all("--base-gpu-id" not in r["argv"] and "--enable-deterministic-inference" in r["argv"] for r in runs)
        # What the trainer's placement group gets now (TrainerGroup: one {"CPU": 1, "GPU": 1} bundle per rank).
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = placement_group([{"CPU": 1, "GPU": 1}] * 2, strategy="PACK")
        ray.get(group.ready(), timeout=60)
        ranks = [Devices.options(num_gpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=i)).remote() for i in range(2)]
        trainer_devices = [d for r in ranks for d in ray.get(r.ids.remote())]
        assert len(trainer_devices) == 2 and not set(trainer_devices) & set(engine_devices)
        for r in ranks:
            ray.kill(r)
        remove_placement_group(group)
    finally:
        manager.shutdown()
        ray.shutdown()


def test_gpu_script_spells_sglang_flags_out_and_keeps_the_teacher_outside_ray():
    import re

    script = (Path(__file__).parents[1] / "scripts/run-qwen3-8B-tcod-runtime.sh").read_text()
    launch = script[script.index("-m sglang.launch_server"):script.index("> \"${TEACHER_LOG}\"")]
    flags = set(re.findall(r"(--[a-z-]+)", launch))
    # Full SGLang 0.5.23 names only: "--tp" worked only as an argparse abbreviation of --tp-size.
    assert flags <= {"--model-path", "--host", "--port", "--tp-size", "--mem-fraction-static"}, flags
    assert "--tp-size" in flags and "--base-gpu-id" not in script
    assert 'TEACHER_DEVICES=$(seq -s, $(( NUM_GPUS - TEACHER_GPUS ))' in script  # the last devices...
    assert 'CUDA_VISIBLE_DEVICES=$(seq -s, 0 $(( TRAIN_GPUS - 1 )))' in script  # ...and Ray the others
    assert 'ray start --head --num-gpus "${TRAIN_GPUS}"' in script
