"""--turns-per-step: waves of episodes until a step holds N trained student turns (slime.rollout.turn_budget)."""

import argparse
import itertools

import pytest

from slime.rollout.turn_budget import draw_turn_matched, wave_size
from slime.utils.arguments import ArgumentError, parse_args
from slime.arguments.multi_turn_arguments import validate_turns_per_step
from slime.utils.types import Sample


class Source:
    """Hands out groups of ``n`` samples, numbered in order, as RolloutDataSource does."""

    def __init__(self, n=1):
        self.n, self.counter, self.requests = n, itertools.count(), []

    def get_samples(self, k):
        self.requests.append(k)
        return [[Sample(index=next(self.counter)) for _ in range(self.n)] for _ in range(k)]


def player(turns_of):
    """A wave's episodes finish with ``turns_of(index)`` student turns (0: removed, as a failed env)."""

    def play(groups):
        for group in groups:
            for s in group:
                turns = turns_of(s.index)
                s.metadata = {"num_turns": turns}
                s.response_length, s.loss_mask, s.remove_sample = max(1, turns), [1] * max(1, turns), turns == 0
        return groups

    return play


def args_for(turns, max_turns=10, n=1, **tcod):
    tcod = {"use_tcod": False, **tcod}
    return argparse.Namespace(turns_per_step=turns, max_turns=max_turns, n_samples_per_prompt=n, **tcod)


@pytest.mark.parametrize("lengths", [[3], [10], [1, 7, 2, 9, 4], [0, 5, 0, 6]])
def test_a_step_holds_at_least_n_turns_and_at_most_one_group_more(lengths):
    source = Source()
    groups, counts = draw_turn_matched(args_for(32), 0, source, player(lambda i: lengths[i % len(lengths)]))
    turns = [s.metadata["num_turns"] for g in groups for s in g]
    assert sum(turns) == counts["rollout/student_turns"] >= 32
    assert sum(turns[:-1]) < 32  # without the last episode the step would fall short
    assert counts["rollout/episodes"] == len(turns) == sum(source.requests)
    assert counts["rollout/waves"] == len(source.requests)


def test_f2b_at_depth_one_draws_every_episode_in_one_wave():
    tcod = {"use_tcod": True, "tcod_mode": "f2b", "tcod_k_start": 1, "tcod_eta": 5, "tcod_k_max": 10}
    source = Source()
    groups, counts = draw_turn_matched(args_for(16, **tcod), 0, source, player(lambda i: 1))
    assert source.requests == [16] and counts["rollout/student_turns"] == 16  # cap k(0) = 1: one turn each
    source = Source()
    draw_turn_matched(args_for(16, **tcod), 10, source, player(lambda i: 3))  # k(10) = 3
    assert source.requests == [6]  # ceil(16 / 3): the wave cannot overshoot by more than its last episode


def test_groups_count_all_their_samples():
    source = Source(n=2)
    groups, counts = draw_turn_matched(args_for(10, n=2), 0, source, player(lambda i: 4))
    assert source.requests == [1, 1] and counts["rollout/student_turns"] == 16  # cap 2 x 10 per group
    assert wave_size(10, 20) == 1 and wave_size(21, 20) == 2


def test_waves_that_train_nothing_stop_the_step():
    with pytest.raises(RuntimeError, match="3 waves in a row trained no student turn"):
        draw_turn_matched(args_for(8), 0, Source(), player(lambda i: 0))


@pytest.mark.parametrize(
    "turns,max_turns,steps,message",
    [
        (0, 4, 1, "--turns-per-step must be >= 1"),
        (8, None, 1, "set max_turns"),
        (8, 4, 2, "in one optimizer step; --global-batch-size / --num-steps-per-rollout give 2"),
    ],
)
def test_turns_per_step_is_checked(turns, max_turns, steps, message):
    ns = argparse.Namespace(turns_per_step=turns, max_turns=max_turns, num_steps_per_rollout=steps)
    with pytest.raises(ArgumentError, match=message):
        validate_turns_per_step(ns)


def test_the_flag_reaches_validation(capsys):
    argv = ["--hf-checkpoint", "unused", "--rollout-batch-size", "4", "--turns-per-step", "8",
            "--max-turns", "4", "--rollout-interaction-env-path", "x", "--global-batch-size", "2"]
    with pytest.raises(SystemExit):
        parse_args(argv=argv)
    assert "--turns-per-step trains each rollout step in one optimizer step" in capsys.readouterr().err
