"""TCOD's curriculum schedule, its episode plans and the --tcod-* flag validation (CPU)."""

import argparse

import pytest

from slime.rollout.tcod import PlannedDataSource, b2f_prefix_length, curriculum_depth, episode_plan
from slime.utils.arguments import add_tcod_arguments, validate_tcod_args
from slime.utils.types import Sample

TCOD_FN = "slime.rollout.tcod.generate_rollout"


def make_args(argv, **extra):
    args = add_tcod_arguments(argparse.ArgumentParser()).parse_args(argv)
    defaults = dict(use_opd=True, opd_type="sglang", rm_url="http://t/generate", max_turns=10)
    for key, value in {**defaults, "rollout_function_path": TCOD_FN, **extra}.items():
        setattr(args, key, value)
    return args


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


def test_episode_plans():
    f2b = make_args(["--use-tcod", "--tcod-eta", "3", "--tcod-k-max", "4"])
    validate_tcod_args(f2b)
    assert [episode_plan(f2b, n)["max_student_turns"] for n in (0, 3, 9, 100)] == [1, 2, 4, 4]
    assert episode_plan(f2b, 5, evaluation=True) == {"mode": "full", "max_student_turns": 10, "step": 5}

    b2f = make_args(["--use-tcod", "--tcod-mode", "b2f", "--tcod-eta", "2"])
    validate_tcod_args(b2f)
    plan = episode_plan(b2f, 4)
    assert plan == {"mode": "b2f", "depth": 3, "max_student_turns": 10, "step": 4, "prefix_source": "expert"}

    vanilla = make_args([])
    assert episode_plan(vanilla, 7) == {"mode": "full", "max_student_turns": 10, "step": 7}
    assert episode_plan(make_args([], max_turns=None), 0) is None  # single-turn rollouts get no plan


def test_data_source_attaches_the_step_plan_to_every_sample():
    class Source:
        def get_samples(self, n):
            return [[Sample(index=i)] for i in range(n)]

        def save(self, rollout_id):
            return f"saved {rollout_id}"

    args = make_args(["--use-tcod", "--tcod-eta", "2"])
    validate_tcod_args(args)
    groups = PlannedDataSource(Source(), args, rollout_id=5).get_samples(3)
    assert [g[0].metadata["episode_plan"]["depth"] for g in groups] == [3, 3, 3]
    assert PlannedDataSource(Source(), args, 5).save(5) == "saved 5"  # everything else reaches the real source


def test_validation_fills_defaults():
    args = make_args(["--use-tcod", "--tcod-mode", "b2f", "--tcod-eta", "5"])
    validate_tcod_args(args)
    assert (args.tcod_mode, args.tcod_k_start, args.tcod_k_max) == ("b2f", 1, 10)


def test_validation_does_nothing_without_tcod_flags():
    args = argparse.Namespace()  # upstream's own tests validate hand-built args that never heard of TCOD
    validate_tcod_args(args)
    assert vars(args) == {}


@pytest.mark.parametrize(
    "argv,extra,flag",
    [
        (["--tcod-mode", "b2f", "--tcod-eta", "3"], {}, "--use-tcod"),
        (["--use-tcod", "--tcod-eta", "3"], {"use_opd": False}, "--use-opd"),
        (["--use-tcod", "--tcod-eta", "3"], {"max_turns": None}, "max_turns"),
        (["--use-tcod", "--tcod-eta", "3"], {"rollout_function_path": None}, "--rollout-function-path"),
        (["--use-tcod"], {}, "--tcod-eta"),
        (["--use-tcod", "--tcod-eta", "0"], {}, "--tcod-eta"),
        (["--use-tcod", "--tcod-eta", "3", "--tcod-k-start", "0"], {}, "--tcod-k-start"),
        (["--use-tcod", "--tcod-eta", "3", "--tcod-k-start", "12"], {}, "max_turns (the default --tcod-k-max)"),
        (["--use-tcod", "--tcod-eta", "3", "--tcod-k-max", "11"], {}, "--tcod-k-max"),
    ],
)
def test_validation_rejects_and_names_the_flag(argv, extra, flag):
    with pytest.raises(ValueError) as err:
        validate_tcod_args(make_args(argv, **extra))
    assert flag in str(err.value)
