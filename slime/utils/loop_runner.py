"""Run a coroutine to completion on the rollout's persistent event loop, and leave no task pending behind it.

``loop.run_until_complete`` returns as soon as its coroutine raises, or as soon as Ctrl-C raises
``KeyboardInterrupt`` in the loop, while the other tasks of the loop (the episodes of an ``asyncio.gather``)
are still pending. Left so, they resume at the next call on the loop (the shutdown's ``close_session``) and
stop half-way again, or are finalized by the garbage collector after the loop has stopped, where the agent
loop's ``finally: await env.close()`` raises ``RuntimeError: no running event loop``: the environment is
never closed. So, as ``asyncio.run`` does, the loop's other tasks are cancelled and awaited before the error
goes on: every episode's ``finally`` (its ``env.close()``) runs while the loop still runs.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time

logger = logging.getLogger(__name__)

# How long the pending tasks get to finish their cleanup (an env.close() each, in threads) once cancelled.
CANCEL_GRACE_S = 30.0


def run_until_complete(loop: asyncio.AbstractEventLoop, coro):
    """``loop.run_until_complete(coro)``; when it raises (Ctrl-C included), the loop's tasks are cancelled first."""
    try:
        return loop.run_until_complete(coro)
    except BaseException:
        cancel_pending(loop)
        raise


def cancel_pending(loop: asyncio.AbstractEventLoop, grace: float = CANCEL_GRACE_S) -> int:
    """Cancel every unfinished task of ``loop`` (once each) and run the loop until they end, ``grace`` s at most.

    A task that awaited the one Ctrl-C interrupted raises the same ``KeyboardInterrupt`` when it wakes, out
    of this loop run too: the run is resumed until every task is done. A second Ctrl-C is held off meanwhile.
    Returns how many tasks were cancelled.
    """
    if loop.is_running() or loop.is_closed():
        return 0
    cancelled: set = set()
    deadline = time.monotonic() + grace
    with _sigint_ignored():
        while time.monotonic() < deadline:
            pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
            if not pending:
                break
            for task in pending:
                if task not in cancelled:
                    cancelled.add(task)
                    task.cancel()
            try:
                loop.run_until_complete(asyncio.wait(pending, timeout=deadline - time.monotonic()))
            except (KeyboardInterrupt, SystemExit):
                continue
    for task in cancelled:
        if task.done() and not task.cancelled() and task.exception() is not None:
            # Retrieved so that asyncio does not log it at exit; the error that stopped the call is raised instead.
            logger.debug("task ended with %r while the loop was cleaned up", task.exception())
    late = [task for task in asyncio.all_tasks(loop) if not task.done()]
    if late:
        logger.warning("%d rollout task(s) did not finish within %.0f s of being cancelled", len(late), grace)
    return len(cancelled)


class _sigint_ignored:
    """SIGINT ignored inside the block (main thread only): a second Ctrl-C must not cut the cleanup short."""

    def __enter__(self):
        self._old = None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, signal.SIG_IGN)

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
