"""--env-step-timeout: a hung environment call (build, reset, step, close) or a NaN reward ends only its
episode as FAILED with a message naming the env and the call, every other env is closed, and Ctrl-C ends
a run promptly even while an env call never returns."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import flaky_env
from aiohttp import web

from _engine_helpers import ThreadedApp
from examples.multi_turn_tcod.chat_layout import encode_action
from slime.rollout.sglang_rollout import run_async
from slime.utils.http_utils import close_session
from slime.utils.multi_turn_arguments import add_multi_turn_arguments, validate_multi_turn_args
from slime.utils.tiny_models import build_tokenizer
from slime.utils.types import Status
from test_multi_turn import make_args, play, task

ROOT = Path(__file__).resolve().parents[1]
ENV = "environment flaky_env.FlakyEnv"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """A stub policy engine: every turn is "north" + <|im_end|> (no model to load, so the file stays fast)."""
    tok = build_tokenizer()
    path = tmp_path_factory.mktemp("policy")
    tok.save_pretrained(path)
    ids = encode_action(tok, "north")

    async def generate(request):
        return web.json_response({"text": "", "output_ids": ids, "meta_info": {
            "output_token_logprobs": [[-0.5, i, None] for i in ids], "finish_reason": {"type": "stop"}}})

    app = web.Application()
    app.router.add_post("/generate", generate)
    server = ThreadedApp(app)
    yield server, None, str(path)
    flaky_env.RELEASE.set()  # let the abandoned calls finish
    run_async(close_session())
    server.stop()


def _args(engine, seconds="0.5"):
    return make_args(engine, "--rollout-interaction-env-path", "flaky_env.make_env", "--env-step-timeout", seconds)


def test_a_hung_step_fails_only_its_episode_and_every_env_is_closed(engine):
    flaky_env.CLOSED.clear()
    start = time.monotonic()
    samples = play(_args(engine), [task(0, hang_in="step"), task(1), task(2)])
    assert time.monotonic() - start < 30
    assert [s.status == Status.FAILED for s in samples] == [True, False, False]
    assert f"{ENV}: step() did not return within 0.5 s (env_step_timeout)" in samples[0].metadata["error"]
    assert samples[0].metadata["outcome"] == "env_error" and samples[0].remove_sample
    assert {1, 2} <= set(flaky_env.CLOSED)  # the others were closed; the hung one was asked to close too
    assert 0 in flaky_env.CLOSED


@pytest.mark.parametrize("call,label", [("build", "environment flaky_env.make_env: build"),
                                        ("reset", f"{ENV}: reset()"), ("close", f"{ENV}: close()")])
def test_hung_build_reset_or_close_fail_their_episode(engine, call, label):
    flaky_env.CLOSED.clear()
    samples = play(_args(engine), [task(0, hang_in=call), task(1)])
    assert samples[0].status == Status.FAILED and samples[1].status != Status.FAILED
    assert f"{label} did not return within 0.5 s" in samples[0].metadata["error"]
    assert 1 in flaky_env.CLOSED


def test_a_nan_reward_fails_its_episode(engine):
    samples = play(_args(engine, "30"), [task(0, nan_at=1), task(1)])
    assert samples[0].status == Status.FAILED and samples[1].status != Status.FAILED
    assert f"{ENV}: step(): environment contract: step() returned a non-finite reward (nan)" \
        in samples[0].metadata["error"]
    assert samples[0].metadata["task_reward"] == 0.0  # the NaN never reached the bookkeeping


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_the_flag_must_be_positive_and_finite(value):
    import argparse

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
from examples.multi_turn_tcod import rollout as multi_turn
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
multi_turn._TOKENIZERS["tiny"] = Tokenizer()
args = Namespace(hf_checkpoint="tiny", max_turns=2, max_turn_response_len=4, rollout_max_response_len=50,
                 rollout_max_context_len=None, rollout_interaction_env_path="flaky_env.make_env",
                 custom_rm_path=None, use_tcod=False, partial_rollout=False)
sample = Sample(index=0, metadata={"env": "gridnav", "seed": 0, "hang_in": "reset"})
coro = multi_turn.generate(args, sample, {})
run_async(coro) if sys.argv[1] == "run_async" else asyncio.run(coro)
"""


@pytest.mark.parametrize("runner,sig", [("run_async", "SIGINT"), ("asyncio.run", "SIGINT"),
                                        ("run_async", "SIGTERM")])
def test_a_stopped_run_exits_promptly_with_a_stuck_env_thread(runner, sig):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, runner, sig], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "HUNG", proc.stderr.read()
        time.sleep(0.3)
        proc.send_signal(getattr(signal, sig))
        # Before the fix the interpreter waited at exit on the env's executor thread, i.e. forever.
        proc.wait(15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
