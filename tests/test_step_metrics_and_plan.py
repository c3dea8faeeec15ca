import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from slime.utils.metrics import MetricsLogger, read_metrics
from slime.utils.step_metrics import per_turn_kl, rollout_metrics
from slime.utils.types import Sample, Status

ROOT = Path(__file__).resolve().parents[1]


def _trajectory(turns, obs_len=2, prefix=0):
    """A sample whose response is student turns (lengths ``turns``) separated by observations."""
    s = Sample(tokens=[0, 0, 0], metadata={"prefix_turns": prefix})
    spans = []
    for j, n in enumerate(turns):
        start = s.response_length
        s.append_response_tokens(tokens=[1] * n, log_probs=[0.0] * n, trainable=True)
        spans.append([start, s.response_length])
        if j < len(turns) - 1:
            s.append_response_tokens(tokens=[2] * obs_len, trainable=False)
    s.metadata.update(turn_spans=spans, num_turns=len(turns), success=False, outcome="done")
    return s


def test_per_turn_kl_sums_turn_tokens_and_ignores_observations():
    a = _trajectory([2, 3])          # response: 2 student, 2 obs, 3 student
    b = _trajectory([1], prefix=1)   # B2F: its only student turn is episode turn 1
    kl_a = [1.0, 2.0, 100.0, 100.0, 0.5, 0.5, 0.5]  # observation KL (100) must not count
    kl_b = [4.0]
    turns, trajectory = per_turn_kl([a, b], [kl_a, kl_b])
    assert trajectory == [4.5, 4.0]
    assert turns == [3.0, (1.5 + 4.0) / 2]


def test_rollout_metrics_counts_outcomes():
    args = SimpleNamespace()
    good = _trajectory([2])
    good.metadata.update(success=True, task_reward=1.0, episode_plan={"mode": "f2b", "depth": 3})
    cut = _trajectory([2, 2])
    cut.metadata.update(outcome="cut", task_reward=0.0, episode_plan={"mode": "f2b", "depth": 3})
    failed = Sample(status=Status.FAILED, metadata={"num_turns": 0, "outcome": "env_error"})
    # An aborted episode counts apart and, like a failed one, not towards success, turns or reward.
    aborted = _trajectory([2, 2, 2])
    aborted.status = Status.ABORTED
    aborted.metadata.update(outcome="aborted", task_reward=5.0, success=True)
    m = rollout_metrics(args, [[good, cut, failed, aborted]], [good, cut],
                        {"per_sample_opd_kl": [[1, 1], [1, 1, 0, 0, 2, 2]]})
    assert m["multi_turn/success_rate"] == 0.5 and m["multi_turn/turns"] == 1.5 and m["rollout/reward"] == 0.5
    assert m["multi_turn/cut"] == 1 and m["multi_turn/env_failed"] == 1 and m["multi_turn/aborted"] == 1
    assert m["tcod/depth"] == 3
    assert m["rollout/trained_tokens"] == 6
    assert m["opd/per_turn_kl"] == [2.0, 4.0]


def test_metrics_logger_resume_drops_rerun_steps(tmp_path):
    args = SimpleNamespace(metrics_dir=str(tmp_path), save=None)
    log = MetricsLogger(args)
    for step in range(5):
        log.log(step, {"loss": float(step), "per_turn": [1.0, 2.0]})
    log.close()
    log = MetricsLogger(args, resume_step=3)
    log.log(3, {"loss": 30.0})
    log.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert records[-1]["loss"] == 30.0 and records[0]["per_turn"] == [1.0, 2.0]


def _run(cmd, env=None):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=120)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """A few gridnav tasks with expert actions: --dry-run checks that the data files exist and parse."""
    path = tmp_path_factory.mktemp("data") / "tasks.jsonl"
    subprocess.run([sys.executable, "-m", "examples.agent_envs.make_data", "--env", "gridnav", "--n", "4",
                    "--out", str(path)], cwd=ROOT, check=True, capture_output=True)
    return str(path)


def test_train_dry_run_prints_plan_and_starts_nothing(tasks, tmp_path):
    from slime.utils.tiny_models import save_tiny_checkpoint

    # The dry run checks the model folder as the real run does: a tiny one (a missing one is refused).
    model = str(save_tiny_checkpoint(tmp_path / "model", hidden_size=16, num_layers=1, num_heads=2))
    out = _run([sys.executable, "train.py", "--dry-run", "--hf-checkpoint", model, "--prompt-data", tasks,
                "--use-opd", "--opd-type", "sglang",
                "--rm-url", "http://127.0.0.1:1/generate", "--max-turns", "30", "--use-tcod", "--tcod-mode", "f2b",
                "--rollout-interaction-env-path", "examples.agent_envs",
                "--tcod-eta", "6", "--num-rollout", "250", "--rollout-num-gpus", "2"])
    assert out.returncode == 0, out.stderr
    assert "TCOD      : f2b, k(n) = min(1 + n // 6, 30)" in out.stdout
    assert "n=0:k=1 n=6:k=2 n=12:k=3" in out.stdout
    assert "engines   : 2 x hf_engine" in out.stdout and "behind sglang-router (cache_aware) on 127.0.0.1" in out.stdout


def test_train_rejects_bad_flags_with_the_flag_named():
    out = _run([sys.executable, "train.py", "--dry-run", "--use-tcod", "--max-turns", "4", "--tcod-eta", "2",
                "--rollout-interaction-env-path", "examples.multi_turn_tcod.envs"])
    assert out.returncode != 0 and "--use-opd" in out.stderr


@pytest.mark.parametrize("mode", ["f2b", "b2f"])
def test_gpu_run_script_dry_run(mode, tasks):
    out = _run(["bash", "scripts/run-qwen3-8B-tcod-runtime.sh"],
               env={"DRY_RUN": "1", "TCOD_MODE": mode, "PYTHON": sys.executable, "DATA": tasks, "EVAL_DATA": tasks})
    assert out.returncode == 0, out.stderr
    eta = 6 if mode == "f2b" else 5
    assert f"TCOD      : {mode}, k(n) = min(1 + n // {eta}, 30)" in out.stdout
    assert "teacher server at http://127.0.0.1:13141/generate" in out.stdout
