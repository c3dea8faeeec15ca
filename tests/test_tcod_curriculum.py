"""TCOD's curriculum schedule and the episode plans the agent loop follows (CPU)."""

from types import SimpleNamespace

import pytest

from slime.rollout.tcod import b2f_prefix_length, curriculum_depth, episode_plan

NUM_GPUS = 0


def tcod_args(**overrides):
    """args after slime_validate_args: --use-tcod with its defaults filled, max_turns from the YAML."""
    values = dict(use_tcod=True, tcod_mode="f2b", tcod_k_start=1, tcod_eta=3, tcod_k_max=4, max_turns=10)
    values.update(overrides)
    return SimpleNamespace(**values)


def test_depth_grows_every_eta_steps_up_to_k_max():
    assert [curriculum_depth(n, 1, 3, 4) for n in range(14)] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 4, 4]
    assert curriculum_depth(0, 2, 5, 9) == 2


def test_b2f_prefix_is_expert_length_minus_depth():
    assert [b2f_prefix_length(n, 5, 1, 2, 10) for n in range(10)] == [4, 4, 3, 3, 2, 2, 1, 1, 0, 0]
    assert b2f_prefix_length(3, None, 1, 2, 10) == 0  # no expert actions: the whole episode


@pytest.mark.parametrize("step,k_start,eta,k_max", [(-1, 1, 1, 1), (0, 0, 1, 1), (0, 1, 0, 1), (0, 3, 1, 2)])
def test_schedule_rejects_bad_parameters(step, k_start, eta, k_max):
    with pytest.raises(ValueError):
        curriculum_depth(step, k_start, eta, k_max)


def test_f2b_plays_the_first_k_turns():
    args = tcod_args()
    assert [episode_plan(args, n)["max_student_turns"] for n in (0, 3, 9, 100)] == [1, 2, 4, 4]
    assert episode_plan(args, 4) == {"mode": "f2b", "depth": 2, "max_student_turns": 2, "step": 4}


def test_b2f_plays_to_the_end_after_the_prefix():
    args = tcod_args(tcod_mode="b2f", tcod_eta=2, tcod_k_max=10)
    assert episode_plan(args, 4) == {"mode": "b2f", "depth": 3, "max_student_turns": 10, "step": 4}


def test_evaluation_and_vanilla_opd_play_full_episodes():
    full = {"mode": "full", "max_student_turns": 10, "step": 5}
    assert episode_plan(tcod_args(), 5, evaluation=True) == full
    assert episode_plan(tcod_args(use_tcod=False), 5) == full


def test_training_needs_the_current_rollout_id():
    with pytest.raises(RuntimeError, match="rollout id"):
        episode_plan(tcod_args(), None)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__]))
