"""The rollout loop's default executor: daemon threads, reused when idle, growing past a hung call."""

import asyncio
import threading

import pytest

from slime.rollout.sglang_rollout import run_async
from slime.utils.daemon_executor import DaemonThreadPool


def test_results_errors_and_daemon_threads():
    pool = DaemonThreadPool()
    assert pool.submit(lambda a, b: a + b, 2, b=3).result(5) == 5
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(5)
    assert pool.submit(lambda: threading.current_thread().daemon).result(5) is True
    pool.shutdown()


def test_idle_threads_are_reused_and_a_hung_call_does_not_block_others():
    pool = DaemonThreadPool()
    names = {pool.submit(lambda: threading.current_thread().name).result(5) for _ in range(20)}
    assert len(names) == 1  # sequential calls share one thread
    release = threading.Event()
    hung = pool.submit(release.wait)
    assert pool.submit(lambda: "still served").result(5) == "still served"
    release.set()
    assert hung.result(5) is True
    pool.shutdown()


def test_the_rollout_loop_runs_to_thread_on_daemon_threads():
    async def where():
        return await asyncio.to_thread(lambda: threading.current_thread().daemon)

    assert run_async(where()) is True
