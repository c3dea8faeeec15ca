"""The adaptive KL controller this runtime shares with the slime PR (slime/utils/kl_controller.py), as train.py and
slime/checkpoint use it. The PR's own test (tests/test_kl_controller_pr.py) runs in slime's CPU CI."""

import json
import math
from types import SimpleNamespace

import pytest

from slime.utils.kl_controller import AdaptiveKLController, build_kl_controller


def adaptive(**kw):
    params = dict(init_kl_coef=0.1, target_kl=1.0, horizon=100.0)
    params.update(kw)
    return AdaptiveKLController(**params)


def test_sequence_of_updates_against_hand_computation():
    ctrl = adaptive()
    beta = 0.1
    # (observed KL, n_steps, error after the clip, clipped?)
    for observed, n, error, clipped in [(1.1, 10, 0.1, 0.0), (2.0, 10, 0.2, 1.0), (0.5, 20, -0.2, 1.0),
                                        (0.9, 5, -0.1, 0.0), (1.0, 50, 0.0, 0.0)]:
        used = beta
        beta *= 1 + error * n / 100.0
        stats = ctrl.update(observed, n)
        assert ctrl.value == pytest.approx(beta, rel=1e-12)
        assert stats["kl_ctrl/coef"] == used  # the value this step used
        assert stats["kl_ctrl/next_coef"] == pytest.approx(beta, rel=1e-12)
        assert stats["kl_ctrl/error"] == pytest.approx(error)
        assert stats["kl_ctrl/clipped"] == clipped
        assert stats["kl_ctrl/observed_kl"] == observed and stats["kl_ctrl/target_kl"] == 1.0


def test_the_largest_step_validation_allows_keeps_the_coefficient_positive():
    # slime_validate_args refuses a horizon below a step's samples, so n_steps <= horizon: at most -20%.
    ctrl = adaptive(horizon=10.0)
    ctrl.update(0.0, 10)
    assert ctrl.value == pytest.approx(0.1 * 0.8)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_observed_kl_is_rejected(bad):
    ctrl = adaptive()
    with pytest.raises(ValueError, match="not finite"):
        ctrl.update(bad, 10)
    assert ctrl.value == 0.1


@pytest.mark.parametrize("n_steps", [0, -5, float("inf"), float("nan")])
def test_bad_step_count_rejected(n_steps):
    ctrl = adaptive()
    with pytest.raises(ValueError, match="n_steps"):
        ctrl.update(1.0, n_steps)
    assert ctrl.value == 0.1


@pytest.mark.parametrize("name", ["init_kl_coef", "target_kl", "horizon"])
@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_constructor_rejects_non_positive_or_non_finite(name, bad):
    with pytest.raises(ValueError, match=name):
        adaptive(**{name: bad})


def test_state_round_trip_continues_identically():
    a = adaptive()
    for kl in (1.5, 0.7, 1.2):
        a.update(kl, 16)
    state = json.loads(json.dumps(a.state_dict()))  # as the checkpoint file holds it
    assert state == {"value": a.value, "target": 1.0, "horizon": 100.0}
    b = adaptive()
    b.load_state_dict(state)
    assert b.value == a.value and b.changed_settings(state) == {}
    a.update(0.3, 16)
    b.update(0.3, 16)
    assert b.value == a.value


def test_a_new_target_or_horizon_keeps_the_coefficient_and_is_named():
    saved = adaptive()
    saved.update(2.0, 16)
    other = adaptive(target_kl=0.5, horizon=200.0)
    other.load_state_dict(saved.state_dict())
    assert (other.value, other.target, other.horizon) == (saved.value, 0.5, 200.0)
    assert other.changed_settings(saved.state_dict()) == {"--kl-target": (1.0, 0.5), "--kl-horizon": (100.0, 200.0)}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0])
def test_a_saved_value_that_is_not_finite_and_positive_is_refused(bad):
    ctrl = adaptive()
    with pytest.raises(ValueError, match="saved KL coefficient"):
        ctrl.load_state_dict({"value": bad, "target": 1.0, "horizon": 100.0})
    assert ctrl.value == 0.1


def test_build_from_args():
    ctrl = build_kl_controller(SimpleNamespace(kl_coef=0.2, kl_target=0.05, kl_horizon=10000.0))
    assert (ctrl.value, ctrl.target, ctrl.horizon) == (0.2, 0.05, 10000.0)
    stats = ctrl.update(0.1, 100)
    assert stats["kl_ctrl/coef"] == 0.2 and math.isclose(stats["kl_ctrl/next_coef"], 0.2 * (1 + 0.2 * 100 / 10000))
