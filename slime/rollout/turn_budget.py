"""``--turns-per-step N``: every rollout step trains at least N student turns, whatever the method.

The official TCOD code fills each optimizer step with a fixed number of turn-level experiences, so at
depth 1 an F2B step spans many tasks' first turns. A step of a fixed number of episodes instead gives
F2B one turn per episode against vanilla OPD's whole episodes: far fewer tokens per update early on.

Episodes are drawn in waves. A wave holds ``ceil(remaining / cap)`` groups, where ``cap`` bounds the
trained turns of one group (``--n-samples-per-prompt`` x the step plan's ``max_turns``): every
group of a wave but its last together train fewer than ``remaining`` turns, so the step ends at most one
group past N. Which episodes a step holds depends only on their outcomes, never on timing, so a rerun
with the same seeds draws the same episodes. The curriculum's n stays the rollout step.
"""

from __future__ import annotations

from slime.rollout.tcod import episode_plan
from slime.rollout.trainable_samples import trainable

# Waves in a row that train no turn at all (every episode failed or was removed) before the step gives up.
MAX_EMPTY_WAVES = 3


def trained_turns(group) -> int:
    """Student turns the trainer will see from ``group`` (dropped samples count none)."""
    return sum(int(s.metadata.get("num_turns", 0)) for s in group if trainable(s))


def wave_size(remaining: int, cap: int) -> int:
    """Groups of the next wave: as many as can be needed, never more than can overshoot by one group."""
    return -(-remaining // max(1, cap))


def draw_turn_matched(args, rollout_id: int, data_source, play) -> tuple[list, dict]:
    """Groups holding at least ``args.turns_per_step`` trained student turns; ``play(groups)`` runs a wave.

    Returns the groups, in the order drawn, and the step's counts (``rollout/episodes``,
    ``rollout/student_turns``, ``rollout/waves``) for its metrics row.
    """
    target = int(args.turns_per_step)
    # The plan's max_turns bounds an episode's student turns (B2F's replayed turns count towards it).
    cap = int(args.n_samples_per_prompt) * int(episode_plan(args, rollout_id, args.max_turns)["max_turns"])
    groups, turns, waves, empty = [], 0, 0, 0
    while turns < target:
        wave = play(data_source.get_samples(wave_size(target - turns, cap)))
        got = sum(trained_turns(g) for g in wave)
        groups += wave
        turns += got
        waves += 1
        empty = empty + 1 if got == 0 else 0
        if empty >= MAX_EMPTY_WAVES:
            raise RuntimeError(
                f"--turns-per-step {target}: {MAX_EMPTY_WAVES} waves in a row trained no student turn (every "
                f"episode failed or was removed; {turns} turns so far at rollout {rollout_id})"
            )
    counts = {"rollout/episodes": sum(len(g) for g in groups), "rollout/student_turns": turns, "rollout/waves": waves}
    return groups, counts
