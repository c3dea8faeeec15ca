"""--kl-ctrl adaptive through MegatronTrainRayActor's own init, train_actor and save_model, on CPU with gloo.

Megatron is stubbed as in the other CPU tests (``megatron.core.mpu`` from ``_cp_dist_helpers``), and so are the
model, its forward passes and the weight updater; the actor's code between them runs as it is: the controller it
builds, the coefficient it hands to ``compute_advantages_and_returns``, the KL it reduces and the step it takes on
every rank, the state it saves with a checkpoint. A default ``--kl-ctrl fixed`` run must
stay as before: no controller, no extra collective, no extra file, the same advantages and metrics.
"""

import json
import os
import sys
import time
import types
from argparse import Namespace

import _cp_dist_helpers  # noqa: F401  (installs the megatron stub before slime is imported)
import pytest
import torch
from _cp_dist_helpers import free_port, init_worker_process_group

NUM_GPUS = 0

INIT, TARGET, HORIZON = 0.05, 0.02, 16.0
STEPS = 3
# (response_length, masked tail) per sample on each of the two ranks: rank 0's KL is far above the target, rank
# 1's below it, so a rank that steps on its own KL moves the other way than the reduced one.
LAYOUT = {0: [(6, 2), (3, 0)], 1: [(4, 1), (9, 3), (5, 0)]}
KL_LEVEL = {0: 0.08, 1: 0.01}
SAVED_ROLLOUT = 4
FIXED = dict(kl_ctrl="fixed", kl_target=None, kl_horizon=None)  # the defaults
# A hang fails the test after this many seconds; a slow runner only waits longer. Raise it on a loaded machine.
DEADLINE_S = float(os.environ.get("SLIME_TEST_KL_CTRL_DEADLINE", "900"))


def _samples(rank, rollout_id):
    """Rank ``rank``'s samples of a step: policy and reference log-probs, masks, rewards, critic values."""
    gen = torch.Generator().manual_seed(100 * rollout_id + rank)
    out = {key: [] for key in ("log_probs", "ref_log_probs", "loss_masks", "values", "response_lengths")}
    for length, masked in LAYOUT[rank]:
        ref = -torch.rand(length, generator=gen) - 0.5
        out["ref_log_probs"].append(ref)
        out["log_probs"].append(ref + KL_LEVEL[rank] * 2 * torch.rand(length, generator=gen))
        out["loss_masks"].append(torch.tensor([1] * (length - masked) + [0] * masked, dtype=torch.int))
        out["values"].append(torch.rand(length, generator=gen))
        out["response_lengths"].append(length)
    out["total_lengths"] = [n + 3 for n in out["response_lengths"]]
    out["rewards"] = [float(i % 2) for i in range(len(LAYOUT[rank]))]
    return out


def _expected_coefficients(start, first_rollout, steps):
    """The coefficient used at each step and the one after the last, from every rank's samples at once."""
    used, value = [], start
    for rollout_id in range(first_rollout, first_rollout + steps):
        used.append(value)
        means = []
        for rank in LAYOUT:
            data = _samples(rank, rollout_id)
            for lp, ref, mask in zip(data["log_probs"], data["ref_log_probs"], data["loss_masks"], strict=True):
                means.append(float(((lp - ref) * mask).sum() / mask.sum()))
        error = min(max(sum(means) / len(means) / TARGET - 1, -0.2), 0.2)
        value *= 1 + error * len(means) / HORIZON
    return used, value


# The actor's flags this test leaves off or unset.
OFF = (
    "normalize_advantages use_opd use_rollout_logprobs get_mismatch_metrics keep_old_actor use_routing_replay "
    "use_rollout_routing_replay debug_rollout_only offload_train no_load_optim no_load_rng finetune async_save "
    "use_pytorch_profiler record_memory_history ci_test"
).split()
UNSET = (
    "custom_advantage_function_path rollout_data_postprocess_path save_debug_train_data ref_update_interval "
    "ref_ckpt_step opd_teacher_ckpt_step ckpt_step load save_hf model_name"
).split()


def _args(save_dir, **overrides):
    values = {**dict.fromkeys(OFF, False), **dict.fromkeys(UNSET)}
    values.update(advantage_estimator="ppo", kl_coef=INIT, kl_ctrl="adaptive", kl_target=TARGET, kl_horizon=HORIZON)
    values.update(kl_loss_type="k1", use_critic=True, compute_advantages_and_returns=True, gamma=1.0, lambd=1.0)
    values.update(loss_type="policy_loss", save=save_dir, hf_checkpoint="unused", ref_load="unused", vocab_size=32)
    values.update(distributed_timeout_minutes=1, num_gpus_per_node=1, colocate=True, profile_target=[])
    values.update(update_weight_mode="full", update_weight_transport="nccl", **overrides)
    return Namespace(**values)


# ---------------------------------------------------------------------------- the stubbed actor (in each worker)
class _Calls:
    """What the stubs saw: the forward passes' outputs to give, the metrics logged, the checkpoints saved."""

    forward = {}
    perf = []
    saved = []
    loaded_rollout_id = -1


class _TrainRayActor:
    """TrainRayActor.init's part the actor reads; the worker sets up the process group itself."""

    def init(self, args, role, with_ref=False, with_opd_teacher=False):
        self.args, self.role = args, role


class _Backuper:
    """The actor's model copies by tag (TensorBackuper keeps them on the accelerator this image lacks)."""

    def __init__(self, **kwargs):
        self.backup_tags = set()

    def backup(self, tag):
        self.backup_tags.add(tag)

    def restore(self, tag):
        pass


class _WeightUpdater:
    def __init__(self, args, model, **kwargs):
        self.metrics = {"perf/update_weights_time": 0.5}

    def pop_metrics(self):
        out, self.metrics = self.metrics, {}
        return out


# The process-group reloading the actor does around sleep / wake-up (no model offload here).
NO_OPS = (
    "destroy_process_groups",
    "monkey_patch_torch_dist",
    "register_default_process_group",
    "reload_process_groups",
)


def _module(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def _import_actor():
    """Install the stubs the actor's imports need on this CPU image, then import the actor module."""
    import torch.distributed as dist
    from megatron.core import mpu

    mpu.is_pipeline_last_stage = lambda: True
    mpu.get_tensor_model_parallel_rank = lambda: 0
    mpu.get_pipeline_model_parallel_world_size = lambda: 1
    mpu.get_context_parallel_group = lambda: None
    mpu.get_virtual_pipeline_model_parallel_world_size = lambda: None
    mpu.get_data_parallel_world_size = lambda with_context_parallel=False: dist.get_world_size()
    mpu.get_data_parallel_rank = lambda with_context_parallel=False: dist.get_rank()

    def forward_only(fn, args, model, data_iterator, num_microbatches, store_prefix="", **kwargs):
        return {f"{store_prefix}log_probs": _Calls.forward[f"{store_prefix}log_probs"]}

    def initialize_model_and_optimizer(args, role):
        return [torch.nn.Linear(2, 2)], None, None, _Calls.loaded_rollout_id

    package = "slime.backends.megatron_utils"
    stubs = {
        "torch_memory_saver": _module("torch_memory_saver", torch_memory_saver=types.SimpleNamespace()),
        "slime.ray.train_actor": _module("slime.ray.train_actor", TrainRayActor=_TrainRayActor),
        "megatron.core.distributed": _module("megatron.core.distributed", DistributedDataParallel=object),
        "slime.utils.reloadable_process_group": _module(
            "slime.utils.reloadable_process_group",
            **dict.fromkeys(NO_OPS, lambda *args, **kwargs: None),
        ),
        f"{package}.checkpoint": _module(f"{package}.checkpoint", load_checkpoint=lambda *a, **k: (0, 0)),
        f"{package}.data": _module(
            f"{package}.data", DataIterator=object, get_data_iterator=lambda data: [data], tensors_to_gpu=list
        ),
        f"{package}.initialize": _module(
            f"{package}.initialize", init=lambda args: None, is_megatron_main_rank=lambda: False
        ),
        f"{package}.model": _module(
            f"{package}.model",
            forward_only=forward_only,
            initialize_model_and_optimizer=initialize_model_and_optimizer,
            save=lambda rollout_id, *model: _Calls.saved.append(rollout_id),
            train=lambda *args: None,
        ),
        f"{package}.update_weight.common": _module(
            f"{package}.update_weight.common", named_params_and_buffers=lambda *a, **k: iter([])
        ),
    }
    for name in ("disk", "distributed", "tensor"):
        cls = f"UpdateWeightFrom{name.capitalize()}"
        stubs[f"{package}.update_weight.update_weight_from_{name}"] = _module(name, **{cls: _WeightUpdater})
    sys.modules.update(stubs)
    from slime.backends.megatron_utils import actor

    actor.TensorBackuper = types.SimpleNamespace(create=_Backuper)
    actor.clear_memory = lambda **kwargs: None
    actor.AutoConfig = actor.AutoTokenizer = types.SimpleNamespace(from_pretrained=lambda *a, **k: None)
    actor.train_metric_utils = types.SimpleNamespace(
        log_rollout_data=lambda *args: None,
        log_perf_data=lambda rollout_id, args, extra_metrics=None: _Calls.perf.append(extra_metrics),
    )
    return actor


def _new_actor(actor_module, args, role="actor"):
    actor_module.Timer().start_time.pop("train_wait", None)  # one actor per process in a real run
    actor = actor_module.MegatronTrainRayActor()
    actor.init(args, role, with_ref=True)
    return actor


def _train_step(actor, rank, rollout_id):
    data = _samples(rank, rollout_id)
    _Calls.forward = {"log_probs": data.pop("log_probs"), "ref_log_probs": data.pop("ref_log_probs")}
    values = data.pop("values")
    rollout_data = {**data, "num_microbatches": [1], "global_batch_sizes": [5]}
    coef_before = None if actor.kl_ctrl is None else actor.kl_ctrl.value
    actor.train_actor(rollout_id, rollout_data, external_data={"values": values})
    return rollout_data, coef_before


def _reward_side_kl_coefficient(rollout_data):
    """The coefficient the step's returns were shaped with. With gamma = lambd = 1 a PPO return is the sum of the
    rewards from its token on, so from one response token to the next it grows by ``kl_coef * kl``."""
    slopes = []
    for returns, kl in zip(rollout_data["returns"], rollout_data["kl"], strict=True):
        drops = (returns[1:] - returns[:-1]).double()
        slopes.append(float((drops * kl[:-1]).sum() / (kl[:-1].double() ** 2).sum()))
    return slopes


def _adaptive_run(actor_module, rank, save_dir):
    actor = _new_actor(actor_module, _args(save_dir))
    steps = []
    for rollout_id in range(STEPS):
        rollout_data, coef_before = _train_step(actor, rank, rollout_id)
        slopes, value_after = _reward_side_kl_coefficient(rollout_data), actor.kl_ctrl.value
        steps.append(dict(coef_before=coef_before, slopes=slopes, value_after=value_after, metrics=_Calls.perf[-1]))
    actor.save_model(SAVED_ROLLOUT)
    critic = _new_actor(actor_module, _args(save_dir), role="critic")
    return dict(steps=steps, saved=_Calls.saved, critic_kl_ctrl=critic.kl_ctrl)


def _fixed_run(actor_module, rank, save_dir):
    import torch.distributed as dist

    from slime.backends.megatron_utils.loss import compute_advantages_and_returns

    collectives = []
    actor_module.reduce_observed_kl = lambda *args: collectives.append("reduce_observed_kl") or (None, 0)
    all_reduce = dist.all_reduce
    dist.all_reduce = lambda *args, **kwargs: collectives.append("all_reduce") or all_reduce(*args, **kwargs)
    actor = _new_actor(actor_module, _args(save_dir, **FIXED))
    rollout_data, _ = _train_step(actor, rank, 0)
    _train_step(actor, rank, 1)
    actor.save_model(SAVED_ROLLOUT)
    dist.all_reduce = all_reduce

    # The same samples through compute_advantages_and_returns with nothing new asked.
    data = _samples(rank, 0)
    compute_advantages_and_returns(_args(save_dir, **FIXED), data)
    same = {key: all(map(torch.equal, rollout_data[key], data[key])) for key in ("returns", "advantages", "kl")}
    return dict(kl_ctrl=actor.kl_ctrl, collectives=collectives, same=same, perf=_Calls.perf)


def _worker(rank, world_size, port, run, save_dir, out_dir):
    import torch.distributed as dist

    from slime.utils.distributed_utils import init_gloo_group

    def mark(where):  # where this rank is, so a timeout names the rank that never got past a collective
        with open(os.path.join(out_dir, f"rank{rank}.where"), "w") as f:
            f.write(where)

    def marked(fn, name):
        def call(*args, **kwargs):
            mark(f"inside {name}")
            result = fn(*args, **kwargs)
            mark(f"past {name}")
            return result

        return call

    mark("starting")
    init_worker_process_group(rank, world_size, port)
    init_gloo_group()
    try:
        actor_module = _import_actor()
        for name in ("reduce_observed_kl", "step_kl_controller", "restore_kl_controller"):
            setattr(actor_module, name, marked(getattr(actor_module, name), f"{name} (the KL collectives)"))
        result = globals()[run](actor_module, rank, save_dir)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
        mark("done")
    finally:
        dist.destroy_process_group()


def _spawn(run, world_size, tmp_path):
    import torch.multiprocessing as mp

    save_dir, out_dir = tmp_path / "save", tmp_path / "out"
    out_dir.mkdir()
    args = (world_size, free_port(), run, str(save_dir), str(out_dir))
    ctx = mp.spawn(_worker, args=args, nprocs=world_size, join=False)
    deadline = time.time() + DEADLINE_S
    while not ctx.join(timeout=5):
        if time.time() > deadline:
            for p in ctx.processes:
                p.kill()
            where = {r: out_dir / f"rank{r}.where" for r in range(world_size)}
            where = {r: path.read_text() if path.exists() else "not started" for r, path in where.items()}
            stuck = ", ".join(f"rank {r} {w}" for r, w in where.items() if w != "done")
            pytest.fail(f"{run}: not finished after {DEADLINE_S:.0f} s (SLIME_TEST_KL_CTRL_DEADLINE): {stuck}")
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world_size)], save_dir


@pytest.fixture(scope="module")
def adaptive_run(tmp_path_factory):
    return _spawn("_adaptive_run", 2, tmp_path_factory.mktemp("adaptive"))


def test_every_rank_shapes_its_rewards_with_the_controllers_value(adaptive_run):
    results, _ = adaptive_run
    used, _ = _expected_coefficients(INIT, 0, STEPS)
    assert used[1] != pytest.approx(INIT, rel=1e-3), "the test needs a coefficient that moved"
    for r in results:
        for step, coef in zip(r["steps"], used, strict=True):
            assert step["coef_before"] == pytest.approx(coef, rel=1e-12)
            # Each sample's returns grew by the coefficient the controller held, not by --kl-coef.
            assert step["slopes"] == pytest.approx([coef] * len(step["slopes"]), rel=2e-3)


def test_every_rank_steps_the_controller_with_the_kl_of_all_ranks(adaptive_run):
    results, _ = adaptive_run
    used, last = _expected_coefficients(INIT, 0, STEPS)
    after = [*used[1:], last]
    for r in results:
        assert [s["value_after"] for s in r["steps"]] == pytest.approx(after, rel=1e-12)
        for step, coef in zip(r["steps"], used, strict=True):
            metrics = step["metrics"]
            assert metrics["kl_ctrl/coef"] == pytest.approx(coef, rel=1e-12)
            assert metrics["kl_ctrl/target_kl"] == TARGET
    assert results[0]["steps"][0]["metrics"]["perf/update_weights_time"] == 0.5  # the weight updater's, kept
    ranks = [[(step["value_after"], step["metrics"]) for step in r["steps"]] for r in results]
    assert ranks[0] == ranks[1]  # bit-identical on both ranks
    assert results[0]["critic_kl_ctrl"] is None  # the critic's kl_coef is 0: it has no controller


def test_the_state_is_saved_with_its_rollout(adaptive_run):
    # Restoring it is train_cpu's kl-adaptive case (slime's own actor, a resume) and test_kl_controller_cp.py.
    results, save_dir = adaptive_run
    _, last = _expected_coefficients(INIT, 0, STEPS)
    assert sorted(os.listdir(save_dir / "kl_ctrl")) == [f"kl_ctrl_state_dict_{SAVED_ROLLOUT}.json"]
    state = json.loads((save_dir / "kl_ctrl" / f"kl_ctrl_state_dict_{SAVED_ROLLOUT}.json").read_text())
    assert state["value"] == pytest.approx(last, rel=1e-12) and all(r["saved"] == [SAVED_ROLLOUT] for r in results)


def test_a_fixed_run_builds_no_controller_and_no_collective(tmp_path):
    results, save_dir = _spawn("_fixed_run", 1, tmp_path)
    (r,) = results
    assert r["kl_ctrl"] is None and r["collectives"] == []
    assert r["same"] == {"returns": True, "advantages": True, "kl": True}
    # log_perf_data gets the weight updater's metrics and nothing else.
    assert r["perf"] == [{"perf/update_weights_time": 0.5}, {}]
    assert not (save_dir / "kl_ctrl").exists()


def test_wandb_charts_the_kl_ctrl_metrics_on_the_rollout_step(monkeypatch):
    from fnmatch import fnmatch

    from slime.observability import wandb_utils

    registered = {}
    fake_wandb = types.SimpleNamespace(
        define_metric=lambda name, step_metric=None: registered.__setitem__(name, step_metric)
    )
    monkeypatch.setattr(wandb_utils, "wandb", fake_wandb)
    wandb_utils._init_wandb_common()
    for key in ("kl_ctrl/coef", "kl_ctrl/observed_kl", "kl_ctrl/target_kl", "kl_ctrl/error", "kl_ctrl/clipped"):
        steps = [step for pattern, step in registered.items() if fnmatch(key, pattern)]
        assert steps == ["rollout/step"], (key, registered)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__]))
