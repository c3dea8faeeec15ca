"""A thread pool of daemon threads: the default executor of this runtime's rollout event loop.

The agent loop runs environment calls with ``asyncio.to_thread`` (the loop's default executor).
``ThreadPoolExecutor`` threads are joined when the interpreter exits, so one environment call that
never returns would keep a stopped run (Ctrl-C, SIGTERM) alive forever. These threads are daemons, so
the process exits; a call that hangs keeps only its own thread, and the pool grows by one to replace it.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor


class DaemonThreadPool(ThreadPoolExecutor):
    """``submit(fn, *args)`` runs on an idle daemon thread, or on a new one when every thread is busy.

    A ``ThreadPoolExecutor`` only by type (asyncio's ``set_default_executor`` asks for one): ``submit`` and
    ``shutdown`` are its own, so none of the base class's non-daemon threads is ever started.
    """

    def __init__(self, name: str = "rollout-worker"):
        super().__init__(max_workers=1, thread_name_prefix=name)
        self._name = name
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads = 0
        self._closed = False

    def submit(self, fn, /, *args, **kwargs) -> Future:
        if self._closed:
            raise RuntimeError("cannot submit to a shut-down DaemonThreadPool")
        future: Future = Future()
        with self._lock:
            start = self._idle == 0
            if start:
                self._threads += 1
            else:
                self._idle -= 1  # this item is taken by a waiting thread
        self._work.put((future, fn, args, kwargs))
        if start:
            threading.Thread(target=self._worker, name=f"{self._name}-{self._threads}", daemon=True).start()
        return future

    def _worker(self) -> None:
        while True:
            future, fn, args, kwargs = self._work.get()
            if future is None:
                return
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as err:  # noqa: B036 - delivered to the awaiting coroutine
                    future.set_exception(err)
            with self._lock:
                self._idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        # Idle threads are told to stop; busy ones (a hung call) are daemons and die with the process.
        self._closed = True
        with self._lock:
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._work.put((None, None, None, None))
