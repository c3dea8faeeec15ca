"""Environments that set ``blocking = False`` run on the event loop; others in a worker thread (CPU).

The agent loop is the slime PR's (examples/multi_turn_tcod/rollout.py); this check stays in this repository's
suite to keep the PR's own tests within its size cap.
"""

import threading

from examples.multi_turn_tcod.envs import gridnav as gridnav_module
from examples.multi_turn_tcod.envs.gridnav import build_env
from test_tcod_rollout import make_args, play, tasks, tokenizer  # noqa: F401 - tasks, tokenizer: fixtures

from slime.utils.types import Sample


def test_environment_calls_leave_the_event_loop_unless_the_env_does_not_block(monkeypatch, tokenizer, tasks):
    threads = []

    class Blocking(build_env(Sample(metadata=dict(tasks[0]["metadata"])), None).__class__):
        blocking = True

        def step(self, response_text):
            threads.append(threading.current_thread() is threading.main_thread())
            return super().step(response_text)

    monkeypatch.setattr(gridnav_module, "build_env", lambda sample, args: Blocking(sample.metadata))
    play(monkeypatch, tokenizer, make_args(use_tcod=False, max_turns=1), tasks[0], step=0, policy=lambda i: "up")
    monkeypatch.setattr(Blocking, "blocking", False)
    play(monkeypatch, tokenizer, make_args(use_tcod=False, max_turns=1), tasks[0], step=0, policy=lambda i: "up")
    assert threads == [False, True]  # a worker thread, then the event loop's own
