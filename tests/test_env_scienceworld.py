"""ScienceWorld adapter: the gold path succeeds, thinking replies act after </think>, invalid actions are
observations, JVM crashes raise clearly."""

import os
import signal

import pytest

from examples.agent_envs import build_env
from examples.agent_envs.scienceworld_env import NO_MATCH, SERVERS, ScienceWorldError
from slime.utils.types import Sample
from env_steps import play

TASK = {"env": "scienceworld", "task": "find-non-living-thing", "variation": 0}  # gold path: 5 actions


@pytest.fixture(scope="module")
def env():
    # One JVM for the module: starting one takes seconds; the adapter's pool hands it on between episodes.
    environment = build_env(Sample(metadata=dict(TASK)), None)
    yield environment
    environment.close()
    SERVERS.close_all()




def test_gold_path_reaches_full_score(env):
    first, info = env.reset()
    assert first.startswith("Task Description:") and "non-living thing" in first and "This room is called" in first
    assert info["score"] == 0 and env.format_observation(first) == {"role": "user", "content": first}
    gold = env.expert_actions()
    assert gold and 3 <= len(gold) <= 10
    results = play(env, gold)
    assert [done for _, _, done, _ in results] == [False] * (len(gold) - 1) + [True]
    _, _, _, info = results[-1]
    assert info["success"] and info["score"] == 100
    assert sum(r for _, r, _, _ in results) == pytest.approx(1.0)  # rewards are score deltas / 100
    assert not any(i["invalid_action"] for _, _, _, i in results)


def test_thinking_replies_send_only_the_action_to_the_game(env):
    env.reset()
    gold = env.expert_actions()
    results = play(env, [f"<think>\nThe gold step is next.\n</think>\n\n{action}\n" for action in gold])
    assert results[-1][2] and results[-1][3]["success"]
    assert not any(i["invalid_action"] for _, _, _, i in results)


def test_a_reply_cut_inside_its_thought_never_reaches_the_game(env):
    env.reset()
    gold = env.expert_actions()
    obs, reward, done, info = play(env, [f"<think>\nfirst I should {gold[0]}"])[0]
    assert "ended inside <think>" in obs and reward == 0.0 and not done
    assert info["invalid_action"] and not info["success"] and info["score"] == 0
    results = play(env, gold)  # the cut turn played nothing: the gold path still works from here
    assert results[-1][3]["success"]


def test_invalid_action_is_an_observation(env):
    env.reset()
    for bad in ("dance with the fridge", "", "\n\n"):
        obs, reward, done, info = play(env, [bad])[0]
        assert obs == NO_MATCH and reward == 0.0 and not done
        assert info["invalid_action"] and not info["success"]


def test_reset_restarts_the_same_task(env):
    assert env.reset() == env.reset()
    gold = env.expert_actions()
    env.step(gold[0])
    assert env.expert_actions() == gold


def test_the_step_limit_ends_the_episode_for_cut_thoughts_too():
    short = build_env(Sample(metadata={**TASK, "max_steps": 2}), None)
    try:
        short.reset()
        assert not short.step("<think>\nhmm")[1]
        _, done, info = short.step("<think>\nhmm")
        assert done and info["invalid_action"] and not info["success"]
    finally:
        short.close()


def test_unknown_task_raises_a_clear_error():
    bad = build_env(Sample(metadata={"env": "scienceworld", "task": "fly-to-the-moon"}), None)
    with pytest.raises(ScienceWorldError, match="fly-to-the-moon.*reset failed"):
        bad.reset()
    with pytest.raises(ValueError, match="'task'"):
        build_env(Sample(metadata={"env": "scienceworld"}), None)


def test_a_crashed_jvm_becomes_a_clear_exception(env):
    env.reset()
    server = env._server
    os.kill(server._gateway.java_process.pid, signal.SIGKILL)  # the JVM this test's adapter started
    server._gateway.java_process.wait(timeout=30)
    with pytest.raises(ScienceWorldError, match="find-non-living-thing.*may have crashed"):
        env.step("look around")
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("look around")
    assert server not in SERVERS._idle  # a dead JVM is never handed to the next episode
