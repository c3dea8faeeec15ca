"""``train.py --help`` documents every flag with its default, and says plainly which flags are accepted
only for upstream's launch scripts and do nothing here."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slime.utils.arguments import get_parser, validate_args

ROOT = Path(__file__).resolve().parents[1]
NO_EFFECT = "no effect in this runtime"
DEFAULT_WORD = re.compile(r"\bdefault\b", re.IGNORECASE)
# Accepted so that upstream slime / Megatron launch scripts run unchanged; they change nothing here.
NO_EFFECT_FLAGS = {
    "--accumulate-allreduce-grads-in-fp32",
    "--attention-softmax-in-fp32",
    "--attention-backend",
    "--bf16",
    "--use-distributed-optimizer",
    "--make-vocab-size-divisible-by",
    "--seq-length",
    "--recompute-method",
    "--recompute-num-layers",
}


def _options():
    return [a for a in get_parser()._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


@pytest.fixture(scope="module")
def help_entries() -> dict[str, str]:
    """Flag -> its ``train.py --help`` entry, whitespace collapsed (a wide terminal, so nothing wraps)."""
    env = {**os.environ, "COLUMNS": "4000"}
    proc = subprocess.run([sys.executable, "train.py", "--help"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    entries, current = {}, None
    for line in proc.stdout.splitlines():
        match = re.match(r"^  (-[^\s,]+)", line)
        if match:
            current = match.group(1)
            entries[current] = line
        elif current and line.startswith("   "):
            entries[current] += " " + line
        else:
            current = None
    return {flag: " ".join(text.split()) for flag, text in entries.items()}


def test_every_option_has_help():
    missing = [a.option_strings[0] for a in _options() if not (a.help or "").strip()]
    assert not missing, f"flags without help (so --help shows no default for them): {missing}"


def test_every_option_shows_its_default_in_train_help(help_entries):
    flags = [a.option_strings[0] for a in _options()]
    missing = [f for f in flags if f not in help_entries]
    assert not missing, f"not in train.py --help: {missing}"
    no_default = [f for f in flags if not DEFAULT_WORD.search(help_entries[f])]
    assert not no_default, f"no default in train.py --help: {no_default}"


def test_every_option_states_one_default(help_entries):
    # argparse's "(default: None)" after a text saying "(default: --lr)" gave 24 flags two defaults that disagree.
    twice = {f: t for f, t in help_entries.items() if f != "-h" and len(DEFAULT_WORD.findall(t)) != 1}
    assert not twice, f"flags whose help states the default more or less than once: {twice}"


@pytest.mark.parametrize("flag, says", [
    ("--critic-lr", "(default: --lr)"),
    ("--ref-load", "(default: --hf-checkpoint)"),
    ("--eps-clip-c", "off by default"),
])
def test_a_default_stated_in_words_is_not_contradicted(help_entries, flag, says):
    assert says in help_entries[flag] and "(default: None)" not in help_entries[flag], help_entries[flag]


def test_help_reads_in_titled_groups():
    proc = subprocess.run([sys.executable, "train.py", "--help"], cwd=ROOT, env={**os.environ, "COLUMNS": "4000"},
                          capture_output=True, text=True, timeout=300)
    titles = re.findall(r"^(\S[^\n]*):$", proc.stdout, re.MULTILINE)
    for title in ("cluster", "checkpoint", "data", "rollout", "reward", "TCOD temporal curriculum", "logging"):
        assert title in titles, titles
    # Only -h/--help is outside a titled group.
    ungrouped = proc.stdout.split("\noptions:\n", 1)[1].split("\n\n", 1)[0]
    assert re.findall(r"^  (-\S+)", ungrouped, re.MULTILINE) == ["-h,"], ungrouped


@pytest.mark.parametrize("flag, default", [
    ("--rollout-max-response-len", "256"),
    ("--rollout-batch-size", "8"),
    ("--n-samples-per-prompt", "1"),
    ("--seed", "1234"),
    ("--lr", "1e-06"),
    ("--advantage-estimator", "grpo"),
    ("--opd-kl-coef", "1.0"),
    ("--kl-ctrl", "fixed"),
    ("--attention-backend", "auto"),
    ("--num-gpus-per-node", "8"),
    ("--rollout-function-path", "slime.rollout.sglang_rollout.generate_rollout"),
])
def test_sample_flags_show_their_default(help_entries, flag, default):
    assert f"(default: {default})" in help_entries[flag], help_entries[flag]


@pytest.mark.parametrize("flag, says", [
    ("--tcod-mode", "Default is f2b."),
    ("--tcod-k-start", "Default is 1."),
    ("--tcod-k-max", "Default is the generate function's max_turns."),
    ("--tcod-eta", "Required when --use-tcod is enabled."),
])
def test_tcod_flags_state_their_defaults_as_upstream_does(help_entries, flag, says):
    # The help text is the one port.py splices into upstream's arguments.py, which states defaults in words.
    assert says in help_entries[flag], help_entries[flag]


def test_response_budget_is_the_whole_trajectory_in_multi_turn(help_entries):
    # examples/multi_turn_tcod/rollout.py: Episode.room() is --rollout-max-response-len minus the response so far,
    # and observations are appended to the response (masked), so they spend the same budget as student turns.
    text = help_entries["--rollout-max-response-len"]
    assert "multi-turn" in text and "whole trajectory" in text and "observations included" in text, text


def test_compatibility_only_flags_say_they_do_nothing(help_entries):
    saying = {a.option_strings[0] for a in _options() if NO_EFFECT in a.help}
    assert saying == NO_EFFECT_FLAGS
    for flag in NO_EFFECT_FLAGS:
        assert "accepted for upstream's scripts" in help_entries[flag], help_entries[flag]


def test_compatibility_only_flags_are_accepted():
    # The PR's launch script passes several of these; they must parse and validate, not be refused.
    args = validate_args(get_parser().parse_args([
        "--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32", "--attention-backend", "flash",
        "--bf16", "--use-distributed-optimizer", "--make-vocab-size-divisible-by", "128", "--seq-length", "4096",
        "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
    ]))
    assert args.attention_backend == "flash" and args.bf16 and args.seq_length == 4096


def test_split_groups_stay_importable_from_arguments():
    from slime.arguments import algorithm_arguments
    from slime.utils import arguments

    for name in ("ESTIMATORS", "add_algorithm_arguments", "add_optimizer_arguments",
                 "add_on_policy_distillation_arguments", "add_kl_controller_arguments"):
        assert getattr(arguments, name) is getattr(algorithm_arguments, name)
    for name in ("needs_reference", "add_tcod_arguments", "validate_tcod_args", "ArgumentError", "parse_args"):
        assert hasattr(arguments, name)


def test_arguments_module_stays_under_500_lines():
    lines = (ROOT / "slime/utils/arguments.py").read_text().count("\n")
    assert lines < 500, f"slime/utils/arguments.py has {lines} lines: move a whole group into its own module"
