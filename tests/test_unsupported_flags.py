"""slime flags this runtime does not implement are all named in one line, each with what to use instead.

Before: ``--num-epoch`` got "did you mean --num-experts?", and a command line with several refused flags
(``--colocate``, ``--lr-decay-style cosine``) was refused one flag per run.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from slime.utils.arguments import parse_args

ROOT = Path(__file__).resolve().parents[1]
BASE = ["--hf-checkpoint", "m", "--num-rollout", "1"]


def error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv=[*BASE, *argv])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    return line.split(": error: ", 1)[1]


def test_slime_flags_missing_here_are_all_answered_with_what_to_use(capsys):
    line = error(capsys, "--num-epoch", "3", "--offload", "--save-hf", "/x")
    assert line == (
        "3 slime flag(s) this runtime does not implement, with what to use instead: --num-epoch (use --num-rollout, "
        "the number of steps; one pass over the prompts takes their count / --rollout-batch-size steps); --offload "
        "(drop it: the trainer and the rollout engines always get disjoint devices here); --save-hf (drop it: every "
        "checkpoint holds the policy as a HF folder (iter_N/model/hf))")
    assert "--num-experts" not in line


def test_refused_flags_are_listed_with_the_missing_ones_and_typos_still_get_their_hint(capsys):
    line = error(capsys, "--num-epoch", "3", "--colocate", "--lr-decay-style", "cosine", "--lrr", "1")
    assert line.startswith("3 slime flag(s) this runtime does not implement")
    assert "--colocate (drop it" in line and "--lr-decay-style cosine (use constant" in line
    assert line.endswith("; unrecognized arguments: --lrr (--lrr: did you mean --lr?)"), line


def test_two_refused_flags_are_named_together(capsys):
    line = error(capsys, "--colocate", "--recompute-granularity", "selective")
    assert line == ("2 slime flag(s) this runtime does not implement, with what to use instead: --colocate (drop it: "
                    "the trainer and the rollout engines always get disjoint devices here); --recompute-granularity "
                    "selective (use full: the trainers recompute whole layers)")


def test_a_near_miss_of_a_missing_slime_flag_gets_its_answer(capsys):
    line = error(capsys, "--num-epochs", "3")
    assert line.startswith("unrecognized arguments: --num-epochs 3 (--num-epochs: did you mean --num-epoch? (a slime "
                           "flag not implemented here: use --num-rollout"), line


def test_train_py_says_it_in_one_line_before_anything_starts():
    out = subprocess.run([sys.executable, "train.py", *BASE, "--num-epoch", "2", "--colocate"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert line.startswith("train.py: error: 2 slime flag(s) this runtime does not implement"), line
