"""--kl-ctrl adaptive on CPU: the controller's rule and state, the flags' validation, and the kl_coef hand-in of
compute_advantages_and_returns (bit-identical results when nothing new is asked)."""

import logging
import math
import random
import sys
import types
from argparse import Namespace

import pytest
import torch
from test_megatron_argument_validation import load_slime_arguments_module, make_slime_validate_args

from slime.utils.kl_controller import (
    AdaptiveKLController,
    build_kl_controller,
    restore_kl_controller,
    save_kl_controller,
    step_kl_controller,
)

NUM_GPUS = 0


def reference_update(value, observed, target, n_steps, horizon):
    """Ziegler et al.'s rule, written out independently of the controller."""
    error = observed / target - 1
    if error > 0.2:
        error = 0.2
    if error < -0.2:
        error = -0.2
    return value * (1 + error * n_steps / horizon)


def test_adaptive_follows_the_rule_against_a_reference():
    rng = random.Random(0)
    ctrl = AdaptiveKLController(init_kl_coef=0.05, target_kl=0.1, horizon=1000)
    expected = 0.05
    for _ in range(200):
        observed, n_steps = rng.uniform(0.0, 0.4), rng.randint(1, 256)
        expected = reference_update(expected, observed, 0.1, n_steps, 1000)
        used = ctrl.value
        metrics = ctrl.update(observed, n_steps)
        assert ctrl.value == pytest.approx(expected, rel=1e-12)
        # kl_ctrl/coef is the value this step's rewards used, everywhere; the updated one is next_coef
        assert metrics["kl_ctrl/coef"] == used and metrics["kl_ctrl/next_coef"] == ctrl.value
        assert metrics["kl_ctrl/observed_kl"] == observed and metrics["kl_ctrl/target_kl"] == 0.1
        assert abs(metrics["kl_ctrl/error"]) <= 0.2
        assert metrics["kl_ctrl/clipped"] == float(abs(observed / 0.1 - 1) > 0.2)


def test_direction_and_bound_of_one_step():
    up = AdaptiveKLController(0.1, target_kl=0.1, horizon=100)
    up.update(10.0, 10)  # far above the target: the error is clipped to +0.2
    assert up.value == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))
    down = AdaptiveKLController(0.1, target_kl=0.1, horizon=100)
    down.update(0.0, 10)
    assert down.value == pytest.approx(0.1 * (1 - 0.2 * 10 / 100))
    still = AdaptiveKLController(0.1, target_kl=0.1, horizon=100)
    assert still.update(0.1, 10)["kl_ctrl/clipped"] == 0.0 and still.value == pytest.approx(0.1)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_kl_is_refused_and_the_value_kept(bad):
    ctrl = AdaptiveKLController(0.05, target_kl=0.1, horizon=1000)
    ctrl.update(0.2, 64)
    before = ctrl.state_dict()
    with pytest.raises(ValueError, match="not finite"):
        ctrl.update(bad, 64)
    assert ctrl.state_dict() == before


@pytest.mark.parametrize(
    "kwargs", [dict(init_kl_coef=0), dict(target_kl=0), dict(horizon=-1), dict(target_kl=math.nan)]
)
def test_constructor_refuses_non_positive_settings(kwargs):
    settings = dict(init_kl_coef=0.05, target_kl=0.1, horizon=1000)
    settings.update(kwargs)
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        AdaptiveKLController(**settings)


def test_build_from_args():
    ctrl = build_kl_controller(Namespace(kl_ctrl="adaptive", kl_coef=0.01, kl_target=0.2, kl_horizon=500))
    assert (ctrl.value, ctrl.target, ctrl.horizon) == (0.01, 0.2, 500)


def _load(path, finetune=False):
    return Namespace(load=None if path is None else str(path), finetune=finetune)


def test_save_and_resume_through_the_actor_functions(tmp_path, caplog):
    ctrl = AdaptiveKLController(0.05, target_kl=0.1, horizon=100)
    values = []
    for rollout_id, observed in enumerate((0.3, 0.25, 0.02)):
        ctrl.update(observed, 16)
        save_kl_controller(ctrl, str(tmp_path), rollout_id)
        values.append(ctrl.value)
    assert sorted(p.name for p in (tmp_path / "kl_ctrl").iterdir()) == [
        f"kl_ctrl_state_dict_{i}.json" for i in range(3)
    ]  # written through a temporary file that is renamed away
    resumed = AdaptiveKLController(0.05, target_kl=0.1, horizon=100)
    with caplog.at_level(logging.WARNING):
        state = restore_kl_controller(resumed, _load(tmp_path), 1)  # the iteration loaded (--ckpt-step 1)
    assert resumed.value == values[1] == state["value"] and not caplog.records
    assert step_kl_controller(resumed, 0.02, 16)["kl_ctrl/coef"] == values[1]  # the value used by the step
    assert resumed.value == values[2]

    fresh = AdaptiveKLController(0.05, target_kl=0.1, horizon=100)
    with caplog.at_level(logging.WARNING):
        assert restore_kl_controller(fresh, _load(tmp_path), 7) is None  # no state saved: start from --kl-coef
    assert fresh.value == 0.05
    assert [r.getMessage() for r in caplog.records] == [
        f"no KL controller state at {tmp_path}/kl_ctrl/kl_ctrl_state_dict_7.json; the KL coefficient starts from "
        "--kl-coef"
    ]


def test_a_resume_with_new_settings_keeps_the_coefficient_and_says_so(tmp_path, caplog):
    saved = AdaptiveKLController(0.05, target_kl=0.1, horizon=100)
    saved.update(0.3, 16)
    save_kl_controller(saved, str(tmp_path), 3)
    resumed = AdaptiveKLController(0.05, target_kl=0.2, horizon=400)
    with caplog.at_level(logging.WARNING):
        restore_kl_controller(resumed, _load(tmp_path), 3)
    assert (resumed.value, resumed.target, resumed.horizon) == (saved.value, 0.2, 400)
    (record,) = caplog.records
    assert "--kl-target 0.1 -> 0.2, --kl-horizon 100.0 -> 400.0" in record.getMessage()


@pytest.mark.parametrize("args", [_load(None), _load("saved", finetune=True)])
def test_no_restore_without_load_or_with_finetune(tmp_path, args):
    ctrl = AdaptiveKLController(0.05, target_kl=0.1, horizon=100)
    ctrl.update(0.3, 16)
    save_kl_controller(ctrl, str(tmp_path / "saved"), 0)
    if args.load is not None:
        args.load = str(tmp_path / args.load)
    fresh = AdaptiveKLController(0.05, target_kl=0.1, horizon=100)
    assert restore_kl_controller(fresh, args, 0) is None and fresh.value == 0.05


def test_a_step_without_samples_leaves_the_coefficient_alone():
    ctrl = AdaptiveKLController(0.05, target_kl=0.1, horizon=100)
    assert step_kl_controller(ctrl, None, 0) == {"kl_ctrl/coef": 0.05}
    assert ctrl.value == 0.05
    metrics = step_kl_controller(ctrl, 0.3, 16)
    assert metrics["kl_ctrl/coef"] == 0.05 and ctrl.value > 0.05 and metrics["kl_ctrl/error"] == 0.2


# ---------------------------------------------------------------------------- slime_validate_args
def _adaptive(**overrides):
    values = dict(
        advantage_estimator="ppo",
        kl_ctrl="adaptive",
        kl_coef=0.01,
        kl_target=0.1,
        kl_horizon=None,
        ref_load=None,
        custom_advantage_function_path=None,
        compute_advantages_and_returns=True,
    )
    values.update(overrides)
    return values


@pytest.mark.parametrize(
    "overrides,flag",
    [
        (dict(advantage_estimator="grpo"), "--use-kl-loss"),
        (dict(advantage_estimator="reinforce_plus_plus", normalize_advantages=True), "--advantage-estimator ppo"),
        (dict(kl_coef=0), "--kl-coef"),
        (dict(kl_coef=-0.1), "--kl-coef"),
        (dict(kl_coef=math.inf), "--kl-coef"),
        (dict(kl_coef=math.nan), "--kl-coef"),
        (dict(kl_target=None), "--kl-target"),
        (dict(kl_target=0.0), "--kl-target"),
        (dict(kl_target=-1.0), "--kl-target"),
        (dict(kl_target=math.nan), "--kl-target"),
        (dict(kl_target=math.inf), "--kl-target"),
        (dict(kl_horizon=0), "--kl-horizon"),
        (dict(kl_horizon=-5), "--kl-horizon"),
        (dict(kl_horizon=math.nan), "--kl-horizon"),
        (dict(kl_horizon=math.inf), "--kl-horizon"),
        (dict(kl_ctrl="fixed", kl_target=0.1), "--kl-target"),
        (dict(kl_ctrl="fixed", kl_target=None, kl_horizon=500), "--kl-horizon"),
        (dict(custom_advantage_function_path="my.adv"), "--custom-advantage-function-path"),
        (dict(compute_advantages_and_returns=False), "--disable-compute-advantages-and-returns"),
        (dict(rollout_batch_size=8, n_samples_per_prompt=4, kl_horizon=31), "--kl-horizon"),
        (dict(rollout_batch_size=1024, n_samples_per_prompt=16), r"--kl-horizon \(10000, the default\)"),
    ],
)
def test_validation_refuses_each_bad_setting(monkeypatch, tmp_path, overrides, flag):
    module = load_slime_arguments_module(monkeypatch)
    args = make_slime_validate_args(**_adaptive(ref_load=str(tmp_path), **overrides))
    with pytest.raises(ValueError, match=flag):
        module.slime_validate_args(args)


def test_validation_accepts_adaptive_ppo_with_a_reference(monkeypatch, tmp_path, caplog):
    module = load_slime_arguments_module(monkeypatch)
    args = make_slime_validate_args(**_adaptive(ref_load=str(tmp_path), rollout_batch_size=1024))
    with caplog.at_level(logging.WARNING):
        module.slime_validate_args(args)
    assert args.kl_ctrl == "adaptive" and args.use_critic and args.kl_horizon == 10000
    # 1024 samples a step is under 10x the default horizon: no warning, the user did not choose it
    assert not [r for r in caplog.records if "--kl-horizon" in r.getMessage()]
    batch = make_slime_validate_args(**_adaptive(ref_load=str(tmp_path), rollout_batch_size=8, n_samples_per_prompt=4))
    batch.kl_horizon = 32  # a step as large as the horizon is the largest accepted, with a warning
    with caplog.at_level(logging.WARNING):
        module.slime_validate_args(batch)
    assert [r for r in caplog.records if "--kl-horizon 32 is under 10x" in r.getMessage() and "20%" in r.getMessage()]


def test_roles_without_a_kl_controller_are_reset_to_fixed(monkeypatch):
    from slime.backends.megatron_utils.server.arguments import configure_megatron_server_args

    module = load_slime_arguments_module(monkeypatch)
    base = Namespace(kl_coef=0.01, kl_ctrl="adaptive", use_opd=False, custom_advantage_function_path=None)
    assert module._apply_megatron_role_overrides(base, {}, "actor").kl_ctrl == "adaptive"
    critic = module._apply_megatron_role_overrides(base, {}, "critic")
    assert (critic.kl_coef, critic.kl_ctrl) == (0, "fixed")
    server = make_slime_validate_args(**_adaptive())
    configure_megatron_server_args(server)
    assert (server.kl_coef, server.kl_ctrl) == (0, "fixed")


# ---------------------------------------------------------------------------- compute_advantages_and_returns
STUBBED = ("megatron", "megatron.core", "slime.backends.megatron_utils.loss", "slime.backends.megatron_utils.cp_utils")


def _import_loss_with_stub_mpu(monkeypatch):
    mpu_stub = types.SimpleNamespace(
        get_context_parallel_world_size=lambda: 1,
        get_context_parallel_rank=lambda: 0,
        get_context_parallel_group=lambda: None,
        get_tensor_model_parallel_rank=lambda: 0,
        is_pipeline_last_stage=lambda: True,
    )
    megatron_mod = types.ModuleType("megatron")
    core_mod = types.ModuleType("megatron.core")
    core_mod.mpu = mpu_stub
    monkeypatch.setitem(sys.modules, "megatron", megatron_mod)
    monkeypatch.setitem(sys.modules, "megatron.core", core_mod)
    for name in ("slime.backends.megatron_utils.loss", "slime.backends.megatron_utils.cp_utils"):
        monkeypatch.setitem(sys.modules, name, None)  # so that teardown removes what the import below adds
        del sys.modules[name]
    from slime.backends.megatron_utils import loss

    return loss


@pytest.fixture
def loss_module(monkeypatch):
    return _import_loss_with_stub_mpu(monkeypatch)


def test_the_stubbed_loss_module_is_removed_again():
    before = {name: sys.modules.get(name) for name in STUBBED}
    with pytest.MonkeyPatch.context() as mp:
        loss = _import_loss_with_stub_mpu(mp)
        assert sys.modules["slime.backends.megatron_utils.loss"] is loss
    assert {name: sys.modules.get(name) for name in STUBBED} == before


def _rollout(seed):
    gen = torch.Generator().manual_seed(seed)
    lengths = [3, 5, 4]
    return {
        "log_probs": [-torch.rand(n, generator=gen) for n in lengths],
        "ref_log_probs": [-torch.rand(n, generator=gen) for n in lengths],
        "rewards": [1.0, -0.5, 0.25],
        "values": [torch.rand(n, generator=gen) for n in lengths],
        "response_lengths": lengths,
        "total_lengths": [n + 2 for n in lengths],
        "loss_masks": [torch.tensor([1.0] * (n - 1) + [0.0]) for n in lengths],
    }


def _args(estimator, kl_coef):
    return Namespace(
        advantage_estimator=estimator,
        kl_coef=kl_coef,
        kl_loss_type="k1",
        use_rollout_logprobs=False,
        custom_advantage_function_path=None,
        normalize_advantages=False,
        use_opd=False,
        gamma=1.0,
        lambd=1.0,
    )


ESTIMATORS = ["ppo", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_kl_coef_none_equals_handing_in_args_kl_coef(loss_module, estimator):
    default, explicit = _rollout(1), _rollout(1)
    loss_module.compute_advantages_and_returns(_args(estimator, 0.05), default)
    loss_module.compute_advantages_and_returns(_args(estimator, 0.05), explicit, kl_coef=0.05)
    for key in ("advantages", "returns", "kl"):
        for a, b in zip(default[key], explicit[key], strict=True):
            assert torch.equal(a, b), (estimator, key)
    expected_kl = [lp - ref for lp, ref in zip(default["log_probs"], default["ref_log_probs"], strict=True)]
    for got, want in zip(default["kl"], expected_kl, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("estimator", ["ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_handed_in_kl_coef_replaces_args_kl_coef(loss_module, estimator):
    handed, from_args, default = _rollout(2), _rollout(2), _rollout(2)
    loss_module.compute_advantages_and_returns(_args(estimator, 0.05), handed, kl_coef=0.4)
    loss_module.compute_advantages_and_returns(_args(estimator, 0.4), from_args)
    loss_module.compute_advantages_and_returns(_args(estimator, 0.05), default)
    for a, b in zip(handed["advantages"], from_args["advantages"], strict=True):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, c) for a, c in zip(handed["advantages"], default["advantages"], strict=True))


def test_ppo_reward_shaping_uses_the_handed_in_coefficient(loss_module):
    data = _rollout(3)
    data["values"] = [torch.zeros(n) for n in data["response_lengths"]]
    loss_module.compute_advantages_and_returns(_args("ppo", 0.05), data, kl_coef=0.3)
    for kl, reward, returns in zip(data["kl"], data["rewards"], data["returns"], strict=True):
        shaped = -0.3 * kl
        shaped[-1] += reward
        expected = torch.flip(torch.cumsum(torch.flip(shaped, [0]), 0), [0])  # gamma = lambda = 1, values 0
        torch.testing.assert_close(returns, expected)


def test_ci_check_finds_the_coefficient_the_rewards_were_shaped_with(loss_module, monkeypatch):
    monkeypatch.setitem(sys.modules, "megatron.core.distributed", types.SimpleNamespace(DistributedDataParallel=None))
    from slime.backends.megatron_utils.ci_utils import check_reward_kl_coef

    data = _rollout(4)
    loss_module.compute_advantages_and_returns(_args("ppo", 0.05), data, kl_coef=0.3)
    check_reward_kl_coef(_args("ppo", 0.05), data, 0.3, 1)
    with pytest.raises(AssertionError, match="fitted KL coefficient 0.3"):
        check_reward_kl_coef(_args("ppo", 0.05), data, 0.05, 1)  # --kl-coef, not the value handed in
    with pytest.raises(AssertionError, match="gamma 1"):  # returns are no sums of rewards: no fit possible
        check_reward_kl_coef(Namespace(gamma=0.9, lambd=1.0), data, 0.05, 1)
    zero = {**_rollout(4), "ref_log_probs": _rollout(4)["log_probs"]}  # no KL to fit: allowed at rollout 0 only
    loss_module.compute_advantages_and_returns(_args("ppo", 0.05), zero, kl_coef=0.3)
    check_reward_kl_coef(_args("ppo", 0.05), zero, 0.3, 0)
    with pytest.raises(AssertionError, match="no KL to fit"):
        check_reward_kl_coef(_args("ppo", 0.05), zero, 0.3, 2)


def test_observed_kl_is_the_mean_of_per_sample_masked_means(loss_module, monkeypatch):
    monkeypatch.setattr(loss_module.dist, "all_reduce", lambda tensor, group=None: None)
    data = {
        "kl": [torch.tensor([1.0, 3.0, 100.0]), torch.tensor([4.0, 4.0, 4.0, 4.0, 4.0, 4.0])],
        "loss_masks": [torch.tensor([1.0, 1.0, 0.0]), torch.ones(6)],
        "response_lengths": [3, 6],
        "total_lengths": [5, 8],
    }
    observed, count = loss_module.reduce_observed_kl(data, group=None)
    # Samples' means 2 and 4: their mean is 3; the token mean would be 28 / 8 = 3.5. The masked 100 does not count.
    assert count == 2 and observed == pytest.approx(3.0)
    # A removed sample (all-zero loss mask) has no KL: it is not counted as a KL of 0.
    removed = {key: [*value, value[1]] for key, value in data.items()}
    removed["loss_masks"][-1] = torch.zeros(6)
    assert loss_module.reduce_observed_kl(removed, group=None) == (pytest.approx(3.0), 2)
    assert loss_module.reduce_observed_kl({}, group=None) == (None, 0)
    empty = {"kl": [], "loss_masks": [], "response_lengths": [], "total_lengths": []}
    assert loss_module.reduce_observed_kl(empty, group=None) == (None, 0)
    monkeypatch.setattr(loss_module.mpu, "get_tensor_model_parallel_rank", lambda: 1)
    assert loss_module.reduce_observed_kl(data, group=None) == (None, 0)  # TP rank 1 holds a copy: adds nothing


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__]))
