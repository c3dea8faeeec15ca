"""A run that nothing gives a reward is refused before Ray, naming what could supply one, unless the user says it
is intended (--allow-no-reward). Before: it trained on reward 0 with grad norm 0 at every step and ended "done"."""

import json

import pytest

import train
from examples.agent_envs.make_data import task_rows
from slime.utils.tiny_models import save_tiny_checkpoint


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("reward_source")
    model = save_tiny_checkpoint(root / "model", hidden_size=16, num_layers=1, num_heads=2)
    data = root / "prompts.jsonl"
    rows = task_rows("gridnav", 1, 0, {"size": 4, "walls": 0.0}, min_len=2, max_len=4)  # a task with a label
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"model": str(model), "data": str(data)}


def main(files, *extra):
    return train.main(["--hf-checkpoint", files["model"], "--prompt-data", files["data"], "--num-rollout", "2",
                       "--label-key", "label", *extra])


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_run_with_no_reward_source_is_refused_naming_what_could_supply_one(files, capsys, dry_run):
    import ray

    assert main(files, *(["--dry-run"] if dry_run else [])) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["train.py: error: nothing supplies a reward, so every step would train on reward 0: add --use-opd "
                   "(a teacher), a reward model (--rm-type, --custom-rm-path or --rm-url) or an environment "
                   "(--rollout-interaction-env-path), or pass --allow-no-reward if that is intended"], err
    assert not ray.is_initialized()


@pytest.mark.parametrize("source", [
    ["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", "MODEL"],
    ["--rm-type", "exact_match"],
    ["--max-turns", "2", "--rollout-interaction-env-path", "examples.agent_envs"],
    ["--loss-type", "sft_loss"],  # SFT trains on its targets, not on a reward
    ["--custom-generate-function-path", "my_generate.generate"],  # the user's own code may set rewards
    ["--allow-no-reward"],  # said to be intended
])
def test_any_reward_source_or_the_opt_in_passes(files, tmp_path, monkeypatch, capsys, source):
    (tmp_path / "my_generate.py").write_text(
        "async def generate(args, sample, sampling_params, evaluation=False):\n"
        "    sample.reward = 1.0\n"
        "    return sample\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    source = [files["model"] if part == "MODEL" else part for part in source]
    assert main(files, *source, "--dry-run") == 0, capsys.readouterr().err[-2000:]
