import math
from types import SimpleNamespace

import pytest

from slime.utils.kl_controller import AdaptiveKLController, FixedKLController, build_kl_controller


def adaptive(**kw):
    params = dict(init_kl_coef=0.1, target_kl=1.0, horizon=100.0, clip=0.2, coef_min=1e-6, coef_max=1e3)
    params.update(kw)
    return AdaptiveKLController(**params)


def test_sequence_of_updates_against_hand_computation():
    ctrl = adaptive()
    beta = 0.1
    # (observed KL, n_steps, error after the clip, clipped?)
    for observed, n, error, clipped in [(1.1, 10, 0.1, 0.0), (2.0, 10, 0.2, 1.0), (0.5, 20, -0.2, 1.0),
                                        (0.9, 5, -0.1, 0.0), (1.0, 50, 0.0, 0.0)]:
        beta *= 1 + error * n / 100.0
        stats = ctrl.update(observed, n)
        assert ctrl.value == pytest.approx(beta, rel=1e-12)
        assert stats["kl_ctrl/coef"] == pytest.approx(beta, rel=1e-12)
        assert stats["kl_ctrl/error"] == pytest.approx(error)
        assert stats["kl_ctrl/clipped"] == clipped
        assert stats["kl_ctrl/observed_kl"] == observed and stats["kl_ctrl/target_kl"] == 1.0
    assert ctrl.n_updates == 5


def test_bounds_hold():
    ctrl = adaptive(init_kl_coef=1.0, coef_max=1.01)
    for _ in range(10):
        ctrl.update(100.0, 100)
    assert ctrl.value == 1.01
    ctrl = adaptive(init_kl_coef=0.01, coef_min=0.009)
    for _ in range(10):
        ctrl.update(0.0, 100)
    assert ctrl.value == 0.009
    assert adaptive(init_kl_coef=5e3).value == 1e3  # the initial value is bounded too


@pytest.mark.parametrize("observed,n_steps", [(0.0, 10**9), (1e300, 10**9), (1e308, 10**12), (1.0, 10**15),
                                              (0.0, 1)])
def test_coefficient_stays_positive_and_finite_under_extreme_inputs(observed, n_steps):
    ctrl = adaptive(target_kl=1e-3, horizon=1.0)
    for _ in range(3):
        ctrl.update(observed, n_steps)
        assert math.isfinite(ctrl.value) and 1e-6 <= ctrl.value <= 1e3


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_observed_kl_is_rejected(bad):
    ctrl = adaptive()
    with pytest.raises(ValueError, match="not finite"):
        ctrl.update(bad, 10)
    assert ctrl.value == 0.1 and ctrl.n_updates == 0


@pytest.mark.parametrize("n_steps", [0, -5])
def test_non_positive_step_count_rejected(n_steps):
    with pytest.raises(ValueError, match="n_steps"):
        adaptive().update(1.0, n_steps)


@pytest.mark.parametrize("name", ["init_kl_coef", "target_kl", "horizon", "coef_min", "coef_max"])
@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_constructor_rejects_non_positive_or_non_finite(name, bad):
    with pytest.raises(ValueError, match=name):
        adaptive(**{name: bad})


@pytest.mark.parametrize("kw", [dict(clip=0.0), dict(clip=1.5), dict(coef_min=1.0, coef_max=1.0)])
def test_constructor_rejects_bad_clip_and_bounds(kw):
    with pytest.raises(ValueError):
        adaptive(**kw)


def test_state_round_trip_continues_identically():
    a = adaptive()
    for kl in (1.5, 0.7, 1.2):
        a.update(kl, 16)
    b = adaptive()
    b.load_state_dict(a.state_dict())
    assert b.value == a.value and b.n_updates == 3
    a.update(0.3, 16)
    b.update(0.3, 16)
    assert b.value == a.value
    with pytest.raises(ValueError, match="fixed"):
        FixedKLController(0.1).load_state_dict(a.state_dict())


def test_loaded_value_is_bounded():
    ctrl = adaptive(coef_max=2.0)
    ctrl.load_state_dict({"kind": "adaptive", "value": 50.0, "n_updates": 1})
    assert ctrl.value == 2.0


def test_fixed_controller_never_changes():
    ctrl = FixedKLController(0.05)
    for kl, n in [(100.0, 10**9), (0.0, 1), (1.0, 5)]:
        stats = ctrl.update(kl, n)
        assert ctrl.value == 0.05 and stats["kl_ctrl/coef"] == 0.05
    restored = FixedKLController(0.0)
    restored.load_state_dict(ctrl.state_dict())
    assert restored.value == 0.05
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            FixedKLController(bad)


def test_build_from_args():
    args = SimpleNamespace(kl_ctrl="adaptive", kl_coef=0.2, kl_target=6.0, kl_horizon=10000, kl_ctrl_clip=0.2,
                           kl_coef_min=1e-4, kl_coef_max=10.0)
    ctrl = build_kl_controller(args, clip=args.kl_ctrl_clip, coef_min=args.kl_coef_min, coef_max=args.kl_coef_max)
    assert isinstance(ctrl, AdaptiveKLController)
    assert (ctrl.value, ctrl.target, ctrl.horizon, ctrl.coef_min, ctrl.coef_max) == (0.2, 6.0, 10000, 1e-4, 10.0)
    assert isinstance(build_kl_controller(SimpleNamespace(kl_ctrl="fixed", kl_coef=0.3)), FixedKLController)


def test_non_finite_checkpoint_value_and_step_count_rejected():
    ctrl = adaptive()
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="not finite"):
            ctrl.load_state_dict({"kind": "adaptive", "value": bad})
    with pytest.raises(ValueError, match="n_steps"):
        ctrl.update(1.0, float("inf"))
    assert ctrl.value == 0.1
