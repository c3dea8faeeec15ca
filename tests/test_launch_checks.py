"""What --dry-run refuses or fills in before Ray (slime.launch.checks), and the run failures that get one
paragraph instead of a traceback (slime.ray.failures)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slime.arguments.argument_error import ArgumentError
from slime.backends.fsdp_utils.guards import NonFiniteError
from slime.launch.checks import MULTI_TURN_GENERATE, SERVER_TEACHER_HOOKS, check_launch
from slime.ray.failures import describe_failure
from slime.utils.arguments import get_parser, validate_args
from slime.utils.http_utils import HTTPRequestError

ROOT = Path(__file__).resolve().parents[1]
ENV = "examples.agent_envs"


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    rows = [{"input": f"task {i}", "label": "{}", "metadata": {"env": "gridnav", "seed": i}} for i in range(3)]
    plain = root / "plain.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    expert = root / "expert.jsonl"
    expert.write_text("".join(json.dumps({**r, "expert_actions": ["up"]}) + "\n" for r in rows))
    return {"plain": str(plain), "expert": str(expert)}


def _check(*argv):
    args = validate_args(get_parser().parse_args(list(argv)))
    return args, check_launch(args)


def _refused(*argv) -> str:
    with pytest.raises(ArgumentError) as err:
        _check(*argv)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_the_silent_cases_are_refused_naming_the_flag(tasks):
    assert "--num-rollout" in _refused("--prompt-data", tasks["plain"])
    assert "--prompt-data is required" in _refused("--num-rollout", "2")
    assert "no such file" in _refused("--num-rollout", "2", "--prompt-data", "/nonexistent/train.jsonl")
    assert "--eval-prompt-data held" in _refused("--num-rollout", "2", "--prompt-data", tasks["plain"],
                                                 "--eval-prompt-data", "held", "/nonexistent/eval.jsonl")
    assert "--rm-url" in _refused("--num-rollout", "2", "--prompt-data", tasks["plain"], "--use-opd",
                                  "--opd-type", "sglang")
    assert "--colocate" in _refused("--num-rollout", "2", "--prompt-data", tasks["plain"], "--colocate")
    assert "--num-gpus-per-node 4" in _refused("--num-rollout", "2", "--prompt-data", tasks["plain"],
                                               "--actor-num-gpus-per-node", "6", "--num-gpus-per-node", "4")


def test_one_custom_reward_hook_without_its_pair_is_refused(tasks):
    message = _refused("--num-rollout", "2", "--prompt-data", tasks["plain"], "--use-opd", "--opd-type", "sglang",
                       "--rm-url", "http://127.0.0.1:1/generate", "--custom-rm-path",
                       SERVER_TEACHER_HOOKS["custom_rm_path"][1])
    assert "--custom-reward-post-process-path" in message


def test_defaults_are_taken_and_shown(tasks):
    args, notes = _check("--num-rollout", "2", "--prompt-data", tasks["plain"], "--use-opd", "--opd-type", "sglang",
                         "--rm-url", "http://127.0.0.1:1/generate", "--max-turns", "3",
                         "--rollout-interaction-env-path", ENV)
    for name, (flag, default) in SERVER_TEACHER_HOOKS.items():
        assert getattr(args, name) == default
        assert any(flag in note and default in note for note in notes)
    assert args.custom_generate_function_path == MULTI_TURN_GENERATE
    assert any("--custom-generate-function-path" in note for note in notes)


def test_b2f_expert_prefix_needs_expert_actions(tasks):
    b2f = ["--num-rollout", "2", "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", str(ROOT),
           "--max-turns", "3", "--rollout-interaction-env-path", "examples.multi_turn_tcod.envs.gridnav",
           "--use-tcod", "--tcod-mode", "b2f", "--tcod-eta", "2"]
    _check(*b2f, "--prompt-data", tasks["expert"])  # metadata carries them: accepted
    # gridnav computes its own shortest path, so the environment gives them: accepted too.
    _check(*b2f, "--prompt-data", tasks["plain"])
    message = _refused(*b2f, "--prompt-data", tasks["plain"], "--rollout-interaction-env-path",
                       "examples.agent_envs.no_expert")
    assert "--tcod-prefix-source teacher" in message


def test_the_environment_must_be_a_build_env_module(tasks, tmp_path):
    common = ("--num-rollout", "2", "--prompt-data", tasks["plain"], "--max-turns", "3")
    # A factory's dotted path (the contract the agent loop no longer takes) is named, with the module to use.
    message = _refused(*common, "--rollout-interaction-env-path", "examples.agent_envs.build_env")
    assert message.startswith("--rollout-interaction-env-path examples.agent_envs.build_env: not a module")
    assert "build_env(sample, args)" in message and message.endswith("e.g. examples.agent_envs")
    # A module without build_env.
    assert "no callable build_env" in _refused(*common, "--rollout-interaction-env-path", "examples.agent_envs.common")
    # A .py file with build_env is a module too.
    env_file = tmp_path / "my_env.py"
    env_file.write_text("from examples.agent_envs import build_env\n")
    _check(*common, "--rollout-interaction-env-path", str(env_file))


def test_budget_warnings_give_the_numbers(tasks):
    _, notes = _check("--num-rollout", "2", "--prompt-data", tasks["plain"], "--max-turns", "30",
                      "--max-turn-response-len", "512", "--rollout-interaction-env-path", ENV)
    assert any("30 x --max-turn-response-len 512 = 15360" in n and "--rollout-max-response-len 256" in n
               for n in notes)
    # The default turn limit (the whole budget) is not a request, so no warning.
    _, notes = _check("--num-rollout", "2", "--prompt-data", tasks["plain"], "--max-turns", "30",
                      "--rollout-interaction-env-path", ENV)
    assert not [n for n in notes if n.startswith("warning")]


def test_a_budget_past_the_models_positions_is_warned(tasks, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"max_position_embeddings": 4096}))
    _, notes = _check("--num-rollout", "2", "--prompt-data", tasks["plain"], "--model-config-json", str(config),
                      "--rollout-max-response-len", "16384", "--allow-no-reward")
    assert any("16384 is more than the model's max_position_embeddings 4096" in n for n in notes)


def test_dry_run_refusal_is_one_line(tasks):
    out = subprocess.run([sys.executable, "train.py", "--dry-run", "--num-rollout", "2", "--prompt-data",
                          tasks["plain"], "--use-opd", "--opd-type", "sglang"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert out.stderr.startswith("train.py: error: --opd-type sglang needs --rm-url")


class _RayWrapped(Exception):
    """Stands in for ray.exceptions.RayTaskError, which carries the actor's exception as ``cause``."""

    def __init__(self, cause):
        super().__init__("Traceback (most recent call last): ...")
        self.cause = cause


def _args(**kw):
    parsed = get_parser().parse_args(["--rm-url", "http://127.0.0.1:13141/generate"])
    for key, value in kw.items():
        setattr(parsed, key, value)
    return parsed


def test_an_unreachable_teacher_is_named_by_its_flag():
    err = HTTPRequestError("POST http://127.0.0.1:13141/generate failed after 60 attempt(s) over 431 s: "
                           "ClientConnectorError: refused", url="http://127.0.0.1:13141/generate")
    message = describe_failure(_args(), _RayWrapped(err))
    assert "--rm-url http://127.0.0.1:13141/generate" in message and "431 s" in message and "Traceback" not in message
    engine = HTTPRequestError("POST http://127.0.0.1:30001/generate failed", url="http://127.0.0.1:30001/generate")
    assert "rollout engine at 127.0.0.1:30001" in describe_failure(_args(), engine)
    router = describe_failure(_args(sglang_router_ip="10.0.0.1", sglang_router_port=3000),
                              HTTPRequestError("x", url="http://10.0.0.1:3000/generate"))
    assert "--sglang-router-ip" in router


def test_non_finite_values_get_a_paragraph_and_other_errors_keep_their_traceback():
    try:
        raise RuntimeError("step failed") from NonFiniteError("rollout 3: the teacher's log-probs hold NaN")
    except RuntimeError as err:
        message = describe_failure(_args(), err)
    assert "teacher's log-probs hold NaN" in message and "--lr" in message
    assert describe_failure(_args(), KeyError("x")) is None


def test_a_dead_teacher_before_the_run_names_rm_url(tmp_path):
    from slime.utils.tiny_models import main as make_tiny

    make_tiny(["--out", str(tmp_path / "m"), "--hidden-size", "16", "--num-layers", "1", "--num-heads", "2"])
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"input": "hi"}) + "\n")
    out = subprocess.run([sys.executable, "train.py", "--hf-checkpoint", str(tmp_path / "m"), "--prompt-data",
                          str(data), "--num-rollout", "1", "--use-opd", "--opd-type", "sglang", "--rm-url",
                          "http://127.0.0.1:9/generate"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    (error,) = [line for line in out.stderr.splitlines() if "error" in line]
    assert "teacher server (--rm-url http://127.0.0.1:9/generate) did not answer" in error
    assert "Traceback" not in out.stderr
