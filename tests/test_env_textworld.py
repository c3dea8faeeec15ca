"""TextWorld adapter: locally generated games, cached by seed; the walkthrough wins, also as thinking replies."""

import pytest

from examples.agent_envs import build_env
from examples.agent_envs.textworld_env import clean_feedback, game_file
from slime.utils.types import Sample
from env_steps import play


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return {"env": "textworld", "seed": 11, "rooms": 2, "objects": 3, "quest_length": 3,
            "games_dir": str(tmp_path_factory.mktemp("tw_games"))}


@pytest.fixture(scope="module")
def env(task):
    environment = build_env(Sample(metadata=dict(task)), None)
    yield environment
    environment.close()




def test_walkthrough_wins(env):
    first, _ = env.reset()
    assert "-=" in first and "$$" not in first  # objective + room, without the ASCII banner
    assert env.format_observation(first) == {"role": "user", "content": first}
    walkthrough = env.expert_actions()
    assert walkthrough and len(walkthrough) >= 1
    results = play(env, walkthrough)
    assert [done for _, _, done, _ in results] == [False] * (len(walkthrough) - 1) + [True]
    assert results[-1][3]["success"] and sum(r for _, r, _, _ in results) == pytest.approx(1.0)
    assert not any(info["invalid_action"] for *_, info in results)


def test_thinking_replies_send_only_the_action_to_the_game(env):
    env.reset()
    walkthrough = env.expert_actions()
    results = play(env, [f"<think>\nI could dance wildly.\n</think>\n\n{a}" for a in walkthrough])
    assert results[-1][2] and results[-1][3]["success"]
    assert not any(info["invalid_action"] for *_, info in results)


def test_a_reply_cut_inside_its_thought_is_an_invalid_step(env):
    env.reset()
    walkthrough = env.expert_actions()
    obs, reward, done, info = play(env, [f"<think>\nnext: {walkthrough[0]}"])[0]
    assert "ended inside <think>" in obs and reward == 0 and not done and info["invalid_action"]
    assert env.steps == 1
    assert play(env, walkthrough)[-1][3]["success"]  # nothing was played: the walkthrough still wins


def test_invalid_commands_are_observations(env):
    env.reset()
    obs, reward, done, info = play(env, ["dance wildly"])[0]
    assert obs and ">" not in obs and reward == 0 and not done and info["invalid_action"] and not info["success"]


def test_games_are_cached_and_deterministic(task, env):
    path = game_file(task)
    mtime = path.stat().st_mtime_ns
    other = build_env(sample=Sample(metadata=dict(task)), args=None)
    try:
        assert other.reset() == env.reset() and other.expert_actions() == env.expert_actions()
        results = play(other, other.expert_actions())  # a second copy of the game plays alike
        assert results[-1][2] and results[-1][3]["success"] and sum(r for _, r, _, _ in results) == pytest.approx(1.0)
    finally:
        other.close()
    assert game_file(task).stat().st_mtime_ns == mtime  # not generated again
    assert sorted(p.suffix for p in path.parent.iterdir()) == [".json", ".z8"]  # no staging leftovers


def test_max_steps_ends_the_episode(task):
    short = build_env(Sample(metadata={**task, "max_steps": 2}), None)
    try:
        short.reset()
        assert not short.step("<think>\nlook")[1]  # a cut thought counts as a step
        _, done, info = short.step("look")
        assert done and info["out_of_steps"] and not info["success"]
    finally:
        short.close()


def test_clean_feedback_drops_the_prompt_and_status_line():
    assert clean_feedback("\nYou can't go that way.\n\n>   -= Attic =-0/1") == "You can't go that way."
    assert clean_feedback("plain") == "plain"
