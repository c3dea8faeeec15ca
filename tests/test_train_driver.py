"""train.py's step loop with stand-in trainer and rollout manager (no Ray, no engines): the metrics row of a
step survives a crash at any point of the step, a non-finite step saves nothing, and runs without --save
leave no weight-sync folder behind.

A crash is simulated by raising a BaseException from a named phase of a named step (what SIGKILL would
interrupt there); the run is then resumed with --load as a user would.
"""

from __future__ import annotations

import json
import os

import pytest
from fsdp_helpers import make_samples

import train
from slime.backends.fsdp_utils.guards import NonFiniteError
from slime.utils.metrics import read_metrics
from slime.utils.tiny_models import save_tiny_checkpoint


class Killed(BaseException):
    """Stands for SIGKILL: nothing in train.py catches it."""


class Faults:
    def __init__(self):
        self.at: tuple[str, int] | None = None  # (phase, rollout id)
        self.error: BaseException = Killed()
        self.step = -1

    def hit(self, phase, step=None):
        if self.at == (phase, self.step if step is None else step):
            raise self.error


FAULTS = Faults()


class StubData:
    def __init__(self):
        self.offset = 0

    def state_dict(self):
        return {"offset": self.offset}

    def load_state_dict(self, state):
        self.offset = state["offset"]


class StubRolloutManager:
    def __init__(self, args, tokenizer):
        self.data_source, self.eval_sets, self.needs_engines = StubData(), {}, True

    def generate(self, rollout_id):
        FAULTS.step = rollout_id
        FAULTS.hit("generate")
        self.data_source.offset += 1
        samples = make_samples(n=2)
        return samples, [samples], {}

    def wait_engines(self):
        pass

    def engines_are_external(self):
        return False

    def update_weights(self, path):
        FAULTS.hit("update_weights")

    def last_timings(self):
        return {}

    def shutdown(self):
        pass


class StubTrainer:
    def __init__(self, args):
        pass

    def train(self, rollout_id, samples, kl_coef):
        FAULTS.hit("train")
        return {"loss": float(rollout_id)}

    def export_hf(self, path):
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "model.safetensors"), "w") as handle:
            handle.write("weights")
        FAULTS.hit("export_hf")

    def save(self, path):
        os.makedirs(path)
        with open(os.path.join(path, "trainer_meta.json"), "w") as handle:
            json.dump({"ok": True}, handle)
        FAULTS.hit("save")

    def load(self, path):
        pass

    def shutdown(self):
        pass


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("driver")
    model = save_tiny_checkpoint(root / "model", hidden_size=16, num_layers=1, num_heads=2)
    data = root / "prompts.jsonl"
    data.write_text(json.dumps({"input": "task"}) + "\n")
    return {"model": str(model), "data": str(data)}


@pytest.fixture(autouse=True)
def stubs(monkeypatch):
    import slime.ray.actor_group
    import slime.ray.rollout

    monkeypatch.setattr(train, "_init_ray", lambda args: None)
    monkeypatch.setattr(slime.ray.actor_group, "TrainerGroup", StubTrainer)
    monkeypatch.setattr(slime.ray.rollout, "RolloutManager", StubRolloutManager)
    FAULTS.at, FAULTS.error = None, Killed()
    yield


def main(inputs, *extra, steps=5):
    return train.main(["--hf-checkpoint", inputs["model"], "--prompt-data", inputs["data"], "--num-rollout",
                       str(steps), "--rollout-batch-size", "1", "--n-samples-per-prompt", "2", "--allow-no-reward",
                       *extra])  # the stand-in rollout manager gives its own rewards


# A crash inside export_hf / update_weights came after the checkpoint in the old order (save, sync, log),
# which lost the row: steps [0, 1, 3, 4]. "save" crashes mid-checkpoint; "generate" of step 3 comes just
# after step 2's checkpoint is complete.
@pytest.mark.parametrize("phase,step", [("export_hf", 2), ("update_weights", 2), ("save", 2), ("generate", 3),
                                        ("train", 2)])
def test_metrics_row_of_every_step_survives_a_crash_and_resume(inputs, tmp_path, phase, step):
    save = ["--save", str(tmp_path), "--save-interval", "1"]
    FAULTS.at = (phase, step)
    with pytest.raises(Killed):
        main(inputs, *save)
    FAULTS.at = None
    assert main(inputs, *save, "--load", str(tmp_path)) == 0
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3, 4]


def test_a_non_finite_step_saves_nothing_and_stops_with_one_paragraph(inputs, tmp_path, capsys):
    FAULTS.at, FAULTS.error = ("train", 2), NonFiniteError("rollout 2: teacher reply of sample 0 is nan")
    assert main(inputs, "--save", str(tmp_path), "--save-interval", "1") == 1
    err = capsys.readouterr().err
    assert "train.py: error: training stopped before the optimizer step: rollout 2: teacher reply" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_0000000", "iter_0000001"]
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1]


@pytest.mark.parametrize("crash", [False, True])
def test_runs_without_save_remove_their_weight_sync_folder(inputs, tmp_path, monkeypatch, crash):
    import tempfile

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    made = []
    real_mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kw: made.append(real_mkdtemp(**kw)) or made[-1])
    metrics = ["--metrics-dir", str(tmp_path / "metrics")]
    if crash:
        FAULTS.at = ("update_weights", 1)  # after the policy copy was written
        with pytest.raises(Killed):
            main(inputs, *metrics, steps=3)
    else:
        assert main(inputs, *metrics, steps=3) == 0
    assert made and all(os.path.basename(m).startswith("slime-sync-") for m in made)
    assert not any(temp.iterdir()), list(temp.iterdir())


def test_with_save_the_weight_sync_folder_is_kept_under_it(inputs, tmp_path):
    assert main(inputs, "--save", str(tmp_path), steps=1) == 0
    assert (tmp_path / "weight_sync" / "model.safetensors").exists()
