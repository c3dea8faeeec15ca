"""The adaptive reward-side KL controller inside train.py: tiny PPO (policy + critic + reference) on CPU.

Three train.py runs shared by the tests (each pays Ray / engine / trainer start-up):

* ``full``     4 steps uninterrupted, saving every step;
* ``stopped``  the same run stopped after step 1 (``--num-rollout 2``), saving every step;
* ``resumed``  ``--load`` of the stopped run's save folder, continued to 4 steps.

The task (reward = share of vowels in the answer, which pulls the policy away from the reference) and
the flags come from benchmarks/adaptive_kl_ppo.py. The controller measures the KL summed per
sequence here (``--kl-ctrl-unit sequence``); the benchmark covers the per-token unit.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

import train
from benchmarks.adaptive_kl_ppo import train_argv, write_task
from slime.utils.kl_controller import AdaptiveKLController
from slime.utils.metrics import read_metrics

STEPS, STOP_AFTER = 4, 1
# A policy equal to its reference has KL 0, so step 0 always asks for a smaller beta; with lr 5e-2 the
# summed KL passes this target within a couple of updates, so both directions are exercised.
TARGET, HORIZON, BATCH = 0.3, 32.0, 16
CTRL_KEYS = ("kl_ctrl/observed_kl", "kl_ctrl/target_kl", "kl_ctrl/coef", "kl_ctrl/error", "kl_ctrl/clipped",
             "kl_ctrl/next_coef")


def _argv(task, out, num_rollout):
    model, data = task
    argv = train_argv(model, data, out, ctrl="adaptive", num_rollout=num_rollout, kl_coef=0.05,
                      kl_target=TARGET, horizon=HORIZON, lr=5e-2)
    argv[argv.index("--kl-ctrl-unit") + 1] = "sequence"
    return argv + ["--save", str(out), "--save-interval", "1"]


def _saved_state(save, step):
    """The controller's state in an iteration folder: the slime PR's file, under iter_X/ instead of {save}/."""
    return json.loads((save / f"iter_{step:07d}" / "kl_ctrl" / f"kl_ctrl_state_dict_{step}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import ray

    owns_ray = not ray.is_initialized()
    root = tmp_path_factory.mktemp("adaptive_kl")
    task = write_task(root)
    try:
        assert train.main(_argv(task, root / "full", STEPS)) == 0
        assert train.main(_argv(task, root / "split", STOP_AFTER + 1)) == 0
        stopped = read_metrics(root / "split" / "metrics.jsonl")
        stopped_ckpt = _saved_state(root / "split", STOP_AFTER)
        assert train.main(_argv(task, root / "split", STEPS) + ["--load", str(root / "split")]) == 0
    finally:
        if owns_ray and ray.is_initialized():
            ray.shutdown()
    return SimpleNamespace(root=root, full=read_metrics(root / "full" / "metrics.jsonl"), stopped=stopped,
                           stopped_ckpt=stopped_ckpt, resumed=read_metrics(root / "split" / "metrics.jsonl"))


def test_every_step_logs_the_controller_metrics_in_the_configured_unit(runs):
    assert [r["step"] for r in runs.full] == list(range(STEPS))
    for rec in runs.full:
        assert all(key in rec for key in CTRL_KEYS), sorted(k for k in rec if k.startswith("kl"))
        assert rec["kl_ctrl/target_kl"] == TARGET
        # The sequence unit: the summed KL of a sample, not the per-token mean (responses have ~8 tokens).
        assert rec["kl_ctrl/observed_kl"] == rec["kl/observed_seq_sum"]
        assert rec["kl_ctrl/clipped"] in (0.0, 1.0)
    # Step 0 scores the starting policy, which is its own reference: KL exactly 0, error clipped at -0.2.
    assert runs.full[0]["kl_ctrl/observed_kl"] == 0.0
    assert runs.full[0]["kl_ctrl/error"] == -0.2 and runs.full[0]["kl_ctrl/clipped"] == 1.0


def test_coefficient_follows_the_observed_kl_between_steps(runs):
    recs = runs.full
    assert recs[0]["kl_ctrl/coef"] == 0.05  # the initial --kl-coef shapes the first batch
    directions = set()
    for prev, cur in zip(recs, recs[1:]):
        # Batch n is shaped with the value the controller reached after batch n-1 ...
        assert cur["kl_ctrl/coef"] == prev["kl_ctrl/next_coef"]
        # ... which moved up when that batch's KL was above the target and down when below.
        step = cur["kl_ctrl/coef"] / prev["kl_ctrl/coef"] - 1.0
        wanted = prev["kl_ctrl/observed_kl"] / TARGET - 1.0
        assert step != 0.0 and math.copysign(1, step) == math.copysign(1, wanted), (prev, cur)
        error = max(-0.2, min(0.2, wanted))
        assert step == pytest.approx(error * prev["train/samples"] / HORIZON, rel=1e-9)
        directions.add(step > 0)
    assert directions == {True, False}, "the run never crossed the target: retune TARGET or the lr"


def test_every_checkpoint_holds_the_controller_state(runs):
    for rec in runs.full:
        state = _saved_state(runs.root / "full", rec["step"])
        assert state == {"value": rec["kl_ctrl/next_coef"], "target": TARGET, "horizon": HORIZON}
        trainer_state = json.loads((runs.root / "full" / f"iter_{rec['step']:07d}" / "trainer_state.json").read_text())
        assert "kl_controller" not in trainer_state


def test_stopped_and_resumed_run_matches_the_uninterrupted_one(runs):
    assert [r["step"] for r in runs.stopped] == list(range(STOP_AFTER + 1))
    assert runs.stopped_ckpt["value"] == runs.stopped[-1]["kl_ctrl/next_coef"]
    assert [r["step"] for r in runs.resumed] == list(range(STEPS))
    # The first resumed step uses the restored coefficient, not --kl-coef again.
    assert runs.resumed[STOP_AFTER + 1]["kl_ctrl/coef"] == runs.stopped_ckpt["value"]
    for full, resumed in zip(runs.full, runs.resumed):
        for key in ("kl_ctrl/coef", "kl_ctrl/next_coef", "kl_ctrl/observed_kl", "kl/observed_sample_mean",
                    "rollout/response_len", "advantages/mean", "loss", "critic/value_loss"):
            assert resumed[key] == pytest.approx(full[key], rel=1e-5, abs=1e-7), (full["step"], key)


# ---------------------------------------------------------------------------- driver glue, no Ray
def test_driver_feeds_the_unit_the_flag_names_and_never_invents_a_kl():
    stats = {"kl/observed_token_mean": 0.25, "kl/observed_sample_mean": 0.2, "kl/observed_seq_sum": 3.0}
    for unit, expected in (("token", 0.2), ("sequence", 3.0)):
        ctrl = AdaptiveKLController(0.1, target_kl=1.0, horizon=10.0)
        out = train._update_kl_controller(SimpleNamespace(kl_ctrl_unit=unit), ctrl, stats, 4)
        assert out["kl_ctrl/observed_kl"] == expected and (ctrl.value - 0.1) * (expected - 1.0) > 0
    # Without a reference model the trainer reports no KL: an adaptive controller must not read it as 0.
    with pytest.raises(RuntimeError, match="reference"):
        train._update_kl_controller(SimpleNamespace(kl_ctrl_unit="token"), AdaptiveKLController(0.1, 1.0, 10.0),
                                    {}, 4)
    # --kl-ctrl fixed builds no controller: the coefficient is --kl-coef.
    fixed = SimpleNamespace(kl_ctrl_unit="token", kl_coef=0.02)
    assert train._update_kl_controller(fixed, None, stats, 4) == {"kl_ctrl/coef": 0.02}
