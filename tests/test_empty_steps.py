"""A step whose samples were all removed is skipped with one line; several in a row stop the run with one line.

Real tiny runs of train.py (Ray trainer actor, hf_engine, the agent loop on gridnav): B2F replays an expert
prefix of at least two actions, and a response budget of 8 tokens is full before the student's first turn,
so every episode is removed (outcome ``context_full``).
"""

import json

import pytest

import train
from examples.agent_envs.make_data import task_rows
from slime.rollout.empty_steps import EMPTY_STEPS_LIMIT
from slime.utils.metrics import read_metrics
from slime.utils.tiny_models import save_tiny_checkpoint


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("empty")
    student = save_tiny_checkpoint(root / "student", hidden_size=32, num_layers=1, num_heads=2, seed=0)
    data = root / "tasks.jsonl"
    rows = task_rows("gridnav", 6, 0, {"size": 5, "walls": 0.0}, min_len=3, max_len=6)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    yield {"root": root, "student": str(student), "data": str(data)}
    import ray

    ray.shutdown()


def run(setup, name, steps, budget):
    out = setup["root"] / name
    argv = ["--hf-checkpoint", setup["student"], "--prompt-data", setup["data"], "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "1", "--num-rollout", str(steps), "--rollout-max-response-len", str(budget),
            "--max-turn-response-len", "4", "--max-turns", "6", "--rollout-interaction-env-path", "examples.agent_envs",
            "--custom-generate-function-path", "examples.multi_turn_tcod.rollout.generate",
            "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", setup["student"], "--lr", "1e-3",
            "--use-tcod", "--tcod-mode", "b2f", "--tcod-k-start", "1", "--tcod-eta", "100", "--save", str(out)]
    return train.main(argv), out


def test_a_step_with_every_sample_removed_is_skipped_with_one_line(setup, capfd):
    code, out = run(setup, "skipped", steps=EMPTY_STEPS_LIMIT - 1, budget=8)
    err = capfd.readouterr().err
    assert code == 0, err[-3000:]
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "skipped:" in line]
    assert len(lines) == EMPTY_STEPS_LIMIT - 1, err[-3000:]
    assert lines[0].startswith("train.py: step 0 skipped: all 2 samples removed, 2 because the trajectory filled its "
                               "budget before a student turn (--rollout-max-response-len 8)"), lines[0]
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(EMPTY_STEPS_LIMIT - 1))
    assert all(r["rollout/skipped"] == 1 and r["rollout/removed"] == 2 and r["rollout/kept"] == 0 for r in rows)
    assert all(r["rollout/trained_tokens"] == 0 for r in rows)


def test_steps_in_a_row_with_nothing_to_train_stop_the_run_naming_the_flag(setup, capfd):
    code, out = run(setup, "stopped", steps=EMPTY_STEPS_LIMIT + 2, budget=8)
    err = capfd.readouterr().err
    assert code == 1 and "Traceback" not in err, err[-3000:]
    [line] = [line for line in err.splitlines() if line.startswith("train.py: error:")]
    assert f"{EMPTY_STEPS_LIMIT} steps in a row" in line and line.endswith("raise --rollout-max-response-len"), line
    rows = read_metrics(out / "metrics.jsonl")  # every skipped step has its row, the last one included
    assert [r["step"] for r in rows] == list(range(EMPTY_STEPS_LIMIT))


def test_a_budget_the_prefix_fits_trains_every_step_and_the_bar_shows_depth_and_kl(setup, capfd):
    code, out = run(setup, "trained", steps=1, budget=400)
    err = capfd.readouterr().err
    assert code == 0
    [row] = read_metrics(out / "metrics.jsonl")
    assert "rollout/skipped" not in row and row["rollout/kept"] == 2 and row["tcod/prefix_len"] >= 2
    # The progress bar of a distillation run: TCOD's depth and the distillation KL, the environment's success
    # under its own name (OPD trains on no reward).
    [bar] = [line for line in err.replace("\r", "\n").splitlines() if "1/1 [" in line and "depth=" in line][-1:]
    assert "depth=1" in bar and f"opd_kl={row['opd/reverse_kl']:.3g}" in bar and "env_success=" in bar, bar
    assert "reward=" not in bar


def test_an_episode_the_engine_aborted_is_named_as_such():
    from types import SimpleNamespace

    from slime.rollout.empty_steps import removal_reason
    from slime.utils.types import Sample, Status

    sample = Sample(status=Status.FAILED, metadata={"outcome": "engine_abort"})
    assert removal_reason(SimpleNamespace(), sample)[0] == "the engine aborted the request"
    sample.metadata["outcome"] = "env_error"
    assert removal_reason(SimpleNamespace(env_step_timeout=300), sample)[0] == "the environment failed"
