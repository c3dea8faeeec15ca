"""--env-step-timeout and env faults in the agent loop: an environment call (build, reset, step) that raises or
hangs ends only its episode as FAILED (``env_error``, removed from training) with a message naming the call,
every other episode plays on and every built env is closed; a hung ``close()`` does not hold the episode."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import flaky_env
from examples.multi_turn_tcod import rollout
from slime.arguments.multi_turn_arguments import add_multi_turn_arguments, validate_multi_turn_args
from slime.utils.types import Sample
from test_interaction_env import Policy, State, make_args

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(rollout, "GenerateState", State)
    monkeypatch.setattr(rollout, "post", Policy(["up"]))
    flaky_env.CLOSED.clear()
    flaky_env.RELEASE.clear()
    yield
    flaky_env.RELEASE.set()  # let the abandoned calls finish


def task(i, **meta):
    return Sample(index=i, prompt="p", metadata={"env": "gridnav", "seed": i, "size": 5, **meta})


def play(samples, seconds=0.3, **overrides):
    args = make_args("flaky_env", env_step_timeout=seconds, max_turns=3, **overrides)

    async def run():
        try:
            return await asyncio.gather(*(rollout.generate(args, s, {"max_new_tokens": 400}) for s in samples))
        finally:
            # asyncio.run waits for the default executor's threads: free the hung calls once the episodes are over.
            flaky_env.RELEASE.set()

    return asyncio.run(run())


def failed(sample) -> bool:
    return sample.status == Sample.Status.FAILED and sample.metadata["outcome"] == "env_error" and sample.remove_sample


def test_a_hung_step_fails_only_its_episode_and_every_env_is_closed():
    start = time.monotonic()
    samples = play([task(0, hang_in="step"), task(1), task(2)])
    assert time.monotonic() - start < 20
    assert [failed(s) for s in samples] == [True, False, False]
    assert "step() did not return within 0.3 s (env_step_timeout)" in samples[0].metadata["error"]
    assert all(s.metadata["outcome"] in ("done", "max_turns") and s.metadata["num_turns"] >= 1 for s in samples[1:])
    assert sorted(flaky_env.CLOSED) == [0, 1, 2]  # the hung one was closed too
    assert samples[0].response_length >= 1  # trainers need a response span even for a dropped sample


@pytest.mark.parametrize("call", ["build", "reset"])
def test_a_hung_build_or_reset_fails_its_episode(call):
    samples = play([task(0, hang_in=call), task(1)])
    assert failed(samples[0]) and not failed(samples[1])
    name = "build_env" if call == "build" else "reset"
    assert f"{name}() did not return within 0.3 s" in samples[0].metadata["error"]
    assert samples[0].tokens and samples[0].metadata["num_turns"] == 0
    assert 1 in flaky_env.CLOSED and (0 in flaky_env.CLOSED) == (call == "reset")  # no env was built to close


@pytest.mark.parametrize(
    "fail_at,message",
    [(0, "ConnectionError: JVM crashed during reset"), (2, "RuntimeError: simulated crash at step 2")],
)
def test_an_env_that_raises_fails_only_its_episode(fail_at, message):
    samples = play([task(0, fail_at=fail_at), task(1), task(2, fail_at=-1)], seconds=30)
    assert [failed(s) for s in samples] == [True, False, False]
    assert message in samples[0].metadata["error"]
    assert samples[0].metadata["num_turns"] == max(0, fail_at)  # the turns before the crash are recorded
    assert sorted(flaky_env.CLOSED) == [0, 1, 2]


def test_a_malformed_step_fails_its_episode():
    samples = play([task(0, malformed_at=1), task(1)], seconds=30)
    assert failed(samples[0]) and not failed(samples[1])
    assert "step() must return (observation, done, info), got tuple" in samples[0].metadata["error"]


def test_a_hung_close_is_abandoned_and_the_episode_kept(caplog):
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=rollout.__name__):
        samples = play([task(0, hang_in="close"), task(1)])
    assert time.monotonic() - start < 20
    assert not any(failed(s) for s in samples) and samples[0].metadata["outcome"] in ("done", "max_turns")
    assert any("env.close() failed for sample 0" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_the_flag_must_be_positive_and_finite(value):
    parser = add_multi_turn_arguments(argparse.ArgumentParser())
    parser.set_defaults(rollout_max_response_len=256)
    args = parser.parse_args(["--env-step-timeout", value])
    with pytest.raises(ValueError, match="--env-step-timeout must be a finite number of seconds > 0"):
        validate_multi_turn_args(args)
    ok = parser.parse_args([])
    validate_multi_turn_args(ok)
    assert ok.env_step_timeout == 300.0


# A run whose only episode hangs in reset() forever (default bound of 300 s), driven the way this runtime
# (run_async on a persistent loop) and upstream (asyncio.run) drive rollouts.
SCRIPT = """
import asyncio, signal, sys
from argparse import Namespace
from examples.multi_turn_tcod import rollout
from slime.rollout.sglang_rollout import run_async
from slime.utils.types import Sample

if sys.argv[2] == "SIGTERM":  # a driver that cleans up on SIGTERM turns it into an exception
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
else:  # Ctrl-C as in a terminal, even when this suite runs in the background (where SIGINT is ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
import flaky_env
real_reset = flaky_env.FlakyEnv.reset
def reset(self):
    print("HUNG", flush=True)
    return real_reset(self)
flaky_env.FlakyEnv.reset = reset
class Tokenizer:  # never reached past reset(); a stub keeps transformers (seconds of import) out
    unk_token_id = None
    def convert_tokens_to_ids(self, token):
        return 1
class State:
    aborted = False
    def __init__(self, args):
        self.tokenizer = Tokenizer()
rollout.GenerateState = State
args = Namespace(hf_checkpoint="tiny", sglang_router_ip="127.0.0.1", sglang_router_port=1, max_turns=2,
                 max_turn_response_len=4, rollout_max_context_len=None, eval_max_context_len=None,
                 rollout_interaction_env_path="flaky_env", env_step_timeout=None, use_tcod=False,
                 partial_rollout=False, use_opd=False, opd_type=None, apply_chat_template_kwargs={})
sample = Sample(index=0, metadata={"env": "gridnav", "seed": 0, "hang_in": "reset"})
coro = rollout.generate(args, sample, {"max_new_tokens": 50})
run_async(coro) if sys.argv[1] == "run_async" else asyncio.run(coro)
"""


# The agent loop's env calls use asyncio.to_thread; this runtime's rollout loop (run_async) gives them daemon
# threads (slime/utils/daemon_executor.py), so a call that never returns cannot keep a stopped run alive.
@pytest.mark.parametrize("runner,sig", [("run_async", "SIGINT"), ("run_async", "SIGTERM")])
def test_a_stopped_run_exits_promptly_with_a_stuck_env_thread(runner, sig):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, runner, sig],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "HUNG", proc.stderr.read()
        time.sleep(0.3)
        proc.send_signal(getattr(signal, sig))
        # An env call that never returns must not keep a stopped run alive (threads joined at exit).
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
