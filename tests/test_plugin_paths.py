"""Every dotted plugin path is imported before Ray starts, --dry-run included, with the flag named."""

import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from slime.arguments.argument_error import ArgumentError
from slime.launch.plugin_paths import check_plugin_paths

ROOT = Path(__file__).resolve().parents[1]


def test_good_paths_pass():
    check_plugin_paths(Namespace(
        rollout_function_path="slime.rollout.sglang_rollout.generate_rollout",
        custom_generate_function_path="examples.multi_turn_tcod.rollout.generate",
        custom_rollout_log_function_path="examples.multi_turn_tcod.metrics.log_rollout_data",
        rollout_interaction_env_path="examples.multi_turn_tcod.envs.gridnav",
    ))
    # This runtime's environments and its teacher-prefix agent loop.
    check_plugin_paths(Namespace(rollout_interaction_env_path="examples.agent_envs",
                                 custom_generate_function_path="slime.rollout.teacher_prefix.generate"))


@pytest.mark.parametrize("name,path,flag", [
    ("custom_generate_function_path", "examples.multi_turn_tcod.rollout.generat", "--custom-generate-function-path"),
    ("custom_rm_path", "slime.rollout.no_such_module.reward_func", "--custom-rm-path"),
    ("rollout_interaction_env_path", "examples.multi_turn_tcod.envs.scienceworld.make_env",
     "--rollout-interaction-env-path"),
])
def test_a_misspelled_path_is_refused_naming_the_flag(name, path, flag):
    with pytest.raises(ArgumentError) as err:
        check_plugin_paths(Namespace(**{name: path}))
    assert str(err.value).startswith(f"{flag} {path!r} does not import")


def test_dry_run_refuses_a_bad_env_path_in_one_line():
    out = subprocess.run([sys.executable, "train.py", "--dry-run", "--num-rollout", "1", "--max-turns", "3",
                          "--rollout-interaction-env-path", "examples.multi_turn_tcod.envs.gridnav_env.make_env"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: --rollout-interaction-env-path")
