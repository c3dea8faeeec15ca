"""--rollout-interaction-env-path accepts upstream slime's env contract and this example's factory, and
every environment return is checked before the agent loop uses it."""

from __future__ import annotations

import sys
import textwrap
import types
from argparse import Namespace

import pytest

from examples.multi_turn_tcod.envs import gridnav
from examples.multi_turn_tcod import env_adapter as interaction_env
from examples.multi_turn_tcod.env_adapter import EnvironmentContractError, build_interaction_env
from slime.utils.types import Sample


def _task(seed=3):
    return Sample(prompt="the task, as the dataset gives it", metadata={"env": "gridnav", **gridnav.task_metadata(seed, {})})


def _build(path, sample=None):
    return build_interaction_env(Namespace(rollout_interaction_env_path=path), sample or _task())


def _module(name, source):
    module = types.ModuleType(name)
    exec(textwrap.dedent(source), module.__dict__)
    sys.modules[name] = module
    interaction_env._BUILDERS.pop(name, None)
    return name


def test_both_contracts_give_the_same_episode():
    upstream, factory = _build("examples.agent_envs"), _build("examples.agent_envs.make_env")
    assert upstream.upstream_contract and not factory.upstream_contract
    assert upstream.reset() == factory.reset()
    actions = factory.expert_actions()
    assert actions and upstream.expert_actions() == actions
    for action in actions:
        a, b = upstream.step(action), factory.step(action)
        assert a[:3] == b[:3] and a[3]["success"] == b[3]["success"]
    assert b[1] == 1.0 and b[2] and b[3]["success"]


def test_an_upstream_style_env_module(tmp_path):
    # Shaped like upstream's examples/geo3k_vlm_multi_turn: reset() -> (obs, info) with obs None, a message
    # with list-of-parts content from format_observation, the reward in info["score"].
    path = tmp_path / "quiz_env.py"
    path.write_text(textwrap.dedent('''
        class QuizEnv:
            def __init__(self, answer):
                self.answer = answer
            def reset(self):
                return None, {}
            def step(self, response_text):
                right = response_text.strip() == self.answer
                return {"obs_str": "correct" if right else "try again"}, right, {"score": float(right)}
            def format_observation(self, observation):
                return {"role": "user", "content": [{"type": "text", "text": observation["obs_str"]}]}
            def close(self):
                pass

        def build_env(sample=None, args=None):
            return QuizEnv(sample.label)
        '''))
    sample = Sample(prompt=[{"role": "user", "content": "2 + 2 ?"}], label="4")
    env = _build(str(path), sample)
    assert env.reset() == "2 + 2 ?"  # no observation from reset(): the task is the sample's prompt
    assert env.step("5") == ("try again", 0.0, False, {"score": 0.0})
    assert env.step("4") == ("correct", 1.0, True, {"score": 1.0})
    assert env.expert_actions() is None


@pytest.mark.parametrize("signature,call", [
    ("*, sample=None, args=None", "sample=sample, args=args"),  # keyword-only: upstream's call works, positional fails
    ("task, cli_args", "task, cli_args"),  # other names: upstream falls back to a positional call
])
def test_build_env_is_called_as_upstream_calls_it(signature, call):
    name = _module(f"kw_env_{len(signature)}", f"""
        from examples.agent_envs import build_env as real
        seen = []
        def build_env({signature}):
            seen.append(True)
            return real({call})
    """)
    env = _build(name)
    assert env.upstream_contract and env.reset() and sys.modules[name].seen == [True]


@pytest.mark.parametrize("step_return,match", [
    ("('obs', 0.0, False)", r"\(observation, reward, done, info\), got a 3-tuple"),
    ("('obs', None, False, {})", "reward None"),
    ("('obs', float('nan'), False, {})", r"non-finite reward \(nan\)"),
    ("('obs', float('inf'), False, {})", r"non-finite reward \(inf\)"),
    ("('obs', -float('inf'), True, {})", r"non-finite reward \(-inf\)"),
    ("('obs', 0.0, 'yes', {})", "done='yes'"),
    ("('obs', 0.0, False, ['x'])", "info of type list"),
    ("({'x': 1}, 0.0, False, {})", "observation of type dict"),
])
def test_malformed_returns_name_the_problem(step_return, match):
    name = _module(f"bad_env_{abs(hash(step_return))}", f'''
        class Env:
            def reset(self):
                return "start"
            def step(self, action):
                return {step_return}
        def make_env(args, sample):
            return Env()
        ''')
    env = _build(f"{name}.make_env")
    assert env.reset() == "start"
    with pytest.raises(EnvironmentContractError, match=match):
        env.step("go")


def test_reset_must_give_text_and_paths_are_checked():
    name = _module("none_reset_env", '''
        class Env:
            def reset(self):
                return None
        def make_env(args, sample):
            return Env()
        ''')
    with pytest.raises(EnvironmentContractError, match="reset"):
        _build(f"{name}.make_env").reset()
    with pytest.raises(ValueError, match="without a callable build_env"):
        _build("examples.multi_turn_tcod.envs.common")
    with pytest.raises(ValueError, match="rollout_interaction_env_path"):
        build_interaction_env(Namespace(rollout_interaction_env_path=None), _task())
    nothing = _module("none_env", "def make_env(args, sample):\n    return None")
    with pytest.raises(EnvironmentContractError, match="returned None"):
        _build(f"{nothing}.make_env")


@pytest.mark.parametrize("key", ["reward", "score"])
def test_upstream_contract_rejects_a_non_finite_reward_in_info(key):
    name = _module(f"nan_info_env_{key}", f'''
        class Env:
            def reset(self):
                return "start", {{}}
            def step(self, text):
                return "obs", False, {{"{key}": float("nan")}}
        def build_env(sample=None, args=None):
            return Env()
        ''')
    env = _build(name)
    assert env.upstream_contract and env.reset() == "start"
    with pytest.raises(EnvironmentContractError, match="non-finite reward"):
        env.step("go")
    assert env.label == f"environment {name}.Env"  # how the agent loop names it in the episode's error
