"""How train.py ends: one summary line on every run, Ctrl-C without a traceback, every env closed, nothing left.

Two real tiny runs (Ray trainer actor, hf_engine, the agent loop) run side by side as ``python train.py``
subprocesses: one finishes, one gets SIGINT sent to its process group, as a terminal's Ctrl-C does, while
two episodes are inside ``env.step``. The environment, written here, logs every build and ``close()``.
Stand-in trainer and manager (no Ray) cover the failed and interrupted paths of ``train.main`` in-process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import train
from slime.ray.local_ray import LocalRay, _psutil
from slime.utils.loop_runner import run_until_complete

ROOT = Path(__file__).resolve().parents[1]
ENV = """
import os, time
from examples.agent_envs import build_env as build_gridnav

LOG = {log!r}
built = []


class Logged:
    def __init__(self, inner, index, hang):
        self.inner, self.index, self.hang = inner, index, hang

    def reset(self):
        return self.inner.reset()

    def step(self, text):
        if self.hang:  # the second step's episodes: Ctrl-C comes while they are in here
            open(LOG + ".hung", "a").write(f"{{self.index}}\\n")
            time.sleep(120)
        return self.inner.step(text)

    def format_observation(self, observation):
        return self.inner.format_observation(observation)

    def close(self):
        open(LOG + ".closed", "a").write(f"{{self.index}}\\n")
        self.inner.close()


def build_env(sample, args):
    built.append(sample.index)
    open(LOG + ".built", "a").write(f"{{sample.index}}\\n")
    return Logged(build_gridnav(sample, args), sample.index, hang={hang} and len(built) > 2)
"""


def lines(path: Path) -> list[str]:
    return sorted(path.read_text().split()) if path.exists() else []


class Run:
    """``python train.py ...`` in its own process group; records its descendants while it runs."""

    def __init__(self, root: Path, name: str, inputs: dict, steps: int, hang: bool):
        self.out = root / name
        self.log = root / f"{name}_env"
        env_path = root / f"{name}_env.py"
        env_path.write_text(ENV.format(log=str(self.log), hang=hang))
        config = root / f"{name}.yaml"
        config.write_text(f"rollout_interaction_env_path: {env_path}\n")
        argv = ["--hf-checkpoint", inputs["model"], "--prompt-data", inputs["data"], "--rollout-batch-size", "2",
                "--n-samples-per-prompt", "1", "--num-rollout", str(steps), "--rollout-max-response-len", "100",
                "--max-turn-response-len", "4", "--max-turns", "2", "--custom-config-path", str(config),
                "--save", str(self.out), "--save-interval", "1"]
        self.stderr_path, self.stdout_path = root / f"{name}.err", root / f"{name}.out"
        self.proc = subprocess.Popen(
            [sys.executable, "train.py", *argv], cwd=ROOT, stdout=open(self.stdout_path, "w"),
            stderr=open(self.stderr_path, "w"), env={**os.environ, "PYTHONUNBUFFERED": "1"},
            # Ctrl-C as in a terminal, even when pytest runs in the background (where SIGINT is ignored).
            preexec_fn=lambda: (os.setpgrp(), signal.signal(signal.SIGINT, signal.SIG_DFL)))
        self.children, self.ended_at = {}, None
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        psutil = _psutil()
        me = psutil.Process(self.proc.pid)
        while self.proc.poll() is None:
            try:
                for child in me.children(recursive=True):
                    self.children.setdefault(child.pid, child)
            except psutil.Error:
                pass
            time.sleep(0.2)

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self.ended_at = time.monotonic()
        return code

    def alive_10s_after_exit(self) -> list[str]:
        psutil = _psutil()
        time.sleep(max(0.0, self.ended_at + 10 - time.monotonic()))
        alive = []
        for child in self.children.values():
            try:
                if child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{child.pid} {child.name()}")
            except psutil.Error:
                continue
        return alive

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def output(self) -> str:
        return self.stdout_path.read_text() + self.stderr()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from examples.agent_envs.make_data import task_rows
    from slime.utils.tiny_models import save_tiny_checkpoint

    root = tmp_path_factory.mktemp("exits")
    model = save_tiny_checkpoint(root / "model", hidden_size=32, num_layers=1, num_heads=2, seed=0)
    data = root / "tasks.jsonl"
    rows = task_rows("gridnav", 8, 0, {"size": 4, "walls": 0.0}, min_len=2, max_len=4)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    inputs = {"model": str(model), "data": str(data)}
    started = {"finished": Run(root, "finished", inputs, steps=2, hang=False),
               "interrupted": Run(root, "interrupted", inputs, steps=20, hang=True)}
    yield started
    for run in started.values():
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)


def test_a_finished_run_ends_with_the_summary_line(runs):
    run = runs["finished"]
    assert run.wait(240) == 0, run.stderr()[-3000:]
    out = run.out
    assert run.stderr().splitlines()[-1] == (f"train.py: done: 2 of 2 steps (last: step 1), last checkpoint "
                                             f"{out}/iter_0000001, "
                                             f"metrics {out}/metrics.jsonl")
    assert "Traceback" not in run.output()
    assert lines(run.log.with_suffix(".closed")) == lines(run.log.with_suffix(".built")) != []
    assert run.alive_10s_after_exit() == []


def test_ctrl_c_stops_quietly_closes_every_env_and_leaves_no_process(runs):
    run = runs["interrupted"]
    hung = run.log.with_name(run.log.name + ".hung")
    deadline = time.monotonic() + 240
    while len(lines(hung)) < 2:  # step 0's row is written; both episodes of step 1 are inside env.step
        assert run.proc.poll() is None and time.monotonic() < deadline, run.stderr()[-3000:]
        time.sleep(0.2)
    assert (run.out / "metrics.jsonl").exists()
    os.killpg(run.proc.pid, signal.SIGINT)
    assert run.wait(90) == 130, run.stderr()[-3000:]
    err = run.stderr()
    assert err.splitlines()[-2:] == [
        "train.py: interrupted at step 1; stopping engines and trainers",
        f"train.py: interrupted: 1 of 20 steps (last: step 0), last checkpoint {run.out}/iter_0000000, "
        f"metrics {run.out}/metrics.jsonl"]
    output = run.output()
    assert "Traceback" not in output and "no running event loop" not in output, output[-3000:]
    built = lines(run.log.with_name(run.log.name + ".built"))
    assert len(built) == 4 and lines(run.log.with_name(run.log.name + ".closed")) == built
    assert run.children, "the run's processes were not seen"
    assert run.alive_10s_after_exit() == []


# ------------------------------------------------------------------ in-process: stand-ins, no Ray
@pytest.fixture
def stubbed(monkeypatch, tmp_path):
    import slime.ray.actor_group
    import slime.ray.rollout
    from test_train_driver import FAULTS, StubRolloutManager, StubTrainer

    from slime.utils.tiny_models import save_tiny_checkpoint

    monkeypatch.setattr(train, "_init_ray", lambda args: None)
    monkeypatch.setattr(slime.ray.actor_group, "TrainerGroup", StubTrainer)
    monkeypatch.setattr(slime.ray.rollout, "RolloutManager", StubRolloutManager)
    model = save_tiny_checkpoint(tmp_path / "model", hidden_size=16, num_layers=1, num_heads=2)
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"input": "task"}) + "\n")
    base = ["--hf-checkpoint", str(model), "--prompt-data", str(data), "--num-rollout", "4",
            "--rollout-batch-size", "1", "--n-samples-per-prompt", "2", "--save", str(tmp_path / "out"),
            "--allow-no-reward"]  # the stand-in rollout manager gives its own rewards
    yield FAULTS, base, tmp_path / "out"
    FAULTS.at = None


@pytest.mark.parametrize("fault", ["nan", "episodes"])
def test_a_failed_run_prints_the_summary_after_its_paragraph(stubbed, capsys, fault):
    from slime.backends.fsdp_utils.guards import NonFiniteError
    from slime.rollout.trainable_samples import TooManyFailures

    faults, base, out = stubbed
    if fault == "nan":
        faults.at, faults.error = ("train", 2), NonFiniteError("rollout 2: loss is nan")
        paragraph = "train.py: error: training stopped before the optimizer step: rollout 2: loss is nan"
    else:
        faults.at, faults.error = ("generate", 2), TooManyFailures("2 of 2 samples failed in this rollout")
        paragraph = "train.py: error: 2 of 2 samples failed in this rollout"
    assert train.main([*base, "--save-interval", "1"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-2].startswith(paragraph)
    assert err.splitlines()[-1] == (f"train.py: failed: 2 of 4 steps (last: step 1), last checkpoint "
                                    f"{out}/iter_0000001, metrics {out}/metrics.jsonl")


def test_an_interrupt_before_any_step_says_none(stubbed, capsys):
    faults, base, out = stubbed
    faults.at, faults.error = ("generate", 0), KeyboardInterrupt()
    assert train.main(base) == 130
    err = capsys.readouterr().err.splitlines()
    assert err[-2:] == ["train.py: interrupted at step 0; stopping engines and trainers",
                        f"train.py: interrupted: 0 of 4 steps, last checkpoint none, metrics {out}/metrics.jsonl"]


# ------------------------------------------------------------------ pieces
def test_a_failed_or_interrupted_gather_still_runs_every_episodes_finally():
    """What the agent loop's ``finally: env.close()`` needs: the other episodes are cancelled and awaited."""
    closed = []

    async def episode(i):
        try:
            if i == 0:
                await asyncio.sleep(0.05)
                raise KeyboardInterrupt
            await asyncio.sleep(30)
        finally:
            await asyncio.to_thread(closed.append, i)  # needs a running loop, as env.close() does

    async def rollout():
        await asyncio.gather(*(episode(i) for i in range(3)))

    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_until_complete(loop, rollout())
        assert sorted(closed) == [0, 1, 2]
        assert not [t for t in asyncio.all_tasks(loop) if not t.done()]
    finally:
        loop.close()


def test_processes_left_after_ray_shutdown_are_killed(monkeypatch):
    import ray

    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        local = LocalRay()
        monkeypatch.setattr(local, "_roots", lambda: [stray.pid])  # stands for an agent that outlives its raylet
        monkeypatch.setattr(ray, "shutdown", lambda: None)
        start = time.monotonic()
        assert local.stop(grace=0.5) == 1
        assert not local.alive() and time.monotonic() - start < 10  # killed, not waited for
    finally:
        if stray.poll() is None:
            stray.kill()
